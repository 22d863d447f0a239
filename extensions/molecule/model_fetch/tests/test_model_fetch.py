"""Final state of the model_fetch scenario (converge = 2-host fleet, side_effect = per-host cases on host a).

Real parts: systemd hosts in podman, the real huggingface_hub client, real GGUF files served by the Hub
stand-in (the one stand-in: Hugging Face itself is out of reach). Expected hashes come from
<ephemeral>/hub/hub.json, written by make_hub.py from the served files.
"""

import json
import os
import shlex
from pathlib import Path

import pytest

HUB = json.loads((Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "hub" / "hub.json").read_text())
ROOT = "/var/lib/llama-models"
GROUP = "llama-server"  # model_fetch_group in molecule.yml
FLEET_FILES = {
    "agree": HUB["files"]["agree"],
    "split": HUB["files"]["split"],
    "url": HUB["files"]["mtp"],
    "ctl": HUB["files"]["partial"],
}


def _name(host):
    return host.backend.get_hostname()


def test_group_and_directories(host):
    assert host.group(GROUP).exists
    for d in [ROOT, *(f"{ROOT}/{m}" for m in FLEET_FILES)]:
        f = host.file(d)
        assert f.is_directory and f.user == "root" and f.group == GROUP and f.mode == 0o750, d


@pytest.mark.parametrize("model", sorted(FLEET_FILES))
def test_fleet_models_are_in_place_verified_and_private(host, model):
    for name, want in FLEET_FILES[model].items():
        path = f"{ROOT}/{model}/{name}"
        f = host.file(path)
        assert f.is_file and f.user == "root" and f.group == GROUP and f.mode == 0o640, path
        assert f.size == want["size"]
        assert host.check_output(f"sha256sum {path}").split()[0] == want["sha256"]
        side = host.file(path + ".verified.json")
        assert side.mode == 0o640 and side.group == GROUP
        data = json.loads(side.content_string)
        mtime = host.check_output(f"stat -c %.9Y {path}").replace(".", "")
        assert data["sha256"] == want["sha256"] and data["size"] == want["size"]
        assert data["mtime_ns"] == int(mtime)


def test_split_set_is_complete(host):
    names = host.check_output(f"ls {ROOT}/split").split()
    assert [n for n in names if n.endswith(".gguf")] == [f"tiny-agree-split-0000{i}-of-00003.gguf" for i in (1, 2, 3)]


def test_no_temp_files_left(host):
    out = host.check_output(f"find {ROOT} -name '.*.partial*' -o -name '.*.incoming' -o -name '*.tmp'")
    assert out == ""


def test_token_is_nowhere_on_disk(host):
    for token in (HUB["good_token"], HUB["other_token"]):
        r = host.run(f"grep -rlF {token} {ROOT} /opt /root /tmp /etc /var/log 2>/dev/null")
        assert r.stdout == "", r.stdout


def test_only_host_a_talked_to_the_hub(host):
    """In fleet mode the hosts get copies from the controller: host b never needed huggingface_hub."""
    venv = host.file("/opt/llamafleet/hf-venv/bin/python")
    if _name(host) == "mf-deb12-a":
        assert venv.exists  # side_effect ran per-host mode here
        big = host.file(f"{ROOT}/big/big-agree.gguf")
        assert big.size == HUB["files"]["big"]["big-agree.gguf"]["size"]
        assert host.check_output(f"sha256sum {big.path}").split()[0] == HUB["files"]["big"]["big-agree.gguf"]["sha256"]
    else:
        assert not venv.exists
        assert not host.file(f"{ROOT}/big").exists


def test_no_hf_token_in_the_journal(host):
    """AnsibleModule logs every module call to the journal ("Invoked with ..."):
    the HF tokens must never be there."""
    # every field of every entry (export format: the module's options are fields too), searched on the host
    invoked = host.run("journalctl --no-pager -o export | grep -ac 'Invoked with'")
    assert int(invoked.stdout.strip() or 0) > 0  # the modules' calls are there to search
    for secret in (HUB["good_token"], HUB["other_token"]):
        found = host.run(f"journalctl --no-pager -o export | grep -acF -- {shlex.quote(secret)}")
        assert found.stdout.strip() == "0", f"{secret[:6]}... is in the journal {found.stdout.strip()} times"
