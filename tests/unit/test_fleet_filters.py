"""Filters the fleet playbooks use: autotune results and upgrade model substitution."""

import pytest
from ansible_collections.llamafleet.mtp.plugins.filter.llamafleet import (
    llamafleet_apply_autotune,
    llamafleet_upgrade_instances,
)

INSTANCES = [{"name": "qwen", "model": "m1"}, {"name": "pinned", "model": "m1", "draft_n_max": 2}]


def test_autotune_fills_only_unpinned_instances():
    out = llamafleet_apply_autotune(INSTANCES, {"qwen": 3, "pinned": 4, "other": 1})
    assert out == [{"name": "qwen", "model": "m1", "draft_n_max": 3}, INSTANCES[1]]
    assert "draft_n_max" not in INSTANCES[0]  # inputs untouched
    assert llamafleet_apply_autotune(INSTANCES, {"qwen": None}) == INSTANCES
    assert llamafleet_apply_autotune(INSTANCES, {}) == INSTANCES


def test_upgrade_points_named_instances_at_new_models():
    out = llamafleet_upgrade_instances(INSTANCES, {"qwen": "m2"})
    assert [i["model"] for i in out] == ["m2", "m1"]
    assert llamafleet_upgrade_instances(INSTANCES, {}) == INSTANCES
    with pytest.raises(ValueError, match="unknown instances"):
        llamafleet_upgrade_instances(INSTANCES, {"nope": "m2"})
