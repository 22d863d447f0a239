"""One run at a time per inventory (module_utils/fleet_lock.py, action llamafleet.mtp.fleet_lock), with real
processes as holders: a live holder stops a second run (or makes it wait), a gone holder's lock is taken over,
the same process takes it again, and a playbook run takes it for its ansible-playbook process."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from ansible_collections.llamafleet.mtp.plugins.module_utils.fleet_lock import LockHeld, acquire, alive
from ansible_run import needs_ansible, run_playbook


def rec(pid, playbook="site.yml"):
    return {"pid": pid, "user": "root", "playbook": playbook, "since": "2026-12-02T13:00:00+00:00"}


@pytest.fixture
def holder():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_live_holder_stops_a_second_run_naming_it(tmp_path, holder):
    path = str(tmp_path / "locks" / "fleet.lock")
    assert acquire(path, rec(holder.pid, "upgrade.yml")) == (rec(holder.pid, "upgrade.yml"), None)
    with pytest.raises(LockHeld) as e:
        acquire(path, rec(999999999))
    msg = str(e.value)
    assert f"pid {holder.pid}" in msg and "playbook upgrade.yml" in msg and "since 2026-12-02T13:00:00" in msg
    assert json.loads(Path(path).read_text())["pid"] == holder.pid  # untouched
    # the same process (an imported playbook) takes it again
    assert acquire(path, rec(holder.pid))[0]["pid"] == holder.pid


def test_a_gone_holder_is_stale_and_taken_over(tmp_path, holder):
    path = str(tmp_path / "fleet.lock")
    acquire(path, rec(holder.pid))
    holder.kill()
    holder.wait()
    assert not alive(holder.pid)
    me = rec(12345678, "bench.yml")
    taken, stale = acquire(path, me, is_alive=lambda pid: pid == 12345678)
    assert taken == me and stale["pid"] == holder.pid
    assert json.loads(Path(path).read_text()) == me


def test_a_second_run_waits_a_bounded_time(tmp_path, holder):
    path = str(tmp_path / "fleet.lock")
    acquire(path, rec(holder.pid))
    checks = []
    t0 = time.monotonic()
    with pytest.raises(LockHeld):  # it gives up: the wait is bounded
        acquire(path, rec(999999999), wait=1.0, poll=0.2, is_alive=lambda p: checks.append(p) or alive(p))
    # it waited the time asked (load can only lengthen it), polling the holder at most once per poll interval
    assert time.monotonic() - t0 >= 0.9
    assert 2 <= len(checks) <= 1.0 / 0.2 + 2 and set(checks) == {holder.pid}, checks
    threading.Timer(0.5, holder.kill).start()  # the holder ends while the second run waits
    taken, stale = acquire(path, rec(999999998), wait=10, poll=0.1, is_alive=lambda p: p != holder.pid and alive(p))
    assert taken["pid"] == 999999998 and stale["pid"] == holder.pid


def test_two_runs_finding_a_stale_lock_at_once_take_it_once(tmp_path):
    path = str(tmp_path / "fleet.lock")
    with open(path, "w") as f:
        json.dump(rec(999999990), f)  # a run that is gone
    won = []
    barrier = threading.Barrier(8)

    def run(pid):
        barrier.wait()
        try:
            acquire(path, rec(pid), is_alive=lambda p: p != 999999990)
            won.append(pid)
        except LockHeld:
            pass

    threads = [threading.Thread(target=run, args=(1000 + i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and json.loads(Path(path).read_text())["pid"] == won[0]


@needs_ansible
def test_a_playbook_takes_it_for_its_process_and_a_second_run_stops(tmp_path, holder):
    path = tmp_path / "fleet.lock"
    pb = tmp_path / "lock.yml"
    pb.write_text(
        "---\n- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        f"    - llamafleet.mtp.fleet_lock:\n        path: {path}\n"
        f"    - llamafleet.mtp.fleet_lock:\n        path: {path}\n"  # imported playbooks take it again
    )
    result = run_playbook(pb)
    assert not result.get("failed") and result["holder"]["pid"] != holder.pid, result
    record = json.loads(path.read_text())
    assert "ansible-playbook" in record["playbook"] and not alive(record["pid"])  # that run is over: stale
    path.write_text(json.dumps(rec(holder.pid, "ansible-playbook upgrade.yml")))  # a run in progress
    result = run_playbook(pb, check_rc=False)
    assert result.get("failed") and "another run holds the fleet since" in result["msg"], result
    assert f"pid {holder.pid}" in result["msg"] and "nothing was changed" in result["msg"]
