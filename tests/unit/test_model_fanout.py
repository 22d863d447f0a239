"""plugins/module_utils/model_fanout.py: the fan-out schedule (who fetches which file from whom, per round)."""

from __future__ import annotations

import math
import random

import pytest
from ansible_collections.llamafleet.mtp.plugins.module_utils import model_fanout as mf

SHA = "a" * 64


def _check_invariants(needs, holders, concurrency, plan):
    """Every need met exactly once; a source holds the file before its round; a source serves at most
    `concurrency` and a receiver receives one file per round; the controller sends only orphans, once each."""
    held = {k: set(v) for k, v in holders.items()}
    for host, keys in plan["seed"].items():
        for k in keys:
            assert k in plan["controller_items"] and not holders.get(k)
            held.setdefault(k, set()).add(host)
    assert sorted(k for keys in plan["seed"].values() for k in keys) == sorted(plan["controller_items"])
    got = {(h, k) for h, keys in plan["seed"].items() for k in keys}
    for transfers in plan["rounds"]:
        served = {}
        for host, t in transfers.items():
            src = t["sources"][0]
            assert src in held[t["item"]] and src != host
            assert all(s in held[t["item"]] and s != host for s in t["sources"])
            served[src] = served.get(src, 0) + 1
            assert (host, t["item"]) not in got
            got.add((host, t["item"]))
        assert max(served.values()) <= concurrency
        for host, t in transfers.items():
            held[t["item"]].add(host)
    assert got == {(h, k) for h, keys in needs.items() for k in keys}


@pytest.mark.parametrize("n", [1, 2, 3, 6, 12, 50, 200])
def test_one_file_doubles_each_round_with_one_controller_copy(n):
    needs = {f"h{i:03d}": ["m/a.gguf"] for i in range(n)}
    plan = mf.schedule(needs, {}, 1)
    _check_invariants(needs, {}, 1, plan)
    assert plan["copies"] == {"controller": 1, "peer": n - 1}
    assert len(plan["rounds"]) == math.ceil(math.log2(n))


@pytest.mark.parametrize("concurrency", [1, 2, 3])
def test_random_fleets_keep_the_invariants(concurrency):
    rng = random.Random(concurrency)
    for _ in range(300):
        hosts = [f"h{i}" for i in range(rng.randint(1, 30))]
        items = [f"m{j}/f.gguf" for j in range(rng.randint(1, 3))]
        needs = {h: [k for k in items if rng.random() < 0.7] for h in hosts}
        others = [f"old{i}" for i in range(rng.randint(0, 3))]
        holders = {k: [o for o in others if rng.random() < 0.5] for k in items}
        holders.update(
            {k: v + [h for h in hosts if k not in needs[h] and rng.random() < 0.3] for k, v in holders.items()}
        )
        plan = mf.schedule(needs, holders, concurrency)
        _check_invariants(needs, holders, concurrency, plan)
        assert not plan["left"]


def test_holders_come_from_facts_with_the_same_sha256_and_size():
    items = {"m/a.gguf": {"model": "m", "name": "a.gguf", "sha256": SHA, "size": 10}}
    facts = {
        "good": {"m": {"files": [{"path": "/srv/m/a.gguf", "sha256": SHA, "size": 10}]}},
        "other-sha": {"m": {"files": [{"path": "/srv/m/a.gguf", "sha256": "b" * 64, "size": 10}]}},
        "other-size": {"m": {"files": [{"path": "/srv/m/a.gguf", "sha256": SHA, "size": 11}]}},
        "none": None,
    }
    assert mf.holders_from_facts(facts, items) == {"m/a.gguf": [{"host": "good", "dir": "/srv/m"}]}


def test_plan_leaves_unpinned_and_downloaded_files_to_their_source_and_exports_the_serving_dirs():
    def miss(name, via="copy", sha=SHA):
        return {"model": "m", "name": name, "path": f"/models/m/{name}", "sha256": sha, "size": 5, "via": via}

    missing = {"h1": [miss("a.gguf"), miss("b.gguf", sha=None), miss("c.gguf", via="get_url")],
               "h2": [miss("a.gguf")]}  # fmt: skip
    facts = {"old": {"m": {"files": [{"path": "/elsewhere/m/a.gguf", "sha256": SHA, "size": 5}]}}}
    plan = mf.fanout_plan(missing, {}, facts, 1)
    assert list(plan["items"]) == ["m/a.gguf"]
    assert plan["seed"] == {}
    assert plan["rounds"][0]["h1"]["sources"] == ["old"]
    assert plan["exports"]["old"] == [{"name": "m", "path": "/elsewhere/m"}]
    assert plan["lines"][0] == "round 1: h1 <- old (m/a.gguf)"
    with pytest.raises(ValueError):
        mf.schedule({"h": ["k"]}, {}, 0)
