"""Action plugin llamafleet.mtp.fleet_lock: one run at a time per inventory (controller-side lock)."""

from __future__ import annotations

import datetime
import hashlib
import os
import pwd

from ansible.plugins.action import ActionBase
from ansible_collections.llamafleet.mtp.plugins.module_utils.fleet_lock import LockHeld, acquire


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return " ".join(a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a)[:300]
    except OSError:
        return None


class ActionModule(ActionBase):
    """Takes the lock for the ansible-playbook process this task runs under (the worker's parent)."""

    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset(("path", "wait"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        if self._task.check_mode or self._play_context.check_mode:
            result.update(changed=False, skipped=True, msg="check mode changes nothing: no lock taken")
            return result
        sources = sorted(os.path.abspath(s) for s in task_vars.get("ansible_inventory_sources") or [])
        path = self._task.args.get("path") or os.path.join(
            os.path.expanduser("~"),
            ".cache",
            "llamafleet",
            "locks",
            hashlib.sha256("\n".join(sources).encode()).hexdigest()[:16] + ".lock",
        )
        pid = os.getppid()  # the ansible-playbook process: task workers are forked from it
        record = {
            "pid": pid,
            "user": pwd.getpwuid(os.getuid()).pw_name,
            "playbook": _cmdline(pid),
            "since": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "inventory": sources,
        }
        try:
            held, stale = acquire(path, record, wait=float(self._task.args.get("wait") or 0))
        except LockHeld as e:
            result.update(failed=True, msg=f"llamafleet: nothing was changed; {e}", holder=e.holder, path=path)
            return result
        # A stale lock is what every finished run leaves (nothing releases it): taken over without a warning.
        result.update(changed=False, path=path, holder=held, taken_over=stale)
        return result
