"""fleet_follower on a real systemd host: the timer runs playbooks/follow_pr.yml through ansible-runner.

STAND-IN: GitHub's REST API (tests/harness/github_standin.py, inside the host; PR 22673 open, one valid token).
"""

import json
import time

DATA = "/var/lib/llamafleet-follow/runner"
TOKEN = "molecule-github-token-5d0c2e"


def requests(host):
    out = host.check_output("cat /srv/github/requests.jsonl 2>/dev/null || true")
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def wait_for_runs(host, n, timeout=600):
    """Until the stand-in saw N polls and the last run ended (the timer fires 5 s after each run; a run takes 10-40 s
    on a loaded 2-core machine: the bound is generous, the wait ends as soon as the state is there)."""
    t_end = time.time() + timeout
    while time.time() < t_end:
        if len(requests(host)) >= n and host.run("systemctl is-active llamafleet-follow.service").stdout.strip() in (
            "inactive",
            "failed",
        ):
            return requests(host)
        time.sleep(2)
    raise AssertionError(f"fewer than {n} follower runs in {timeout} s: {requests(host)}")


def test_venv_runs_a_supported_ansible_core_on_the_hosts_python_3_13(host):
    """Debian 13's python3 (3.13) was found; the venv runs the role's pinned ansible-core (2.21, not 2.19)."""
    venv = "/var/lib/llamafleet-follow/venv"
    assert host.check_output(f"{venv}/bin/python -c 'import sys; print(sys.version_info[:2] >= (3, 12))'") == "True"
    version = host.check_output(f"{venv}/bin/python -c 'import ansible.release as r; print(r.__version__)'")
    assert version.startswith("2.21."), version
    assert host.file(f"{venv}/bin/python").user == "root"


def test_timer_and_service(host):
    timer = host.service("llamafleet-follow.timer")
    assert timer.is_enabled and timer.is_running
    unit = host.file("/etc/systemd/system/llamafleet-follow.service").content_string
    assert "Type=oneshot" in unit and "User=llamafleet-follow" in unit
    assert f"run {DATA} -p playbooks/follow_pr.yml --rotate-artifacts 2" in unit
    assert TOKEN not in unit


def test_private_data_dir_layout_and_token(host):
    assert host.file(f"{DATA}/project").linked_to == "/srv/llamafleet"
    assert host.file(f"{DATA}/inventory").linked_to == "/srv/fleet/inventory"
    env = host.file(f"{DATA}/env")
    assert env.user == "llamafleet-follow" and env.mode == 0o700
    extravars = host.file(f"{DATA}/env/extravars")
    assert extravars.user == "llamafleet-follow" and extravars.mode == 0o600
    assert TOKEN in extravars.content_string


def test_runs_poll_once_each_and_change_nothing(host):
    reqs = wait_for_runs(host, 3)
    polls = [r for r in reqs if r["path"] == "/repos/ggml-org/llama.cpp/pulls/22673"]
    assert polls == reqs and all(r["auth"] for r in reqs)  # only the PR, always with the token
    assert polls[0]["status"] == 200 and all(r["status"] == 304 and r["if_none_match"] for r in polls[1:])
    pin = host.file("/srv/fleet/inventory/group_vars/all/llamafleet_release.yml").content_string
    assert "llamacpp_mtp_build_ref: pull/22673" in pin
    # the token is in no artifact (ansible-runner's command file records the environment, not extravars)
    assert host.run(f"grep -rl {TOKEN} {DATA}/artifacts").rc == 1


def test_artifacts_rotated_and_status_command(host):
    wait_for_runs(host, 3)
    # The timer fires 5 s after each run: stop it and let a run it already started end, so that the
    # listing and the three status calls below all read the same last run.
    host.run("systemctl stop llamafleet-follow.timer")
    wait_for_runs(host, 3)
    kept = host.check_output(f"ls -1 {DATA}/artifacts").split()
    assert len(kept) == 2, kept  # --rotate-artifacts 2
    out = host.check_output("llamafleet-follow-status")
    assert "result:    successful, rc 0" in out
    assert "ggml-org/llama.cpp#22673 is open" in out and "github:    1 request(s)" in out
    assert "changed:   nothing" in out and "2 run(s) kept" in out
    last = json.loads(host.check_output("llamafleet-follow-status --json"))
    assert last["decision"] == "none" and last["status"] == "successful" and last["changed"] == {}
    assert len(host.check_output("llamafleet-follow-status --all").splitlines()) == 2
