"""Controller-side tasks never become: with a play-level ``become: true`` (a fleet reached as an
unprivileged user with sudo), every task delegated to the controller must set ``become: false``, so that
files on the controller (artifact cache, bench results, the release file, autotune) belong to the user
who runs ansible-playbook and no sudo runs on the controller. Checked over every task file and playbook."""

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
FILES = sorted(
    p
    for d in ("roles", "playbooks")
    for p in (REPO / d).rglob("*.yml")
    if "meta" not in p.parts and "defaults" not in p.parts and "templates" not in p.parts
)


def _tasks(node):
    """Every task dict in a playbook or task file, blocks and rescue/always included."""
    if isinstance(node, list):
        for item in node:
            yield from _tasks(item)
    elif isinstance(node, dict):
        for key in ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always"):
            if key in node:
                yield from _tasks(node[key])
        if not any(k in node for k in ("tasks", "block", "hosts", "import_playbook")):
            yield node


def test_there_are_controller_side_tasks_to_check():
    delegated = [t for p in FILES for t in _tasks(yaml.safe_load(p.read_text())) if t.get("delegate_to") == "localhost"]
    assert len(delegated) >= 15


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_controller_side_tasks_never_become(path):
    bad = [
        t.get("name")
        for t in _tasks(yaml.safe_load(path.read_text()))
        if t.get("delegate_to") in ("localhost", "127.0.0.1") and t.get("become") is not False
    ]
    assert bad == [], f"{path.relative_to(REPO)}: set become: false on {bad}"
