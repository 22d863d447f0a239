"""Render the role llama_monitoring's templates as the role does, for promtool (tests/unit/test_monitoring_rules.py).

The templates use only plain Jinja2 and ``to_json``; the thresholds are the role's built-ins (vars/main.yml)
combined with overrides, and the baselines come from example targets.
"""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import yaml

ROLE = Path(__file__).resolve().parents[2] / "roles" / "llama_monitoring"


def thresholds(overrides=None):
    data = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    return dict(data["__llama_monitoring_alert_defaults"], **(overrides or {}))


# Example llama hosts as the last run left them (hosts.yml: llamafleet:host_as_declared).
HOSTS = {
    "h1": {"as_declared": 1, "reason": ""},
    "h2": {"as_declared": 0, "reason": "its converge failed (a serving host was rolled back)"},
}


def render(template: str, targets=(), overrides=None, backend="llama", hosts=None, **context) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(ROLE / "templates")), undefined=jinja2.StrictUndefined, trim_blocks=True
    )  # as Ansible
    env.filters["to_json"] = json.dumps
    return env.get_template(template).render(
        ansible_managed="rendered by tests/prometheus/render.py",
        llama_monitoring_gateway_backend=backend,
        __llama_monitoring_thresholds=thresholds(overrides),
        __llama_monitoring_targets=list(targets),
        __llama_monitoring_hosts=dict(HOSTS if hosts is None else hosts),
        **context,
    )


def write_rules(directory: Path, targets=(), overrides=None, hosts=None) -> list:
    """llamafleet.yml, baselines.yml and hosts.yml in ``directory``, as the role writes them into rules/."""
    out = []
    files = (
        ("rules/llamafleet.rules.yml.j2", "llamafleet.yml"),
        ("baselines.rules.yml.j2", "baselines.yml"),
        ("hosts.rules.yml.j2", "hosts.yml"),
    )
    for src, dest in files:
        path = Path(directory) / dest
        path.write_text(render(src, targets, overrides, hosts=hosts))
        out.append(path)
    return out
