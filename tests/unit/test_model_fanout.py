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


def test_share_config_serves_read_only_to_one_user_and_hides_temp_files():
    from ansible_collections.llamafleet.mtp.plugins.modules import model_share

    text = model_share.config_text([{"name": "m", "path": "/models/m"}], "10.0.0.5", 8873, "llama-server", 2)
    conf = dict(line.split(" = ", 1) for line in text.splitlines() if " = " in line)
    assert conf["read only"] == "yes" and conf["list"] == "no" and conf["auth users"] == "llamafleet"
    assert conf["exclude"] == ".*" and conf["address"] == "10.0.0.5" and conf["max connections"] == "2"
    assert conf["uid"] == "nobody" and conf["gid"] == "llama-server" and conf["strict modes"] == "yes"
    assert "[m]\npath = /models/m" in text
    p = {"state": "present", "secret": "", "exports": [{"name": "a/b", "path": "rel"}], "port": 0,
         "max_connections": 0, "lifetime": 1}  # fmt: skip
    assert len(model_share.problems_of(p, True)) == 5  # every problem at once


def test_peer_fetch_never_puts_the_token_in_argv():
    from ansible_collections.llamafleet.mtp.plugins.modules import model_peer_fetch as mpf

    p = {"timeout": 30, "bwlimit_kib": 1024, "min_rate_kib": 512}
    url = mpf.source_url("fd00::5", 8873, "m", "a.gguf")
    assert url == "rsync://llamafleet@[fd00::5]:8873/m/a.gguf"
    argv = mpf.rsync_argv(url, "/models/m/.a.gguf.incoming", "/run/.pw", p)
    assert "--password-file=/run/.pw" in argv and "--bwlimit=1024" in argv and argv[-2:] == [url, argv[-1]]
    assert mpf.deadline_of(512 * 1024 * 100, p) == 130.0
    assert mpf.deadline_of(None, p) is None


def test_a_peer_slower_than_the_minimum_rate_is_given_up():
    import subprocess

    from ansible_collections.llamafleet.mtp.plugins.modules import model_peer_fetch as mpf

    def run_command(argv):
        res = subprocess.run(argv, capture_output=True, text=True, check=False)
        return res.returncode, res.stdout, res.stderr

    assert mpf.run_rsync(run_command, ["sleep", "5"], 0.6).startswith("slower than the minimum rate")
    assert mpf.run_rsync(run_command, ["true"], 5) is None
    assert mpf.run_rsync(run_command, ["sh", "-c", "echo 'auth failed on module m' >&2; exit 5"], None) == (
        "the share refused the token: auth failed on module m"
    )
