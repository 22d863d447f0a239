#!/usr/bin/python
"""Ansible module llamafleet.mtp.llama_server_health: the health gate of a llama-server systemd instance."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llama_server_health
short_description: Wait until a llama-server systemd instance answers /health 200, or fail with its journal
version_added: "0.1.0"
description:
  - Polls O(url) (the instance's C(/health)) and the systemd unit O(unit) until llama-server answers 200.
    A 503 means the model is still loading; no answer means the HTTP server is not up yet.
  - Fails at once when the process exits (the unit is failed, inactive or waiting to auto-restart, its main PID
    changed, or systemd restarted it), when C(/health) answers anything but 200 or 503, or when O(timeout) passes.
    The failure message ends with the last O(journal_lines) lines of the unit's journal.
  - Never changes anything. The verdict logic is C(health_verdict) in plugins/module_utils/llama_server_args.py.
author:
  - llamafleet maintainers (!UNKNOWN)
options:
  unit:
    description: The systemd unit, e.g. C(llama-server@qwen.service).
    type: str
    required: true
  url:
    description: The C(/health) URL to poll.
    type: str
    required: true
  timeout:
    description: Seconds to wait for 200.
    type: int
    default: 120
  interval:
    description: Seconds between polls.
    type: float
    default: 0.5
  main_pid:
    description:
      - The main PID right after the (re)start; read when the module starts if omitted (the usual case - the
        C(status) that M(ansible.builtin.systemd_service) returns was read before it acted).
    type: int
  n_restarts:
    description: systemd's C(NRestarts) right after the (re)start; read at the start when omitted.
    type: int
  journal_lines:
    description: Journal lines to include when failing.
    type: int
    default: 40
attributes:
  check_mode:
    support: full
    description: Polls once and reports what it saw, without waiting or failing.
  diff_mode:
    support: none
    description: Nothing to diff.
"""

EXAMPLES = r"""
- name: Restart the instance
  ansible.builtin.systemd_service:
    name: llama-server@qwen.service
    state: restarted

- name: Wait until it is healthy
  llamafleet.mtp.llama_server_health:
    unit: llama-server@qwen.service
    url: http://127.0.0.1:8080/health
    timeout: 600
"""

RETURN = r"""
healthy:
  description: Whether /health answered 200.
  returned: always
  type: bool
state:
  description: The last verdict - C(ready), C(loading), C(starting) or C(failed).
  returned: always
  type: str
reason:
  description: Why, in words.
  returned: always
  type: str
elapsed:
  description: Seconds waited.
  returned: always
  type: float
unit_state:
  description: The last systemd properties read (ActiveState, SubState, Result, MainPID, NRestarts, ExecMainStatus).
  returned: always
  type: dict
journal:
  description: The last journal lines of the unit.
  returned: failed
  type: list
  elements: str
"""

import time
import urllib.error
import urllib.request

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llamafleet.mtp.plugins.module_utils.llama_server_args import health_verdict

PROPS = ("ActiveState", "SubState", "Result", "MainPID", "NRestarts", "ExecMainStatus")
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # local URL: never through a proxy


def _unit_state(module, unit: str) -> dict:
    args = [module.get_bin_path("systemctl", required=True), "show", unit] + [f"--property={p}" for p in PROPS]
    rc, out, err = module.run_command(args)
    if rc != 0:
        module.fail_json(msg=f"systemctl show {unit} failed (rc {rc}): {err.strip() or out.strip()}")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _http_status(url: str, timeout: float):
    try:
        with _OPENER.open(url, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _journal(module, unit: str, lines: int) -> list[str]:
    journalctl = module.get_bin_path("journalctl")
    if not journalctl:
        return ["(journalctl not found)"]
    rc, out, err = module.run_command([journalctl, "-u", unit, "-n", str(lines), "--no-pager", "-o", "short-iso"])
    return (out or err).rstrip("\n").splitlines()


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "unit": {"type": "str", "required": True},
            "url": {"type": "str", "required": True},
            "timeout": {"type": "int", "default": 120},
            "interval": {"type": "float", "default": 0.5},
            "main_pid": {"type": "int"},
            "n_restarts": {"type": "int"},
            "journal_lines": {"type": "int", "default": 40},
        },
        supports_check_mode=True,
    )
    p = module.params
    start = time.monotonic()
    first = _unit_state(module, p["unit"])
    baseline = {
        "MainPID": p["main_pid"] if p["main_pid"] is not None else first.get("MainPID"),
        "NRestarts": p["n_restarts"] if p["n_restarts"] is not None else first.get("NRestarts"),
    }
    while True:
        status = _http_status(p["url"], timeout=min(5.0, max(1.0, p["timeout"] / 10)))
        unit = _unit_state(module, p["unit"])
        state, reason = health_verdict(status, unit, baseline)
        elapsed = round(time.monotonic() - start, 2)
        result = {"changed": False, "state": state, "reason": reason, "elapsed": elapsed, "unit_state": unit}
        if state == "ready" or module.check_mode:
            module.exit_json(healthy=state == "ready", **result)
        if state != "failed" and elapsed >= p["timeout"]:
            state, reason = "failed", f"not healthy after {p['timeout']} s (last: {reason})"
            result.update(state=state, reason=reason)
        if state == "failed":
            journal = _journal(module, p["unit"], p["journal_lines"])
            module.fail_json(
                msg=f"{p['unit']} is not healthy: {reason}. Last {len(journal)} journal lines:\n" + "\n".join(journal),
                healthy=False,
                journal=journal,
                **result,
            )
        time.sleep(p["interval"])


if __name__ == "__main__":
    main()
