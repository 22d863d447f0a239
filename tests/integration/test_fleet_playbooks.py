"""The fleet playbooks on the sandbox fleet, driven through ansible-runner's Python API.

Real parts: podman systemd hosts, llama.cpp builds from the local mirror, generated GGUF models,
real llama-server units; assertions are on ansible-runner's per-host stats and job events and on the
hosts themselves, never on printed text. Stand-in: the mirror's refs/pull/22673/head stands in for the
pre-merge PR #22673 branch (GitHub is unreachable here).

Runs in the full lane after scripts/run-sandbox.sh converged the 2-host fleet (FLEET_SANDBOX=1), in
order, on a copy of inventories/sandbox (the upgrade writes its release file there):
 1. no-op re-run: changed=0 and at most 20 tasks per host (converged hosts skip the converge), and --check
    says so;
 2. the PR follower (follow_pr.yml, GitHub stand-in): PR open, rate limited, closed unmerged change
    nothing; merged with release b9180 upgrades PR stand-in -> b9180 (mainline) with a request loop on
    every host (at every moment one host answers; failed requests per host printed) and the openai client
    through the gateway (0 failed), a second run is a no-op; then, with a third (fresh) host added, --check
    completes and predicts its install, site.yml is changed=0 on the two and the third gets the release;
 2b. six kinds of hand-made drift (env file, unit, drop-in, deleted model, stopped instance, switched
    `current`) are found and repaired by the next site.yml, and the run after is on the no-op path;
 3. a models-only upgrade; 4. --check --diff predicts the real run host by host;
 5. an impossible context on a serving host is refused and the old instance still answers;
 5b. a bad value for every field of the instance table is refused in the facts stage (changed=0, one message
    naming host, instance and field for each);
 6. a failing upgrade is rolled back on the canary and the rollout stops;
 6b. a model upgrade to a worse-agreeing MTP head is stopped by the speed gate on the canary (rolled back, no
    release), and goes through with llamafleet_accept_slower=true;
 7. deliberate restarts never trip systemd's start limit (8 restarts through the role within a minute);
 8. bench --tags autotune on an instance without a pinned draft_n_max, then site.yml passes with the
    tuned value in the env file;
 9. over ssh (a host with OpenSSH, an unprivileged user with sudo): site.yml converges it, the no-op is timed
    against the podman harness's, the upgrade moves it, and a host whose sshd is down is UNREACHABLE, named,
    and holds no one hostage;
10. the gateway (role llama_gateway on <prefix>-gateway): a killed instance leaves the pool within the
    health-check interval and only requests in flight on it fail; a bad API key gets 401; the file_sd
    targets and both /metrics answer. Test 2 also runs openai clients through the gateway (0 failures);
2c. a process that runs other arguments than its (recorded) environment file is restarted by the next run;
2d. a run interrupted (SIGINT) at the canary's drain, restart or ready step is repaired by the next one
    (gateway UP on every instance, each process running its file);
11. after all of the above (converges, upgrades, a rollback, the benchmark), the instances' API key is in
    no journal of any host or the gateway, not in the controller's ansible log, the ansible-runner artifacts
    (job events, stdout) of every run, or any host's applied-state record;
12. a stopped host is UNREACHABLE and holds no one hostage (the other converges, no release, non-zero exit);
    back with a new address, it converges and is UP in the gateway again (after 11: a restart empties the
    container's volatile journal).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from gateway_clients import GatewayLoops, api_key, base_url, client, container_ip, failures, gateway_stat

from tests.integration import github_follow

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("LLAMA_MTP_CACHE", "/var/cache/llama-mtp-fleet"))
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("FLEET_SANDBOX") != "1", reason="needs the sandbox fleet (FLEET_SANDBOX=1)"),
]
# SANDBOX_PREFIX (as in scripts/sandbox.sh) runs the sequence on another fleet: the inventory copy is renamed.
PREFIX = os.environ.get("SANDBOX_PREFIX", "llama-sandbox")
HOSTS = (f"{PREFIX}-1", f"{PREFIX}-2")
H1, H2, H3 = HOSTS[0], HOSTS[1], f"{PREFIX}-3"
GATEWAY = f"{PREFIX}-gateway"
MAINLINE = "mainline-0c1e570"
RELEASE = github_follow.RELEASE  # the first release with the PR's merge (the mirror's tag on the mainline commit)
TIMES: dict[str, float] = {}


# ------------------------------------------------------------------------------------------
# helpers


class Run:
    """One ansible-runner run: its status, per-host stats and the changed tasks per host."""

    def __init__(self, runner, seconds):
        self.runner = runner
        self.status = runner.status
        self.rc = runner.rc
        self.stats = runner.stats or {}
        self.seconds = seconds
        self.events = list(runner.events)

    def count(self, key, host):
        return int((self.stats.get(key) or {}).get(host, 0))

    def changed(self, host):
        return self.count("changed", host)

    def changed_tasks(self, host):
        return sorted(
            e["event_data"]["task"]
            for e in self.events
            if e.get("event") == "runner_on_ok"
            and e["event_data"].get("host") == host
            and (e["event_data"].get("res") or {}).get("changed")
        )

    def tasks(self, host):
        """Tasks that ran or were skipped on the host (ok includes changed in Ansible's stats)."""
        return sum(self.count(k, host) for k in ("ok", "skipped", "failures", "rescued"))

    def failures(self):
        return [
            (e["event_data"].get("host"), e["event_data"].get("task"), (e["event_data"].get("res") or {}).get("msg"))
            for e in self.events
            if e.get("event") == "runner_on_failed" and not e["event_data"].get("ignore_errors")
        ]

    def hosts_in(self, task_prefix):
        """Hosts that ran a task whose name starts with task_prefix. The prefix must name a task of the collection
        (playbooks/, roles/): a renamed task fails here instead of making "no host ran it" true forever."""
        assert task_named(task_prefix), f"no task of the collection is named {task_prefix!r}..."
        return {
            e["event_data"].get("host")
            for e in self.events
            if e.get("event", "").startswith("runner_on_")
            and (e["event_data"].get("task") or "").startswith(task_prefix)
        }

    def hosts_in_role(self, role):
        """Hosts that ran any task of the role (job events carry the role's name, not the play's task names)."""
        assert (REPO / "roles" / role / "tasks").is_dir(), f"no role {role!r}"
        return {
            e["event_data"].get("host")
            for e in self.events
            if e.get("event", "").startswith("runner_on_")
            and (e["event_data"].get("role") or "").rsplit(".", 1)[-1] == role
        }


@functools.cache
def _task_names() -> tuple[str, ...]:
    files = [REPO / "site.yml", *REPO.glob("playbooks/**/*.yml"), *REPO.glob("roles/*/tasks/**/*.yml")]
    names = []
    for f in files:
        names += re.findall(r"^\s*-?\s*name:\s*[\"']?(.+?)[\"']?\s*$", f.read_text(), re.M)
    return tuple(names)


def task_named(prefix: str) -> bool:
    """Some task's name starts with prefix, or a templated name's fixed part ("Restart llama-server@{{ ... }}")
    starts the prefix."""
    for name in _task_names():
        fixed = name.split("{{")[0]
        if name.startswith(prefix) or ("{{" in name and fixed and prefix.startswith(fixed)):
            return True
    return False


def play(
    playbook, inventory, tmp_path_factory, *, check=False, extravars=None, limit=None, tags=None, gateway=False,
    interrupt_at=None, on_event=None,
):  # fmt: skip
    """gateway=False skips the gateway's and the monitor's own plays (tags gateway, monitoring): their configuration
    is the same throughout the sequence (same hosts, same ports), scripts/run-sandbox.sh set them up, test 1 and
    the runs with gateway=True run them as users do and tests 10 and 10b check them; the drain around each restart
    and a failed converge's word to the monitor run in every run (they belong to the converge). on_event(event) is
    called with each job event as it comes (to act on the hosts while the run goes on)."""
    import ansible_runner

    data = tmp_path_factory.mktemp("runner")
    cmdline = " ".join(
        x
        for x in (
            "--check --diff" if check else "",
            f"--tags {tags}" if tags else "",
            "" if gateway or tags else "--skip-tags gateway,monitoring",
        )
        if x
    )
    t0 = time.monotonic()
    interrupted = []

    def handler(event):
        task = (event.get("event_data") or {}).get("task") or ""
        if interrupt_at and event.get("event") == "runner_on_start" and task.startswith(interrupt_at):
            interrupted.append(task)
        if on_event:
            on_event(event)
        return True

    runner = ansible_runner.run(
        event_handler=handler if interrupt_at or on_event else None,
        cancel_callback=(lambda: bool(interrupted)) if interrupt_at else None,
        private_data_dir=str(data),
        project_dir=str(REPO),
        playbook=str(REPO / playbook),
        inventory=str(inventory),
        extravars=extravars or {},
        cmdline=cmdline or None,
        limit=limit,
        envvars={
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            # the controller's log of every run of the sequence (test 11 searches it for secrets)
            "ANSIBLE_LOG_PATH": str(tmp_path_factory.getbasetemp() / "ansible.log"),
            "LLAMA_MTP_CACHE": str(CACHE),
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        },
        quiet=True,
        rotate_artifacts=1,
    )
    return Run(runner, time.monotonic() - t0)


def ok(run, what):
    assert run.status == "successful", f"{what}: {run.status} rc={run.rc} failures={run.failures()}"
    return run


def on_host(host, *cmd, check=True):
    return subprocess.run(["podman", "exec", host, *cmd], capture_output=True, text=True, check=check).stdout


def build_info(host):
    return json.loads(on_host(host, "cat", "/opt/llama.cpp/current/build-info.json"))


def env_file(host, name="main"):
    return on_host(host, "cat", f"/etc/llama-server/{name}.env")


def aliases(env):
    """The names an instance answers to (its --alias: the declared model's name, then the alias field's)."""
    m = re.search(r"--alias (\S+)", env)
    return m.group(1).split(",") if m else []


def main_pid(host, name="main"):
    return int(on_host(host, "systemctl", "show", f"llama-server@{name}.service", "-p", "MainPID", "--value").strip())


def health(host, port=8080):
    code = (
        "import urllib.request,sys\n"
        f"try:\n print(urllib.request.urlopen('http://127.0.0.1:{port}/health', timeout=5).status)\n"
        "except Exception as e:\n print(getattr(e, 'code', 0))\n"
    )
    return int(on_host(host, "python3", "-c", code).strip() or 0)


LOOP = r"""
import json, os, time, urllib.request
out, stop, t_end = [], '/run/llamafleet-loop.stop', time.time() + 900
while time.time() < t_end and not os.path.exists(stop):
    t = time.time()
    try:
        key = open('/etc/llama-server/main.key').read().strip() if os.path.exists('/etc/llama-server/main.key') else ''
        req = urllib.request.Request('http://127.0.0.1:8080/completion', method='POST',
            data=json.dumps({'prompt': 'Hi', 'n_predict': 4}).encode(), headers={'Content-Type': 'application/json',
            **({'Authorization': 'Bearer ' + key} if key else {})})
        ok = urllib.request.urlopen(req, timeout=10).status == 200
    except Exception:
        ok = False
    out.append([t, time.time(), ok])
    time.sleep(0.2)
print(json.dumps(out))
"""


class RequestLoops:
    """A bounded request loop inside every host (the instances bind 127.0.0.1), results per host."""

    def __init__(self, hosts):
        self.hosts = hosts
        for h in hosts:
            on_host(h, "rm", "-f", "/run/llamafleet-loop.stop")
        self.procs = {
            h: subprocess.Popen(["podman", "exec", h, "python3", "-c", LOOP], stdout=subprocess.PIPE, text=True)
            for h in hosts
        }

    def stop(self):
        for h in self.hosts:
            on_host(h, "touch", "/run/llamafleet-loop.stop")
        return {h: json.loads(p.communicate(timeout=60)[0] or "[]") for h, p in self.procs.items()}


def no_moment_without_an_answer(results, slack=1.0):
    """Every failed request on one host overlaps in time with a successful one on another host."""
    bad = []
    for h, rows in results.items():
        for t0, t1, good in rows:
            if good:
                continue
            others = [r for o, rs in results.items() if o != h for r in rs if r[2]]
            if not any(s0 <= t1 + slack and s1 >= t0 - slack for s0, s1, _ in others):
                bad.append((h, t0))
    return bad


# ------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def inv(tmp_path_factory):
    """A copy of the sandbox inventory that the tests declare changes in."""
    path = tmp_path_factory.mktemp("inventory") / "sandbox"
    shutil.copytree(REPO / "inventories" / "sandbox", path)
    if PREFIX != "llama-sandbox":
        hosts = path / "hosts.yml"
        hosts.write_text(hosts.read_text().replace("llama-sandbox-", f"{PREFIX}-"))
    return path


def _not_serving():
    """What keeps the fleet from serving as declared: an instance whose /health is not 200, or whose gateway server
    is not UP (DOWN, DRAIN or MAINT left by an interrupted run). Empty when all serve."""
    problems = []
    for h in HOSTS:
        try:
            code = health(h)
        except subprocess.CalledProcessError as e:
            code = f"not reachable (podman exec rc {e.returncode})"
        if code != 200:
            problems.append(f"{h} main: /health {code}")
    status = {r.get("svname"): r.get("status") for r in gateway_stat(GATEWAY)}
    problems += [
        f"{h}_main on the gateway: {status.get(f'{h}_main')}" for h in HOSTS if status.get(f"{h}_main") != "UP"
    ]
    return problems


@pytest.fixture(autouse=True)
def fleet_serving(request, inv, tmp_path_factory):
    """Each test starts from a fleet that serves as declared, whatever the test before it left: a failed test names
    itself and the ones after it still run. If the fleet does not serve (after 30 s for health checks and restarts
    to settle), site.yml converges the declared state again (the speed gate's verdict accepted: this is a repair,
    not a change under test) and the test waits for it to serve; a fleet that still does not serve is an error of
    this test's set-up, with what is wrong."""
    if request.node.name.startswith("test_zz"):
        yield
        return
    try:
        _until("the fleet serving as declared", lambda: not _not_serving(), timeout=30)
    except AssertionError:
        problems = _not_serving()
        print(f"\n{request.node.name}: the fleet does not serve as declared ({problems}); site.yml repairs it first")
        run = play("site.yml", inv, tmp_path_factory, gateway=True, extravars={"llamafleet_accept_slower": True})
        print(f"  repair: {run.status}, failures {run.failures()}")
        _until(f"the fleet serving after the repair (was: {problems})", lambda: not _not_serving(), timeout=120)
    yield


def group_vars(inv):
    return yaml.safe_load((inv / "group_vars" / "llama_hosts.yml").read_text())


def write_group_vars(inv, data):
    (inv / "group_vars" / "llama_hosts.yml").write_text("---\n" + yaml.safe_dump(data, sort_keys=False))


def release(inv):
    return yaml.safe_load((inv / "group_vars" / "all" / "llamafleet_release.yml").read_text())


# ------------------------------------------------------------------------------------------
# the sequence


# The no-op path: a converged host (applied digest matches, nothing drifted) skips the converge.
NOOP_TASKS_MAX = 20


def test_1_noop_rerun_and_check(inv, tmp_path_factory):
    run = ok(play("site.yml", inv, tmp_path_factory, gateway=True), "no-op site.yml")
    TIMES["no-op re-run"] = run.seconds
    for h in HOSTS:
        assert run.changed(h) == 0, (h, run.changed_tasks(h))
        assert run.tasks(h) <= NOOP_TASKS_MAX, (h, run.tasks(h))
        assert "--spec-type mtp " in env_file(h)  # day one: the PR branch's spelling
    assert run.hosts_in("Restart llama-server@") == set()
    check = ok(play("site.yml", inv, tmp_path_factory, check=True, gateway=True), "--check")
    TIMES["no-op --check"] = check.seconds
    for h in HOSTS:
        assert check.changed(h) == 0, (h, check.changed_tasks(h))
        assert check.tasks(h) <= NOOP_TASKS_MAX, (h, check.tasks(h))
    tasks = {"site.yml": [run.tasks(h) for h in HOSTS], "--check": [check.tasks(h) for h in HOSTS]}
    print(f"\ntasks per host on the no-op path: {tasks}")


def _add_host(inv, name):
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    hosts["all"]["children"]["llama_hosts"]["hosts"][name] = None
    (inv / "hosts.yml").write_text("---\n" + yaml.safe_dump(hosts, sort_keys=False))


def _remove_host(inv, name):
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    hosts["all"]["children"]["llama_hosts"]["hosts"].pop(name, None)
    (inv / "hosts.yml").write_text("---\n" + yaml.safe_dump(hosts, sort_keys=False))
    subprocess.run(["podman", "rm", "-f", "-t", "5", name], capture_output=True)


def test_2_upgrade_persists_serves_throughout_and_new_hosts_follow(inv, tmp_path_factory):
    gh = github_follow.GitHub(tmp_path_factory.mktemp("github"), CACHE / "git" / "llama.cpp.git")
    try:
        # open (twice: the second is an idle poll), rate limited, closed unmerged: nothing changes, no host contacted
        for i, state in enumerate(("open", "open", "rate_limited", "closed")):
            gh.set(state)
            n = len(gh.server.requests)
            run = play("playbooks/follow_pr.yml", inv, tmp_path_factory, extravars=gh.extravars)
            github_follow.assert_nothing_changed(run, HOSTS, lambda: release(inv)["llamacpp_mtp_build_ref"])
            res, reqs = github_follow.module_result(run), gh.requests_since(n)
            warnings = github_follow.warnings(run)
            print(f"\nfollow-pr, PR {state}: {res['msg']!r}; GitHub requests {reqs}; warnings {warnings}")
            if state == "rate_limited":
                assert res["rate_limited"] and warnings == [res["msg"]] and "resets at" in res["msg"]
            elif state == "closed":
                assert warnings == [res["msg"]] and "closed without merging" in res["msg"]
            else:
                assert warnings == [] and res["follow"]["action"] == "none" and res["state"] == "open"
            if i == 1:
                assert [status for _, status in reqs] == [304], reqs  # an idle poll: one conditional request
        # merged, release b9180 on the mirror: the follower upgrades the fleet, serving throughout
        pids = {h: main_pid(h) for h in HOSTS}
        loops = RequestLoops(HOSTS)
        via_gateway = GatewayLoops(base_url(GATEWAY))  # the real openai client, plain and streaming
        try:
            gh.set("merged")
            # The sandbox's two builds differ in speed on the tiny model (the gate measured mainline up to 30 % below
            # the PR stand-in, p < 0.01, at 32-token requests): this test is about serving throughout, so the
            # upgrade is accepted whatever the gate measures (it is still measured; test 6b tests the gate).
            extra = {**gh.extravars, "llamafleet_accept_slower": True}
            run = play("playbooks/follow_pr.yml", inv, tmp_path_factory, extravars=extra, gateway=True)
        finally:
            results, gw = loops.stop(), via_gateway.stop()
        print(f"\nfailed through the gateway during the upgrade: {failures(gw)} (of {[len(r) for r in gw.values()]})")
        assert failures(gw) == {"plain": 0, "stream": 0}, [r for rows in gw.values() for r in rows if not r[2]][:5]
        ok(run, "follow-pr (merged: the upgrade)")
        TIMES["upgrade (follow_pr.yml)"] = run.seconds
        for h in HOSTS:
            m = (_speed(run, h) or {}).get("instances", {}).get("main", {})
            print(f"\nspeed gate, {h}: {m.get('tok_s_before')} -> {m.get('tok_s')} tokens/s ({m.get('change')}, "
                  f"p={m.get('p_value')}, noise {m.get('noise_before')} / {m.get('noise')})")  # fmt: skip
        served = github_follow.last_host_served(run, HOSTS)
        TIMES["merge visible -> last host serving the release"] = served - gh.flipped_at
        print(f"\nmerge visible -> last host serving {RELEASE}: {served - gh.flipped_at:.0f} s")
        again = ok(play("playbooks/follow_pr.yml", inv, tmp_path_factory, extravars=gh.extravars), "follow-pr again")
        assert all(again.changed(h) == 0 for h in HOSTS) and github_follow.module_result(again)["requests"] == 0
    finally:
        gh.stop()
    failed = {h: sum(1 for r in rows if not r[2]) for h, rows in results.items()}
    print(f"\nfailed requests per host during the upgrade: {failed} (of {[len(r) for r in results.values()]})")
    assert no_moment_without_an_answer(results) == []
    for h in HOSTS:
        assert build_info(h)["capabilities"]["mtp_spec_type"] == "draft-mtp"
        assert "--spec-type draft-mtp" in env_file(h) and main_pid(h) != pids[h]
        assert health(h) == 200
    assert run.hosts_in("Restart llama-server@main.service") == set(HOSTS)
    rel = release(inv)
    assert rel["llamacpp_mtp_build_ref"] == RELEASE
    header = (inv / "group_vars" / "all" / "llamafleet_release.yml").read_text()
    assert "Written by playbooks/upgrade.yml" in header and "pull/22673" in header  # the previous value
    assert "Followed ggml-org/llama.cpp#22673" in header

    # The upgrade persisted: the everyday command changes nothing on the fleet, its --check says so,
    # and a host that joins now gets the upgraded build. The joining host is fresh (no python3-apt, no
    # build, no unit): --check completes on it and predicts the install.
    new = H3
    subprocess.run(["bash", str(REPO / "scripts/sandbox.sh"), "up", "3", "12"], check=True, capture_output=True)
    _add_host(inv, new)
    try:
        check = ok(play("site.yml", inv, tmp_path_factory, check=True), "--check after the upgrade, with a new host")
        assert on_host(new, "ls", "/opt", check=False).strip() == ""  # --check touched nothing
        predicted = check.changed_tasks(new)
        assert "Would install the build and switch current (check mode)" in predicted, predicted
        assert "Would install the service and start the instances" in predicted, predicted
        again = ok(play("site.yml", inv, tmp_path_factory), "site.yml after the upgrade, with a new host")
        TIMES["site.yml after the upgrade (2 no-op hosts + 1 joining)"] = again.seconds
        for h in HOSTS:
            assert check.changed(h) == 0, (h, check.changed_tasks(h))
            assert again.changed(h) == 0, (h, again.changed_tasks(h))
            assert "--spec-type draft-mtp" in env_file(h)
        assert build_info(new)["commit"] == build_info(H1)["commit"] and "--spec-type draft-mtp" in env_file(new)
        assert health(new) == 200
        # three hosts: fan-out delivery by default; the joining host's model comes from a converged host
        origins = [o["from"] for o in _facts(again, new, "model_fetch_origins") or []]
        assert origins and all(o in (f"peer {H1}", f"peer {H2}") for o in origins), origins
    finally:
        _remove_host(inv, new)


MODEL = "/var/lib/llama-models/sandbox-mtp/sandbox-mtp.gguf"


def test_2b_drift_is_found_and_repaired(inv, tmp_path_factory):
    """What an admin (or an accident) changes by hand on a converged host is found by the next run and put back,
    and the run after that is on the no-op path again. Six kinds of drift, three on each host, one run."""
    drifts = {
        H1: [
            ["sh", "-c", "echo 'LLAMA_ARG_CTX_SIZE=64' >> /etc/llama-server/main.env"],  # hand-edited env file
            ["sh", "-c", "sed -i 's/^Restart=.*/Restart=no/' /etc/systemd/system/llama-server@.service"],  # unit
            ["sh", "-c", "echo 'Nice=19' >> /etc/systemd/system/llama-server@main.service.d/10-llamafleet.conf"],
        ],
        H2: [
            ["rm", "-f", MODEL],  # deleted model file
            ["systemctl", "stop", "llama-server@main.service"],  # stopped instance
            ["sh", "-c", 'ln -sfn "$(readlink /opt/llama.cpp/previous)" /opt/llama.cpp/current'],  # switched current
        ],
    }
    before = {h: (env_file(h), build_info(h)["name"]) for h in HOSTS}
    unit = on_host(H1, "cat", "/etc/systemd/system/llama-server@.service")
    for host, cmds in drifts.items():
        for cmd in cmds:
            on_host(host, *cmd)
    run = ok(play("site.yml", inv, tmp_path_factory), "site.yml after six kinds of drift")
    TIMES["site.yml repairing drift on 2 hosts"] = run.seconds
    assert run.hosts_in("Record the applied state") == set(HOSTS)
    for h in HOSTS:
        assert run.changed(h) > 0, h
        assert (env_file(h), build_info(h)["name"]) == before[h], h
        assert health(h) == 200
    assert on_host(H1, "cat", "/etc/systemd/system/llama-server@.service") == unit
    assert "Nice=19" not in on_host(H1, "cat", "/etc/systemd/system/llama-server@main.service.d/10-llamafleet.conf")
    assert on_host(H2, "test", "-s", MODEL, check=False) == ""
    again = ok(play("site.yml", inv, tmp_path_factory), "site.yml after the repairs")
    for h in HOSTS:
        assert again.changed(h) == 0 and again.tasks(h) <= NOOP_TASKS_MAX, (h, again.changed_tasks(h), again.tasks(h))


def _cmdline_args(host, name="main"):
    raw = on_host(host, "cat", f"/proc/{main_pid(host, name)}/cmdline")
    return [a for a in raw.split("\0") if a][1:]


def _env_args(host, name="main"):
    line = next(x for x in env_file(host, name).splitlines() if x.startswith("LLAMA_SERVER_ARGS="))
    return line.split("=", 1)[1].split()


def test_2c_a_process_behind_its_files_is_restarted(inv, tmp_path_factory):
    """What an interrupted run leaves (the environment file written, the restart never made): the process runs
    other arguments than its file, while the file is as recorded. The next site.yml finds it (the process's
    /proc/<pid>/cmdline against the file) and restarts it; the run after is a no-op."""
    original = env_file(H1)
    on_host(H1, "sh", "-c", "sed -i 's/--spec-draft-n-max [0-9]*/--spec-draft-n-max 1/' /etc/llama-server/main.env")
    on_host(H1, "systemctl", "restart", "llama-server@main.service")
    on_host(H1, "sh", "-c", f"cat > /etc/llama-server/main.env <<'EOF'\n{original}EOF")
    assert env_file(H1) == original and _cmdline_args(H1) != _env_args(H1)
    run = ok(play("site.yml", inv, tmp_path_factory), "site.yml after an interrupted restart")
    assert run.changed(H1) > 0 and run.changed(H2) == 0, (run.changed_tasks(H1), run.changed_tasks(H2))
    assert _cmdline_args(H1) == _env_args(H1) and health(H1) == 200
    again = ok(play("site.yml", inv, tmp_path_factory), "the run after")
    assert again.changed(H1) == 0 and again.tasks(H1) <= NOOP_TASKS_MAX


def _gateway_states():
    return {r["svname"]: r["status"] for r in gateway_stat(GATEWAY) if r["svname"] in (f"{H1}_main", f"{H2}_main")}


@pytest.mark.parametrize(
    "step",
    ["Set to drain on its gateways", "Restart llama-server@", "Enable on its gateways"],
)
def test_2d_an_interrupted_run_is_repaired_by_the_next(inv, tmp_path_factory, step):
    """SIGINT (ansible-runner's cancel) while the canary's instance is drained, restarting or coming back: the
    next site.yml ends with every instance UP on the gateway and running what its environment file says, and
    reports the repair as a change; the run after is a no-op."""
    gv = group_vars(inv)  # a change that restarts the instance and leaves its speed alone (the speed gate)
    gv["llamafleet_instances"][0]["alias"] = (
        "fleet-a" if gv["llamafleet_instances"][0].get("alias") != "fleet-a" else "fleet-b"
    )
    write_group_vars(inv, gv)
    cut = play("site.yml", inv, tmp_path_factory, gateway=True, interrupt_at=step)
    assert cut.status in ("canceled", "failed"), cut.status
    left = _gateway_states()
    print(f"\ninterrupted at {step!r}: gateway {left}, process runs its file: {_cmdline_args(H1) == _env_args(H1)}")
    run = ok(play("site.yml", inv, tmp_path_factory, gateway=True), f"site.yml after an interrupt at {step!r}")
    assert all(s == "UP" for s in _gateway_states().values()), _gateway_states()
    for h in HOSTS:
        assert _cmdline_args(h) == _env_args(h) and health(h) == 200, h
    if any(s != "UP" for s in left.values()):  # put back by the gateway, or by the host's own converge (restart)
        assert run.changed(GATEWAY) + run.changed(H1) > 0, (run.changed_tasks(GATEWAY), run.changed_tasks(H1))
    if step.startswith("Enable"):  # once, after the last of the three: the run after the repair is a no-op
        again = ok(play("site.yml", inv, tmp_path_factory, gateway=True), "the run after")
        assert sum(again.changed(h) for h in (*HOSTS, GATEWAY)) == 0, [again.changed_tasks(h) for h in HOSTS]


def _second_model(name, kind="agree", **kw):
    out = CACHE / "models" / "fleet-test"
    if not (out / f"{name}.gguf").exists():
        args = [sys.executable, str(REPO / "tests/harness/gguf/make_models.py"), "--kind", kind, "--name", name]
        for k, v in kw.items():
            args += [f"--{k.replace('_', '-')}", str(v)]
        subprocess.run([*args, "--out", str(out)], check=True, capture_output=True)
    return out / f"{name}.gguf"


def test_3_models_only_upgrade(inv, tmp_path_factory):
    path = _second_model("sandbox-mtp-v2", seed=7)
    gv = group_vars(inv)
    gv["llamafleet_models"].append({"name": "sandbox-mtp-v2", "source": "controller", "controller_path": str(path)})
    write_group_vars(inv, gv)
    run = play(
        "playbooks/upgrade.yml",
        inv,
        tmp_path_factory,
        extravars={"llamafleet_upgrade_models": {"main": "sandbox-mtp-v2"}},
    )
    ok(run, "models upgrade")
    for h in HOSTS:
        assert "/sandbox-mtp-v2/sandbox-mtp-v2.gguf" in env_file(h) and health(h) == 200
    assert release(inv)["llamafleet_release_models"] == {"main": "sandbox-mtp-v2"}
    assert release(inv)["llamacpp_mtp_build_ref"] == RELEASE
    # (test_5's --check then starts from this state and must show only what the next change does)


def test_4_check_predicts_the_real_run(inv, tmp_path_factory):
    gv = group_vars(inv)
    gv["llamafleet_instances"][0]["context"] = 2048
    write_group_vars(inv, gv)
    check = ok(play("site.yml", inv, tmp_path_factory, check=True), "--check --diff of a changed declared state")
    real = ok(play("site.yml", inv, tmp_path_factory), "the real run")
    for h in HOSTS:
        predicted, done = check.changed_tasks(h), real.changed_tasks(h)
        print(f"\n{h}: --check predicted {predicted}; the run changed {done}")
        assert predicted == done and predicted, h
        assert "--ctx-size 2048" in env_file(h)


def test_5_impossible_context_is_refused_before_any_restart(inv, tmp_path_factory):
    pids = {h: main_pid(h) for h in HOSTS}
    gv = group_vars(inv)
    good = gv["llamafleet_instances"][0]["context"]
    gv["llamafleet_instances"][0]["context"] = 99999999
    write_group_vars(inv, gv)
    try:
        run = play("site.yml", inv, tmp_path_factory)
        assert run.status == "failed"
        msgs = " ".join(str(m) for _, _, m in run.failures())
        assert f"host {H1}, instance 'main', field 'context'" in msgs, msgs[-2000:]
        assert "training context" in msgs and "host RAM" in msgs
        for h in HOSTS:
            assert main_pid(h) == pids[h] and health(h) == 200  # still serving, never restarted
        assert H2 not in run.hosts_in("Plan every instance")  # the rollout stopped at the canary
    finally:
        gv["llamafleet_instances"][0]["context"] = good
        write_group_vars(inv, gv)


def test_5b_every_bad_field_is_refused_in_the_facts_stage(inv, tmp_path_factory):
    """One instance per field of the table (FIELDS), each valid but for that field (tests/unit/field_cases.py:
    out of bounds, not a choice, the wrong type, or breaking the field's own rule), declared beside the serving
    one: site.yml's facts stage refuses the run on every host with one message that names host, instance and
    field for every one of them, changed=0 everywhere, and the serving instances never restart."""
    from ansible_collections.llamafleet.mtp.plugins.module_utils.fleet_instances import FIELDS, where

    from tests.unit.field_cases import bad_instances

    pids = {h: main_pid(h) for h in HOSTS}
    gv = group_vars(inv)
    good = list(gv["llamafleet_instances"])
    cases = bad_instances(FIELDS, good[0]["model"])
    gv["llamafleet_instances"] = good + [inst for _label, inst in cases.values()]
    write_group_vars(inv, gv)
    try:
        run = play("site.yml", inv, tmp_path_factory)
    finally:
        gv["llamafleet_instances"] = good
        write_group_vars(inv, gv)
    assert run.status == "failed" and run.rc != 0
    assert all(run.changed(h) == 0 for h in HOSTS), run.stats
    failed = {h: str(m) for h, _task, m in run.failures()}
    assert set(failed) == set(HOSTS), run.failures()
    for h in HOSTS:
        missing = [key for key, (label, _inst) in cases.items() if f"{where(h, label, key)}:" not in failed[h]]
        assert not missing, (h, missing, failed[h][-3000:])
        assert main_pid(h) == pids[h] and health(h) == 200  # still serving, never restarted
    assert not run.hosts_in("Plan every instance")  # nothing after the facts stage ran
    print(f"\nfacts stage: {len(cases)} bad fields refused on {len(HOSTS)} hosts in {run.seconds:.1f} s")


def test_6_failing_upgrade_rolls_back_the_canary_and_stops(inv, tmp_path_factory):
    # A model whose header is valid (download, verification and plan pass) but whose tensor data is cut
    # short: llama-server fails to load it, so the canary's health gate fails after its restart.
    good = _second_model("sandbox-mtp-v2", seed=7)
    broken = good.parent / "sandbox-mtp-broken.gguf"
    data = good.read_bytes()
    broken.write_bytes(data[: len(data) // 2])
    gv = group_vars(inv)
    gv["llamafleet_models"].append(
        {"name": "sandbox-mtp-broken", "source": "controller", "controller_path": str(broken)}
    )
    write_group_vars(inv, gv)
    before = {h: (env_file(h), build_info(h)["name"]) for h in HOSTS}
    rel_before = release(inv)
    try:
        run = play(
            "playbooks/upgrade.yml",
            inv,
            tmp_path_factory,
            extravars={"llamafleet_upgrade_models": {"main": "sandbox-mtp-broken"}},
        )
    finally:  # the broken model stays declared for no one else: a later full converge would refuse it
        gv["llamafleet_models"] = [m for m in gv["llamafleet_models"] if m["name"] != "sandbox-mtp-broken"]
        write_group_vars(inv, gv)
    assert run.status == "failed"
    assert run.count("rescued", H1) == 1, run.failures()
    # the canary ran the server role (and was rolled back); the rollout stopped before H2's turn
    assert H1 in run.hosts_in_role("llama_server_systemd"), run.failures()
    assert H2 not in run.hosts_in_role("llama_server_systemd")
    assert run.changed(H2) == 0
    for h in HOSTS:
        assert (env_file(h), build_info(h)["name"]) == before[h]
        assert health(h) == 200
    assert release(inv) == rel_before  # nothing recorded
    # the run stopped before its monitoring stage; the rescue told the monitor (LlamaHostNotAsDeclared)

    def marked():
        res = _prom("/query?query=llamafleet:host_as_declared")["result"]
        return {r["metric"]["host"]: (r["value"][1], r["metric"].get("reason", "")) for r in res}.get(H1, ("", ""))

    value, reason = _until(f"{H1} not as declared on the monitor", lambda: marked()[0] == "0" and marked(), timeout=60)
    assert "rolled back" in reason, reason


def _facts(run, host, name):
    """The last value a task of the run set for the host's fact ``name`` (set_fact), or None."""
    found = None
    for e in run.events:
        d = e.get("event_data") or {}
        if e.get("event") == "runner_on_ok" and d.get("host") == host:
            found = ((d.get("res") or {}).get("ansible_facts") or {}).get(name, found)
    return found


def _speed(run, host):
    """The speed gate's verdict for a host, from the job events (the fact set by 'Compare with the baseline')."""
    for e in run.events:
        d = e.get("event_data") or {}
        if e.get("event") == "runner_on_ok" and d.get("host") == host and d.get("task") == "Compare with the baseline":
            return d["res"]["ansible_facts"]["llamafleet_speed"]
    return None


def test_6b_a_slower_mtp_head_is_stopped_by_the_speed_gate(inv, tmp_path_factory):
    """A model upgrade to a worse-agreeing MTP head (the harness's ``partial`` kind: the head agrees with the trunk on
    30 % of the text tokens, against ``agree``'s 100 %) serves, passes /health and the smoke completion, and is
    slower: the speed gate stops it on the canary (rolled back, the second host untouched, no release written);
    ``llamafleet_accept_slower=true`` lets the same upgrade through. Stand-in: the generated GGUF models (no
    Hugging Face); the speed is the real llama-server's on this machine."""
    slow = _second_model("sandbox-mtp-partial", kind="partial", agree_fraction=0.3)
    gv = group_vars(inv)
    gv["llamafleet_models"].append(
        {"name": "sandbox-mtp-partial", "source": "controller", "controller_path": str(slow)}
    )
    write_group_vars(inv, gv)
    before = {h: (env_file(h), build_info(h)["name"]) for h in HOSTS}
    current = release(inv)["llamafleet_release_models"].get("main", gv["llamafleet_instances"][0]["model"])
    rel_before = release(inv)
    upgrade = {"llamafleet_upgrade_models": {"main": "sandbox-mtp-partial"}}
    run = play("playbooks/upgrade.yml", inv, tmp_path_factory, extravars=upgrade)
    assert run.status == "failed"
    assert run.count("rescued", H1) == 1, run.failures()
    msgs = " ".join(str(m) for _, _, m in run.failures())
    assert f"speed gate on {H1}: instance 'main'" in msgs and "sandbox-mtp-partial.gguf" in msgs, msgs[-2000:]
    assert f"{current}.gguf" in msgs and "llamafleet_accept_slower=true" in msgs, msgs[-2000:]
    verdict = _speed(run, H1)["instances"]["main"]
    print(f"\nspeed gate on the canary: {verdict}")
    assert verdict["change"] < -0.4  # beyond the sandbox's margin (inventories/sandbox: 40 %)
    assert run.changed(H2) == 0
    for h in HOSTS:
        assert (env_file(h), build_info(h)["name"]) == before[h] and health(h) == 200
    assert release(inv) == rel_before  # nothing recorded
    try:
        accepted = {**upgrade, "llamafleet_accept_slower": True}
        ok(play("playbooks/upgrade.yml", inv, tmp_path_factory, extravars=accepted), "the slower upgrade, accepted")
        for h in HOSTS:
            assert "/sandbox-mtp-partial/sandbox-mtp-partial.gguf" in env_file(h) and health(h) == 200
        assert release(inv)["llamafleet_release_models"] == {"main": "sandbox-mtp-partial"}
    finally:  # back to the agreeing head for the rest of the sequence (a clean-up: accepted whatever its speed)
        ok(play("playbooks/upgrade.yml", inv, tmp_path_factory,
                extravars={"llamafleet_upgrade_models": {"main": current}, "llamafleet_accept_slower": True}),
           "back to the agreeing MTP head")  # fmt: skip


def test_6c_the_follower_is_stopped_from_taking_the_fleet_into_a_slower_build(inv, tmp_path_factory):
    """The PR follower would take the fleet into a slower build: the fleet is pinned to the PR (as before its
    merge), the PR merges and its first release decodes slower. The speed gate stops the upgrade on the canary,
    rolls it back, names the host, the instance, both builds and both figures; the second host is untouched and
    the pin stays (no release written). STAND-IN: the release is the mirror's tag b9181, a commit on top of the
    mainline that makes llama-server sleep 5 ms in each decode call (tests/harness/llamacpp/mirror.sh); GitHub is
    the stand-in API. The speed is the real llama-server's on this machine."""
    rel_path = inv / "group_vars" / "all" / "llamafleet_release.yml"
    saved = rel_path.read_text()
    before = {h: (env_file(h), build_info(h)["name"]) for h in HOSTS}
    gh = github_follow.GitHub(tmp_path_factory.mktemp("github-slower"), CACHE / "git" / "llama.cpp.git")
    try:
        pinned = {**yaml.safe_load(saved), "llamacpp_mtp_build_ref": "refs/pull/22673/head"}
        rel_path.write_text("---\n" + yaml.safe_dump(pinned, sort_keys=False))
        gh.set("merged", release=github_follow.SLOWER)
        run = play("playbooks/follow_pr.yml", inv, tmp_path_factory, extravars=gh.extravars)
        assert github_follow.module_result(run)["follow"]["ref"] == github_follow.SLOWER
        assert run.status == "failed"
        assert run.count("rescued", H1) == 1, run.failures()
        msgs = " ".join(str(m) for _, _, m in run.failures())
        slower_sha = gh.sha[f"refs/tags/{github_follow.SLOWER}"][:12]
        assert f"speed gate on {H1}: instance 'main'" in msgs and "llamafleet_accept_slower=true" in msgs, msgs[-2000:]
        assert before[H1][1] in msgs and slower_sha in msgs, msgs[-2000:]  # both builds
        verdict = _speed(run, H1)["instances"]["main"]
        print(f"\nspeed gate on the canary, build {before[H1][1]} -> {github_follow.SLOWER}: {verdict}")
        assert verdict["change"] < -0.4 and f"{verdict['tok_s']:.1f} tokens/s" in msgs  # margin: 40 %
        assert run.changed(H2) == 0
        for h in HOSTS:
            assert (env_file(h), build_info(h)["name"]) == before[h] and health(h) == 200
        assert yaml.safe_load(rel_path.read_text()) == pinned  # the pin stays: no release written
    finally:
        gh.stop()
        rel_path.write_text(saved)


def test_7_deliberate_restarts_never_trip_the_start_limit(tmp_path_factory, tmp_path):
    pb = tmp_path / "restarts.yml"
    pb.write_text(
        f"---\n- hosts: {H1}\n  gather_facts: false\n  tasks:\n"
        "    - name: Restart main through the role, 8 times\n"
        "      ansible.builtin.include_role:\n        name: llamafleet.mtp.llama_server_systemd\n"
        "        tasks_from: restart\n      vars:\n        __llama_server_systemd_name: main\n"
        '      loop: "{{ range(8) | list }}"\n'
    )
    t0 = time.monotonic()
    import ansible_runner

    runner = ansible_runner.run(
        private_data_dir=str(tmp_path_factory.mktemp("runner")),
        project_dir=str(REPO),
        playbook=str(pb),
        inventory=str(REPO / "inventories" / "sandbox"),
        envvars={"ANSIBLE_CONFIG": str(REPO / "ansible.cfg")},
        quiet=True,
    )
    assert runner.status == "successful", Run(runner, 0).failures()
    print(f"\n8 restarts through the role: {time.monotonic() - t0:.0f} s")
    restarts = [
        e
        for e in runner.events
        if e.get("event") == "runner_on_ok" and (e["event_data"].get("task") or "").startswith("Restart llama-server@")
    ]
    assert len(restarts) == 8
    assert health(H1) == 200


def test_8_bench_autotune_then_site(inv, tmp_path_factory, tmp_path):
    # A model large enough that CPU decode is weight-bound, so MTP pays (agree head: acceptance 1.0).
    model = _second_model("bench-agree", n_embd=1024, n_layer=6)
    hv = inv / "host_vars" / H1
    hv.mkdir(parents=True, exist_ok=True)
    # The sandbox's instance (bound for the gateway, with its API key) on the bench model, with two slots: autotune
    # measures at that load (2 clients); no draft_n_max or spec_draft_p_min: the instance takes the tuned values.
    inst = {k: v for k, v in group_vars(inv)["llamafleet_instances"][0].items() if k != "draft_n_max"}
    inst.update(model="bench-agree", context=2048, parallel=2)
    (hv / "bench.yml").write_text(
        "---\n"
        + yaml.safe_dump(
            {
                "llamafleet_models": [{"name": "bench-agree", "source": "controller", "controller_path": str(model)}],
                "llamafleet_release_models": {},
                "llamafleet_instances": [inst],
            },
            sort_keys=False,
        )
    )
    run = play(
        "playbooks/bench.yml",
        inv,
        tmp_path_factory,
        tags="autotune",
        limit=H1,
        extravars={
            "llamafleet_bench_draft_n_max": [1, 3],
            "llamafleet_bench_draft_p_min": [0.5],
            "llamafleet_bench_dir": str(tmp_path / "results"),
            "llamafleet_bench_buffer_mib": 128,
        },
    )
    ok(run, "bench --tags autotune")
    result = json.loads((tmp_path / "results" / f"{H1}.json").read_text())["result"]
    labels = [r["label"] for r in result["rows"]]
    # the p-min value is measured at the faster of the two draft lengths
    fastest = max(result["rows"][1:3], key=lambda r: r["tok_s"])["draft_n_max"]
    assert labels == ["no-mtp", "mtp-n1", "mtp-n3", f"mtp-n{fastest}-p0.5"], labels
    assert result["rows"][3]["spec_draft_p_min"] == 0.5 and result["rows"][1]["spec_draft_p_min"] is None
    # at the declared load: 2 clients, compared on the served tokens/s of both
    assert result["concurrency"] == 2 and all(r["concurrency"] == 2 for r in result["rows"])
    # 3 rounds, each with both clients sending the one prompt
    assert all(r["tok_s"] == r["served_tok_s"] > 0 and len(r["served_tok_s_samples"]) == 3 and r["runs"] == 6
               for r in result["rows"])  # fmt: skip
    assert all(r["acceptance"] == 1.0 for r in result["rows"][1:])
    # the roofline: the model's decode bytes, the host's measured CPU bandwidth, an efficiency per row
    assert result["bandwidth_source"].startswith("measured read, CPUs ") and result["bandwidth_bytes_per_s"] > 10**8
    assert 0 < result["decode_bytes"]["token"] < model.stat().st_size
    assert all(r["efficiency_pct"] > 0 and r["bytes_per_token"] > 0 for r in result["rows"])
    bw_gbs = result["bandwidth_bytes_per_s"] / 1e9
    print(f"\nbench efficiency (no MTP): {result['efficiency_pct']} % of {bw_gbs:.1f} GB/s")
    tuned = hv / "llamafleet_autotune.yml"
    best = result["best_draft_n_max"]
    if best is None:  # a noisy 2-core machine can make MTP lose; then nothing is written
        assert not tuned.exists()
        best = 2
    else:
        p_min = result["best_spec_draft_p_min"]
        want = {"draft_n_max": best} | ({"spec_draft_p_min": p_min} if p_min is not None else {})
        assert yaml.safe_load(tuned.read_text())["llamafleet_autotune"] == {"main": want}
    site = ok(play("site.yml", inv, tmp_path_factory, limit=H1), "site.yml after autotune")
    assert f"--spec-draft-n-max {best}" in env_file(H1)
    if result["best_draft_n_max"] is not None:
        assert ("--spec-draft-p-min 0.5" in env_file(H1)) == (result["best_spec_draft_p_min"] == 0.5)
    print(
        f"\nautotune at 2 clients picked draft-n-max {result['best_draft_n_max']}, p-min "
        f"{result['best_spec_draft_p_min']} ({result['best_label']}); site.yml took {site.seconds:.0f} s"
    )
    print("\n".join(f"  {r['label']}: served {r['served_tok_s']} tok/s, one stream {r['tok_s_median']}"
                    for r in result["rows"]))  # fmt: skip


SSH_HOSTS = (f"{PREFIX}-ssh-1", f"{PREFIX}-ssh-2")


def _ssh_hosts(key_pub):
    """Two hosts from the sandbox image with OpenSSH's server (debian-systemd:12-ssh), each with the user deploy:
    sudo without a password, the controller's key in authorized_keys (as a production host is set up)."""
    env = dict(os.environ, SANDBOX_PREFIX=f"{PREFIX}-ssh", SANDBOX_GATEWAY="0")
    subprocess.run(["bash", str(REPO / "scripts/sandbox.sh"), "up", "2", "12-ssh"], check=True, capture_output=True,
                   env=env)  # fmt: skip
    for h in SSH_HOSTS:
        on_host(h, "useradd", "--create-home", "--shell", "/bin/bash", "deploy")
        on_host(h, "sh", "-c", "echo 'deploy ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/deploy && chmod 0440 "
                "/etc/sudoers.d/deploy && install -d -m 700 -o deploy -g deploy /home/deploy/.ssh")  # fmt: skip
        on_host(h, "sh", "-c", f"printf '%s\\n' '{key_pub}' > /home/deploy/.ssh/authorized_keys && chown deploy: "
                "/home/deploy/.ssh/authorized_keys && chmod 0600 /home/deploy/.ssh/authorized_keys")  # fmt: skip
        assert on_host(h, "systemctl", "is-active", "ssh").strip() == "active"


def _hosts_file(inv, hosts, connection, key=None):
    """inventory/hosts.yml: these hosts as llama_hosts, reached as deploy with become over ssh (at the host's
    address, with the test's key) or through the podman harness."""
    conn = {"ansible_connection": connection, "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_user": "deploy", "ansible_become": True}  # fmt: skip
    if connection == "ssh":
        conn |= {"ansible_ssh_private_key_file": str(key),
                 "ansible_ssh_common_args": "-o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no"}  # fmt: skip
    listed = {h: ({"ansible_host": container_ip(h)} if connection == "ssh" else None) for h in hosts}
    data = {"all": {"children": {"llama_hosts": {"hosts": listed, "vars": conn}}}}
    (inv / "hosts.yml").write_text("---\n" + yaml.safe_dump(data, sort_keys=False))


def test_9_over_ssh_as_a_non_root_user(tmp_path_factory):
    """The production transport: hosts with OpenSSH reached as an unprivileged user with sudo (ansible_user +
    ansible_become, as in inventories/prod) over ssh with the checkout's ansible.cfg (pipelining, ControlPersist).
    site.yml converges a fresh host, the next run is a no-op (timed, and timed again over the podman harness on
    the same host), and the upgrade moves it; controller-side files (the release file) belong to the user running
    ansible-playbook. Then a second host whose sshd is stopped is UNREACHABLE over ssh: reported, the run ends
    non-zero naming it, and the reachable host is read and found as declared. Back, it converges; a rolling
    converge that loses it in its batch (the container killed as its restart starts) fails that batch and ends
    non-zero with the canary converged, and the next run converges the host."""
    h, down = SSH_HOSTS
    keydir = tmp_path_factory.mktemp("ssh-key")
    key = keydir / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "llamafleet-test", "-f", str(key)],
                   check=True)  # fmt: skip
    inv = tmp_path_factory.mktemp("inventory-ssh") / "sandbox"
    shutil.copytree(REPO / "inventories" / "sandbox", inv)
    try:
        _ssh_hosts(key.with_suffix(".pub").read_text().strip())
        _hosts_file(inv, [h], "ssh", key)
        run = ok(play("site.yml", inv, tmp_path_factory), "site.yml over ssh as deploy with become")
        assert run.changed(h) > 0 and health(h) == 200 and not _unreachable(run)
        assert "--spec-type mtp " in env_file(h)
        assert on_host(h, "stat", "-c", "%U", "/home/deploy/.ansible").strip() == "deploy"  # connected as deploy
        assert on_host(h, "stat", "-c", "%U %a", "/etc/llama-server/main.env").strip() == "root 644"
        logins = on_host(h, "sh", "-c", "journalctl -u ssh --no-pager | grep -c 'Accepted publickey for deploy'")
        assert int(logins) > 0  # it came in over ssh
        noop = ok(play("site.yml", inv, tmp_path_factory), "the no-op over ssh")
        assert noop.changed(h) == 0
        _hosts_file(inv, [h], "podman")
        noop_podman = ok(play("site.yml", inv, tmp_path_factory), "the no-op over the podman harness")
        assert noop_podman.changed(h) == 0
        TIMES["no-op, 1 host, over ssh"] = noop.seconds
        TIMES["no-op, 1 host, over podman exec"] = noop_podman.seconds
        _hosts_file(inv, [h], "ssh", key)
        up = ok(
            play("playbooks/upgrade.yml", inv, tmp_path_factory, extravars={"llamafleet_upgrade_ref": MAINLINE}),
            "upgrade over ssh as deploy with become",
        )
        assert up.changed(h) > 0 and "--spec-type draft-mtp" in env_file(h) and health(h) == 200
        written = inv / "group_vars" / "all" / "llamafleet_release.yml"
        assert written.stat().st_uid == os.getuid() and release(inv)["llamacpp_mtp_build_ref"] == MAINLINE
        # A host whose sshd does not answer: UNREACHABLE over ssh, and it holds no one hostage
        on_host(down, "systemctl", "stop", "ssh.service")
        _hosts_file(inv, [h, down], "ssh", key)
        rel = release(inv)
        run = play("site.yml", inv, tmp_path_factory)
        assert run.status == "failed" and run.rc != 0
        assert _unreachable(run) == {down}, _unreachable(run)
        assert run.count("ok", h) > 0 and run.changed(h) == 0, run.stats
        (fail,) = [m for _, task, m in run.failures() if task.startswith("Fail the run for the hosts")]
        assert down in fail and h not in fail, fail
        assert len(run.failures()) == 1, run.failures()  # the reachable host failed nothing
        assert release(inv) == rel and health(h) == 200
        # Back: it converges. Then a declared change whose rolling converge loses that host in its batch (the
        # container killed when its restart starts, after the canary passed): the batch fails, the run ends
        # non-zero, the canary keeps the change; the next run, with the host back (maybe at a new address),
        # converges it.
        on_host(down, "systemctl", "start", "ssh.service")
        _hosts_file(inv, [h, down], "ssh", key)
        ok(play("site.yml", inv, tmp_path_factory), "site.yml with the second ssh host back")
        assert health(down) == 200 and "--spec-type draft-mtp" in env_file(down)
        gv = group_vars(inv)
        gv["llamafleet_instances"][0]["alias"] = "over-ssh"
        write_group_vars(inv, gv)
        killed = []

        def kill_at_its_restart(event):
            data = event.get("event_data") or {}
            if (
                event.get("event") == "runner_on_start" and data.get("host") == down and not killed
                and (data.get("task") or "").startswith("Restart llama-server@")
            ):  # fmt: skip
                killed.append(data["task"])
                subprocess.run(["podman", "kill", down], capture_output=True)

        run = play("site.yml", inv, tmp_path_factory, on_event=kill_at_its_restart)
        assert killed and run.status == "failed" and run.rc != 0, (killed, run.status)
        assert down in _unreachable(run) | {f[0] for f in run.failures()}, (run.stats, run.failures())
        assert "over-ssh" in aliases(env_file(h)) and run.changed(h) > 0 and health(h) == 200  # the canary's batch
        subprocess.run(["podman", "start", down], check=True, capture_output=True)
        _until(
            f"{down}'s sshd", lambda: on_host(down, "systemctl", "is-active", "ssh", check=False).strip() == "active"
        )
        _hosts_file(inv, [h, down], "ssh", key)
        again = ok(play("site.yml", inv, tmp_path_factory), "site.yml repairs the host lost in its batch")
        assert "over-ssh" in aliases(env_file(down)) and health(down) == 200 and again.changed(h) == 0
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "5", *SSH_HOSTS], capture_output=True)
    print(f"\nno-op on 1 host: {noop.seconds:.1f} s over ssh, {noop_podman.seconds:.1f} s over podman exec")


def test_10_gateway_killed_instance_leaves_the_pool_bad_key_401_metrics():
    """The fleet's one endpoint (role llama_gateway: Debian's HAProxy on <prefix>-gateway, the real openai client).
    A SIGKILLed instance leaves the pool within the health-check interval (inter 2 s x fall 2 + one interval),
    only requests in flight on it fail, and it returns after systemd restarts it; a bad key gets 401 from
    llama-server through the gateway; the file_sd file lists every instance and the gateway, both /metrics answer."""
    url, server = base_url(GATEWAY), f"{H1}_main"
    assert all(r["status"] == "UP" for r in gateway_stat(GATEWAY) if r["svname"] in (server, f"{H2}_main"))
    loops = GatewayLoops(url)
    try:
        time.sleep(2)
        t_kill = time.time()
        on_host(H1, "systemctl", "kill", "-s", "KILL", "llama-server@main.service")
        # The SIGKILL lands somewhere between these two clocks (podman exec takes 0.1-0.5 s): a request that
        # started in that window may have been on the instance when it died.
        t_killed = time.time()
        t_down, down_row = None, {}
        while time.time() - t_kill < 30 and t_down is None:
            row = gateway_stat(GATEWAY, server)[0]
            if row["status"].startswith("DOWN"):
                t_down, down_row = time.time(), row
            time.sleep(0.1)
        t_up = None
        while time.time() - t_kill < 120 and t_down and t_up is None:
            if gateway_stat(GATEWAY, server)[0]["status"] == "UP":
                t_up = time.time()
            time.sleep(0.2)
        time.sleep(1)
    finally:
        res = loops.stop()
    in_flight = sum(1 for rows in res.values() for r in rows if r[0] <= t_killed and r[1] >= t_kill)
    failed = [r for rows in res.values() for r in rows if not r[2]]
    assert t_down is not None and t_up is not None, (t_down, t_up)
    print(
        f"\nkilled {server}: out of the pool after {t_down - t_kill:.1f} s, back after {t_up - t_kill:.1f} s; "
        f"failed through the gateway {failures(res)} ({in_flight} in flight at the kill)"
    )
    # What the old 6.5 s limit stood for: the health check took it out (a failed check's result, e.g. L4CON or
    # L7STS, not a server left up until client traffic failed), and only the requests in flight at the kill failed.
    check = down_row.get("check_status", "").lstrip("* ")
    assert check and check not in ("UNK", "INI", "L4OK", "L6OK", "L7OK"), down_row
    assert len(failed) <= in_flight and all(r[0] <= t_killed for r in failed), (failed, t_kill, t_killed)
    assert sum(len(r) for r in res.values()) > 10

    openai = pytest.importorskip("openai")
    with pytest.raises(openai.AuthenticationError):
        client(url, key="not-the-key").chat.completions.create(
            model="sandbox", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
    assert client(url).models.list().data

    sd = json.loads(on_host(GATEWAY, "cat", "/etc/prometheus/file_sd/llamafleet.json"))
    targets = {t for group in sd for t in group["targets"]}
    assert {f"{H1}:8080", f"{H2}:8080", f"{GATEWAY}:8404"} <= targets, targets
    prom = urllib.request.urlopen(f"http://{container_ip(GATEWAY)}:8404/metrics", timeout=10).read().decode()
    assert 'haproxy_server_status{proxy="llama",server="' + server + '"' in prom
    bearer = {"Authorization": f"Bearer {api_key()}"}
    req = urllib.request.Request(f"http://{container_ip(H1)}:8080/metrics", headers=bearer)
    assert "llamacpp:" in urllib.request.urlopen(req, timeout=10).read().decode()


def _prom(path):
    """The sandbox's Prometheus (role llama_monitoring on the gateway host) over its HTTP API."""
    with urllib.request.urlopen(f"http://{container_ip(GATEWAY)}:9090/api/v1{path}", timeout=10) as r:
        return json.loads(r.read())["data"]


def _until(what, fn, timeout=90.0, every=1.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        got = fn()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")


def _prometheus_cost():
    """CPU seconds per second and resident memory of the monitor's Prometheus since it started."""
    pid = on_host(GATEWAY, "systemctl", "show", "-p", "MainPID", "--value", "prometheus").strip()
    stat = on_host(GATEWAY, "cat", f"/proc/{pid}/stat").rsplit(")", 1)[1].split()
    hz, up = 100, float(on_host(GATEWAY, "cat", "/proc/uptime").split()[0])
    cpu = (int(stat[11]) + int(stat[12])) / hz
    age = up - int(stat[19]) / hz
    rss = next(
        int(x.split()[1]) for x in on_host(GATEWAY, "cat", f"/proc/{pid}/status").splitlines() if x.startswith("VmRSS")
    )
    return cpu / age, rss / 1024, age


def test_10b_prometheus_watches_every_instance_and_alerts_when_one_stops(inv, tmp_path_factory):
    """The fleet's Prometheus (role llama_monitoring, Debian's package on the gateway host, from site.yml): every
    instance is a target that is up (scraped with its API key), each instance's MTP acceptance is a series after a
    few completions, the speed gate's figures are its baselines, and stopping one instance fires LlamaInstanceDown
    for it within its window (the sandbox: 15 s, scraped every 5 s). Real parts: Prometheus, llama-server's own
    /metrics, HAProxy's exporter."""

    # a run with its monitoring stage: tests 6 and 6b's failed converges marked their canary not as declared
    ok(play("site.yml", inv, tmp_path_factory, gateway=True), "site.yml with its gateway and monitoring stages")

    def targets():
        return {(t["labels"].get("host"), t["labels"]["job"]): t["health"] for t in _prom("/targets")["activeTargets"]}

    want = [(H1, "llama"), (H2, "llama"), (None, "llama-gateway"), (None, "prometheus")]
    _until("every instance, the gateway and Prometheus up", lambda: all(targets().get(k) == "up" for k in want))
    for h in HOSTS:
        _complete(h, 3)

    def acceptance():
        res = _prom("/query?query=llamafleet:instance_mtp_acceptance:ratio_rate5m")["result"]
        return {r["metric"]["host"]: float(r["value"][1]) for r in res} if len(res) == 2 else None

    acc = _until("both instances' MTP acceptance", acceptance)
    assert all(0 < v <= 1 for v in acc.values()), acc
    base = {r["metric"]["host"] for r in _prom("/query?query=llamafleet:baseline_decode_tokens_per_second")["result"]}
    assert base == set(HOSTS), base  # the speed gate's figures, recorded by the converge

    def declared():
        return {r["metric"]["host"]: r["value"][1] for r in _prom("/query?query=llamafleet:host_as_declared")["result"]}

    # the last run left both as declared: no alert. Within the rules' evaluation interval: when the run restarted
    # Prometheus, the last sample written before the restart (test 6b's canary marked 0) is what a query returns
    # until the reloaded rule is evaluated.
    _until(f"both hosts as declared (now {declared()})", lambda: declared() == dict.fromkeys(HOSTS, "1"), timeout=30)
    t_stop = time.monotonic()
    on_host(H2, "systemctl", "stop", "llama-server@main.service")
    try:

        def firing():
            q = urllib.parse.quote('ALERTS{alertname="LlamaInstanceDown",alertstate="firing"}')
            return [r["metric"]["host"] for r in _prom(f"/query?query={q}")["result"]]

        assert _until("LlamaInstanceDown firing", firing, timeout=120) == [H2]
        fired = time.monotonic() - t_stop
    finally:
        on_host(H2, "systemctl", "start", "llama-server@main.service")
        _until(f"{H2} healthy again", lambda: health(H2) == 200, timeout=120)
        _until(f"{H2} UP in the gateway", lambda: gateway_stat(GATEWAY, f"{H2}_main")[0]["status"] == "UP")
    cpu, rss, age = _prometheus_cost()
    n = len(_prom("/targets")["activeTargets"])
    TIMES["instance stopped -> alert firing"] = fired
    print(
        f"\nprometheus: {n} targets every 5 s, {cpu * 100:.1f} % of a core and {rss:.0f} MiB resident over {age:.0f} s;"
        f" instance stopped -> LlamaInstanceDown firing in {fired:.1f} s (for: 15 s); acceptance {acc}"
    )


def _complete(host, n):
    """n short completions at temperature 0 straight to the host's instance (with the fleet's API key)."""
    bearer = {"Authorization": f"Bearer {api_key()}", "Content-Type": "application/json"}
    for _ in range(n):
        body = json.dumps({"prompt": "The lighthouse keeper", "n_predict": 16, "temperature": 0}).encode()
        req = urllib.request.Request(f"http://{container_ip(host)}:8080/completion", data=body, headers=bearer)
        urllib.request.urlopen(req, timeout=60).read()


def _status_rows(run):
    """The rows status.yml computed (its set_fact event), host -> row (one instance per sandbox host)."""
    (res,) = [
        e["event_data"]["res"]
        for e in run.events
        if e.get("event") == "runner_on_ok"
        and e["event_data"].get("task") == "Join what the hosts and the monitor answered"
    ]
    return {r["host"]: r for r in res["ansible_facts"]["llamafleet_status"]["rows"]}


def test_10c_status_shows_every_instance_as_it_serves(inv, tmp_path_factory, tmp_path):
    """playbooks/status.yml after fresh completions on each instance: one row per instance with what the host and the
    instance say (build and MTP spelling from build-info, the tuned draft-n-max and slots from the environment file,
    the model's sha256 from the file on the host, health) and what the monitor says (MTP acceptance over its 5-minute
    window, once Prometheus holds each instance's own latest counters), the host as declared; changed=0, and the
    same rows under --check; --json writes the same rows. (The monitor's window and the instance's counters since
    its last start cover different traffic, so each is compared with its own source.)"""
    # 10b restarted one instance (its own counters start again at 0): a few completions on each, then wait until
    # Prometheus has scraped the counters each instance now reports, so both sources have seen the same drafts
    drafted = "llamacpp:spec_decode_num_draft_tokens_total"
    for h in HOSTS:
        _complete(h, 3)

    def scraped():
        q = urllib.parse.quote(drafted)
        got = {r["metric"].get("host"): float(r["value"][1]) for r in _prom(f"/query?query={q}")["result"]}
        return all(got.get(h) == _instance_metrics(h)[drafted] > 0 for h in HOSTS)

    _until("Prometheus has scraped each instance's latest drafts", scraped, every=2.0)
    time.sleep(6)  # one evaluation of the recording rules after that scrape (5 s)

    def monitor_acceptance():
        res = _prom("/query?query=llamafleet:instance_mtp_acceptance:ratio_rate5m")["result"]
        return {r["metric"]["host"]: float(r["value"][1]) for r in res}

    before = monitor_acceptance()
    dest = tmp_path / "status.json"
    run = ok(
        play("playbooks/status.yml", inv, tmp_path_factory,
             extravars={"llamafleet_status_format": "json", "llamafleet_status_dest": str(dest)}),
        "status.yml",
    )  # fmt: skip
    after = monitor_acceptance()
    TIMES["status.yml, 2 hosts"] = run.seconds
    assert all(run.changed(h) == 0 for h in (*HOSTS, GATEWAY)), run.stats
    rows = _status_rows(run)
    assert set(rows) == set(HOSTS)
    assert {r["host"]: r for r in json.loads(dest.read_text())} == rows
    for h in HOSTS:
        r, info, env = rows[h], build_info(h), env_file(h)
        assert (r["instance"], r["health"], r["reachable"], r["declared"]) == ("main", "healthy", True, "yes"), r
        assert (r["build"], r["commit"]) == (info["name"], info["commit"])
        assert r["mtp"] == info["capabilities"]["mtp_spec_type"] and f"--spec-type {r['mtp']}" in env
        assert f"--spec-draft-n-max {r['draft_n_max']} " in env and f"--parallel {r['slots_total']} " in env
        path = re.search(r"--model (\S+)", env).group(1)
        assert r["sha256"] == on_host(h, "sha256sum", path).split()[0]
        assert r["url"].endswith(":8080"), r["url"]
        assert r["source"] == "prometheus" and r["slots_busy"] == 0, r
        # the monitor's figure as the rule gave it while status.yml ran (the window slides: between two readings)
        low, high = sorted((before[h], after[h]))
        assert 0 < r["acceptance"] <= 1 and low - 0.02 <= r["acceptance"] <= high + 0.02, (r, before, after)
    check = ok(play("playbooks/status.yml", inv, tmp_path_factory, check=True), "status.yml --check")
    assert all(check.changed(h) == 0 for h in (*HOSTS, GATEWAY))
    assert {h: (r["health"], r["declared"]) for h, r in _status_rows(check).items()} == {
        h: ("healthy", "yes") for h in HOSTS
    }
    print(f"\nstatus.yml: {run.seconds:.1f} s for {len(HOSTS)} hosts (--check {check.seconds:.1f} s)")


def _instance_metrics(host):
    """The instance's own /metrics, read on its host with its key file (as status.yml reads it)."""
    code = (
        "import urllib.request; key = open('/etc/llama-server/main.key').read().strip(); "
        "o = urllib.request.build_opener(urllib.request.ProxyHandler({})); "
        "r = urllib.request.Request('http://127.0.0.1:8080/metrics', headers={'Authorization': 'Bearer ' + key}); "
        "print(o.open(r, timeout=10).read().decode())"
    )
    text = on_host(host, "python3", "-c", code)
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and " " in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_11_no_secret_in_any_log(tmp_path_factory):
    """The API key reaches each host only as its root-only key file: never a log, an artifact or a record.
    (The HF token and the gateway's own key lists are searched the same way by the model_fetch and
    llama_gateway molecule scenarios; the sandbox has neither.)"""
    key = api_key()
    assert len(key) >= 16
    base = tmp_path_factory.getbasetemp()
    assert (base / "ansible.log").stat().st_size > 0
    searched, found = 0, []
    for f in base.rglob("*"):
        if f.is_file():
            searched += 1
            if key.encode() in f.read_bytes():
                found.append(str(f.relative_to(base)))
    assert searched > 100, searched  # every run's artifacts (job events, stdout), the controller's log
    alive = [h for h in (*HOSTS, H3, GATEWAY) if subprocess.run(["podman", "container", "exists", h]).returncode == 0]
    assert set(HOSTS) | {GATEWAY} <= set(alive), alive
    for h in alive:
        invoked = on_host(h, "sh", "-c", "journalctl --no-pager -o export | grep -ac 'Invoked with'", check=False)
        assert int(invoked.strip() or 0) > 0, h  # the modules' calls are in the journal to search
        n = on_host(h, "sh", "-c", f"journalctl --no-pager -o export | grep -acF -- '{key}'", check=False).strip()
        if n != "0":
            found.append(f"{h}: journal ({n} entries)")
        if h != GATEWAY and key in on_host(h, "cat", "/var/lib/llamafleet/applied.json", check=False):
            found.append(f"{h}: /var/lib/llamafleet/applied.json")
    assert not found, f"the API key is in: {found}"


def _unreachable(run):
    return {e["event_data"].get("host") for e in run.events if e.get("event") == "runner_on_unreachable"}


def test_12_a_down_host_holds_no_one_hostage_and_rejoins_with_a_new_address(inv, tmp_path_factory):
    """A stopped host (podman stop): site.yml with a declared change reports it UNREACHABLE, converges the other
    host, leaves the down one out of the gateway and ends non-zero naming it; upgrade.yml writes no release.
    Started again with another address (a container took its old one meanwhile), it converges on the next
    site.yml and is UP in the gateway again (HAProxy follows the name). Requests through the gateway are
    counted throughout."""
    loops = GatewayLoops(base_url(GATEWAY))
    squatter = f"{PREFIX}-squatter"
    try:
        old_ip = container_ip(H2)
        subprocess.run(["podman", "stop", "-t", "5", H2], check=True, capture_output=True)
        # A declared change for both hosts: where each one's instances are declared (test 8 left host_vars for H1).
        # (An alias: a speed-neutral change, which the speed gate lets through on these shared cores.)
        want = "fleet-down-b" if "fleet-down-a" in aliases(env_file(H1)) else "fleet-down-a"
        for f in [inv / "group_vars" / "llama_hosts.yml", *sorted(inv.glob("host_vars/*/*.yml"))]:
            data = yaml.safe_load(f.read_text()) or {}
            if data.get("llamafleet_instances"):
                data["llamafleet_instances"][0]["alias"] = want
                f.write_text("---\n" + yaml.safe_dump(data, sort_keys=False))
        run = play("site.yml", inv, tmp_path_factory, gateway=True)
        assert run.status == "failed" and run.rc != 0
        assert _unreachable(run) == {H2}, _unreachable(run)
        assert want in aliases(env_file(H1)) and run.changed(H1) > 0  # H1 was not held hostage
        (fail,) = [m for _, task, m in run.failures() if task.startswith("Fail the run for the hosts")]
        assert H2 in fail, fail
        assert all(not r["svname"].startswith(H2) for r in gateway_stat(GATEWAY)), "the down host is left out"
        status = play("playbooks/status.yml", inv, tmp_path_factory)
        rows = _status_rows(status)
        assert (rows[H2]["reachable"], rows[H2]["health"], rows[H2]["instance"]) == (False, "unreachable", None)
        assert rows[H1]["health"] == "healthy" and rows[H1]["declared"] == "yes" and status.rc == 0, (rows, status.rc)
        TIMES["status.yml, one of 2 hosts down"] = status.seconds
        rel = release(inv)
        up = play("playbooks/upgrade.yml", inv, tmp_path_factory, extravars={"llamafleet_upgrade_ref": RELEASE})
        assert up.status == "failed" and release(inv) == rel  # not every host converged: nothing recorded
        # a new address: another container takes the old one while the host is down
        subprocess.run(["podman", "run", "-d", "--rm", "--name", squatter, "--network", "llamafleet",
                        "--entrypoint", "sleep", "localhost/debian-systemd:12", "600"], check=True,
                       capture_output=True)  # fmt: skip
        subprocess.run(["podman", "start", H2], check=True, capture_output=True)
        new_ip = container_ip(H2)
        print(f"\n{H2}: {old_ip} -> {new_ip}")
        ok(play("site.yml", inv, tmp_path_factory, gateway=True), "site.yml with the host back")
        assert want in aliases(env_file(H2)) and health(H2) == 200
        deadline = time.time() + 30
        while time.time() < deadline and gateway_stat(GATEWAY, f"{H2}_main")[0]["status"] != "UP":
            time.sleep(1)
        assert gateway_stat(GATEWAY, f"{H2}_main")[0]["status"] == "UP"
    finally:
        subprocess.run(["podman", "rm", "-f", squatter], capture_output=True)
        subprocess.run(["podman", "start", H2], capture_output=True)
        res = loops.stop()
    print(f"failed through the gateway while {H2} was down and came back: {failures(res)}")


def test_zz_print_times():
    print("\nfleet timings (s): " + ", ".join(f"{k} {v:.0f}" for k, v in TIMES.items()))
