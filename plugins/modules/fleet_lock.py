#!/usr/bin/python
"""Documentation of the action plugin llamafleet.mtp.fleet_lock (plugins/action/fleet_lock.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fleet_lock
short_description: One run at a time per inventory - a controller-side lock held by the ansible-playbook process
version_added: "0.2.0"
description:
  - Takes a lock file on the controller for the inventory the run uses, held by the ansible-playbook process the
    task runs under. A second run finds it held and waits up to O(wait) seconds, then fails with a message naming
    the holder (since when, pid, user, playbook), before any host changes.
  - The lock belongs to a process, so nothing has to release it - once the holder's process is gone (finished,
    interrupted, killed) the lock is stale and the next run takes it over (RV(taken_over) says so). The playbooks of the
    collection take it again in each imported playbook; the same process holds it once.
  - Check mode takes no lock (nothing changes).
  - Pure file logic in plugins/module_utils/fleet_lock.py.
author:
  - llamafleet maintainers (!UNKNOWN)
options:
  path:
    description: The lock file; default C(~/.cache/llamafleet/locks/<hash of the inventory sources>.lock).
    type: path
  wait:
    description: Seconds to wait for a live holder before failing.
    type: float
    default: 0
extends_documentation_fragment:
  - llamafleet.mtp.attributes.controller_action
"""

EXAMPLES = r"""
- name: One run at a time on this inventory
  llamafleet.mtp.fleet_lock:
    wait: 300
  run_once: true
"""

RETURN = r"""
path:
  description: The lock file.
  returned: always
  type: str
holder:
  description: The record in the lock (C(pid), C(user), C(playbook), C(since), C(inventory)) - this run's on success,
    the other run's on failure.
  returned: always
  type: dict
taken_over:
  description: The record of a stale lock this run took over, or null.
  returned: success
  type: dict
"""
