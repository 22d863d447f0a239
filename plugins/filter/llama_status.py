"""Filter plugin llamafleet.mtp.llama_fleet_status (a thin wrapper over module_utils/status.py)."""

from __future__ import annotations

# Documentation: llama_fleet_status.yml beside this file.
from ansible_collections.llamafleet.mtp.plugins.module_utils.status import fleet_status, render


def _read(result):
    """A registered llama_host_state result (set_facts) -> {unreachable, failed, msg, state}."""
    r = result if isinstance(result, dict) else {}
    return {
        "unreachable": bool(r.get("unreachable")),
        "failed": bool(r.get("failed")) or bool(r.get("skipped")),
        "msg": r.get("msg"),
        "state": ((r.get("ansible_facts") or {}).get("llama_host_state")) if not r.get("failed") else None,
    }


def _declared(result):
    """A registered fleet_declared result -> itself, or None when it did not run (the host was not read)."""
    r = result if isinstance(result, dict) else None
    return None if r is None or r.get("skipped") else r


def llama_fleet_status(reads, hosts, declared=None, ref_commit=None, prometheus=None, notes=None):
    rows = fleet_status(
        list(hosts or []),
        {h: _read(r) for h, r in dict(reads or {}).items()},
        {h: _declared(r) for h, r in dict(declared or {}).items()},
        ref_commit or None,
        prometheus,
    )
    return {"rows": rows, "lines": render(rows, list(notes or []))}


class FilterModule:
    def filters(self):
        return {"llama_fleet_status": llama_fleet_status}
