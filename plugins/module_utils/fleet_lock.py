# MIT License (see LICENSE)
"""One run at a time per inventory: a lock file on the controller, held by the ansible-playbook process.

Pure file logic (no Ansible imports), used by the action plugin llamafleet.mtp.fleet_lock. The lock is a JSON
file ``{pid, user, playbook, since, inventory}`` created with O_EXCL. It belongs to a process (the
ansible-playbook that took it): while that process lives, another run waits a bounded time or stops with a
message naming the holder; once it is gone (finished, killed, crashed) the lock is stale and the next run
takes it over. So nothing has to release it, and an interrupted run never leaves the fleet locked.
"""

from __future__ import annotations

import fcntl
import json
import os
import time


class LockHeld(Exception):
    """Another live run holds the lock; ``holder`` is its record."""

    def __init__(self, holder, path):
        self.holder, self.path = holder, path
        super().__init__(
            f"another run holds the fleet since {holder.get('since')} (pid {holder.get('pid')}, user "
            f"{holder.get('user')}, playbook {holder.get('playbook')}); lock {path}. Wait for it, or set "
            "llamafleet_lock_wait to wait up to that many seconds"
        )


def alive(pid):
    """Whether a process with this pid exists (a zombie counts as gone)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def acquire(path, record, wait=0.0, poll=1.0, is_alive=alive):
    """Take the lock for ``record['pid']``; returns ``(record, taken_over)`` (taken_over: the stale holder's record,
    or None). Already held by the same pid: returns it again (playbooks import one another). A live holder:
    waits up to ``wait`` seconds, then raises LockHeld."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    deadline = time.monotonic() + max(0.0, float(wait))
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            holder = _read(path)
            if holder and holder.get("pid") == record["pid"]:
                return holder, None
            if holder is None or not is_alive(holder.get("pid")):
                # Stale (its run is gone): replaced under a guard, so that two runs finding it stale at once
                # cannot both take it (the second sees the first one's live record).
                with open(f"{path}.guard", "a") as guard:
                    fcntl.flock(guard, fcntl.LOCK_EX)
                    again = _read(path)
                    if again == holder:
                        tmp = f"{path}.{record['pid']}"
                        with open(tmp, "w") as f:
                            json.dump(record, f)
                        os.replace(tmp, path)
                        return record, holder or {}
                continue
            if time.monotonic() >= deadline:
                raise LockHeld(holder, path) from None
            time.sleep(poll)
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        return record, None
