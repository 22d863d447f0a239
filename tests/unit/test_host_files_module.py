"""host_files runs for real (``ansible localhost -m llamafleet.mtp.host_files``) on a scratch directory."""

from __future__ import annotations

import os
import stat

from ansible_run import needs_ansible, run_adhoc, run_module

pytestmark = needs_ansible

SECRET = "sk-host-files-secret-0042"


def args(tmp, env="A=1\n", key=SECRET):
    d = str(tmp / "etc" / "unit.d")
    return {
        "directories": [{"path": d, "mode": "0750"}],
        "files": [{"path": f"{d}/10.conf", "content": "[Service]\n"}, {"path": f"{d}/main.env", "content": env}],
        "private_files": [{"path": f"{d}/main.key", "content": key + "\n"}],
    }


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_writes_then_changes_nothing_then_repairs(tmp_path):
    d = tmp_path / "etc" / "unit.d"
    r = run_module("host_files", args(tmp_path))
    assert r["changed"] and len(r["changed_paths"]) == 4 and not r["reloaded"], r
    assert (d / "main.env").read_text() == "A=1\n" and (d / "main.key").read_text() == SECRET + "\n"
    assert mode(d) == 0o750 and mode(d / "main.env") == 0o644 and mode(d / "main.key") == 0o600
    assert not [p for p in os.listdir(d) if p.startswith(".")]  # no temporary files left

    r = run_module("host_files", args(tmp_path))
    assert not r["changed"] and r["changed_paths"] == [], r

    # drift: a hand-edited file and a loosened mode are put back; only those paths change
    (d / "main.env").write_text("A=2\n")
    os.chmod(d / "main.key", 0o644)
    r = run_module("host_files", args(tmp_path))
    assert sorted(r["changed_paths"]) == sorted([str(d / "main.env"), str(d / "main.key")]), r
    assert (d / "main.env").read_text() == "A=1\n" and mode(d / "main.key") == 0o600


def test_check_mode_and_diff_never_show_the_secret(tmp_path):
    run_module("host_files", args(tmp_path))
    r, output = run_adhoc(
        "host_files", args(tmp_path, env="A=3\n", key="sk-other-secret"), check_mode=True, extra_args=["--diff", "-vvv"]
    )
    d = tmp_path / "etc" / "unit.d"
    assert r["changed"] and sorted(r["changed_paths"]) == sorted([str(d / "main.env"), str(d / "main.key")]), r
    assert [x["after"] for x in r["diff"]] == ["A=3\n"]  # the env file's diff; the key has none
    assert (d / "main.env").read_text() == "A=1\n"  # check mode wrote nothing
    assert "sk-other-secret" not in output and SECRET not in output


def test_bad_input_fails_before_writing(tmp_path):
    r = run_module("host_files", {"files": [{"path": "relative/x", "content": "x"}]}, check_rc=False)
    assert r["failed"] and "is not absolute" in r["msg"], r
    bad = args(tmp_path)
    bad["files"][0]["mode"] = "rw-r--r--"
    r = run_module("host_files", bad, check_rc=False)
    assert r["failed"] and "not an octal mode" in r["msg"], r


def test_unknown_group_fails_except_in_check_mode(tmp_path):
    """Check mode cannot create the group an earlier task of the run would have created: it predicts a change."""
    entry = {"directories": [{"path": str(tmp_path / "models"), "group": "llamafleet-no-such-group", "mode": "0750"}]}
    r = run_module("host_files", entry, check_mode=True)
    assert r["changed"] and r["changed_paths"] == [str(tmp_path / "models")], r
    assert not (tmp_path / "models").exists()
    r = run_module("host_files", entry, check_rc=False)
    assert r["failed"] and "no such group 'llamafleet-no-such-group'" in r["msg"], r
    assert not (tmp_path / "models").exists()  # checked before anything is written
