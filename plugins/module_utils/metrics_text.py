"""Prometheus text exposition -> numbers (what llama-server's /metrics answers). Pure, no Ansible imports.

Used on the managed host (llama_host_state's live read, the llama_bench module), so it stays importable at the
host's Python floor and cheap to import.
"""

from __future__ import annotations

import re

_METRIC_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfaINFA]+)(\s+-?\d+)?\s*$")


def parse_metrics(text: str) -> dict:
    """Prometheus text -> {name: value} (labelled samples keyed 'name{labels}'; a trailing timestamp ignored)."""
    out = {}
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _METRIC_RE.match(line)
        if not m:
            continue
        name = m.group(1) + (m.group(2) or "")
        try:
            out[name] = float(m.group(3))
        except ValueError:
            continue
    return out
