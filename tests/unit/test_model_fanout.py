"""plugins/module_utils/model_fanout.py: the fan-out schedule (who fetches which file from whom, per round)."""

from __future__ import annotations

import json
import math
import os
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


@pytest.mark.parametrize("n", [3, 4, 12, 50])
def test_a_file_nobody_holds_goes_out_in_pieces_one_per_receiver(n):
    needs = {f"h{i:03d}": ["m/a.gguf"] for i in range(n)}
    size = 256 * 1024 * 1024 + 7
    plan = mf.schedule(needs, {}, 1, {"m/a.gguf": size}, 3)
    pieces = plan["pieces"]["m/a.gguf"]["pieces"]
    assert [p["holder"] for p in pieces] == sorted(needs)  # one piece each
    assert pieces[0]["offset"] == 0 and sum(p["size"] for p in pieces) == size
    assert all(a["offset"] + a["size"] == b["offset"] for a, b in zip(pieces[:-1], pieces[1:]))  # noqa: B905
    assert plan["seed"] == {} and plan["rounds"] == [] and plan["left"] == {}
    assert plan["copies"] == {"controller": 1, "peer": n - 1}
    assert mf.describe(plan)[1] == f"round 1: {', '.join(sorted(needs))} <- each other's pieces (m/a.gguf)"


def test_pieces_only_for_orphans_with_enough_receivers_and_bytes():
    mib = 1024 * 1024
    sizes = {"m/a": 100 * mib, "m/b": 100 * mib, "m/tiny": mib + 1}
    needs = {"h1": ["m/a", "m/b", "m/tiny"], "h2": ["m/a", "m/b", "m/tiny"], "h3": ["m/a", "m/tiny"]}
    plan = mf.schedule(needs, {"m/b": ["old"]}, 1, sizes, 3)
    assert sorted(plan["pieces"]) == ["m/a"]  # b has a holder; tiny is too small for two whole-MiB pieces
    assert plan["seed"] == {"h1": ["m/tiny"]}
    assert mf.schedule(needs, {}, 1, sizes, 0)["pieces"] == {}  # 0: never
    assert mf.schedule(needs, {}, 1, sizes, 4)["pieces"] == {}  # fewer receivers than the minimum
    assert mf.piece_bounds(3 * mib, 12) == [
        {"index": i, "offset": i * mib, "size": mib} for i in range(3)
    ]  # no piece under PIECE_MIN_BYTES: fewer pieces than receivers
    assert mf.piece_bounds(0, 5) == [] and mf.piece_bounds(10 * mib, 1) == []


def test_fanout_plan_sends_each_receiver_its_piece_and_starts_each_gather_after_its_own():
    mib = 1024 * 1024
    miss = {h: [{"model": "m", "name": "sub/a.gguf", "path": "/models/m/sub/a.gguf", "sha256": SHA,
                 "size": 30 * mib, "via": "copy"}] for h in ("h1", "h2", "h3")}  # fmt: skip
    fan = mf.fanout_plan(miss, {}, {}, 1, 3)
    assert fan["seed_pieces"]["h2"] == [{"model": "m", "name": "sub/a.gguf", "index": 1, "offset": 10 * mib,
                                         "size": 10 * mib, "count": 3,
                                         "path": "/models/m/sub/.a.gguf.piece-1"}]  # fmt: skip
    entry = fan["rounds"][0]["h2"]
    assert [p["index"] for p in entry["pieces"]] == [2, 0, 1] and entry["sources"] == ["h1", "h3"]
    assert fan["exports"]["h1"] == [{"name": "m", "path": "/models/m"}]
    assert fan["connections"] == {"h1": 2, "h2": 2, "h3": 2} and fan["controller"] == {}
    assert mf.piece_name("sub/a.gguf", 1) == "sub/.a.gguf.piece-1"


def _fake_rsync(holders: dict, calls: list):
    """A stand-in for rsync (no daemon in a unit test): copies rsync://llamafleet@ADDR:PORT/MODEL/NAME from
    holders[ADDR] (a directory) to the destination; exit 23 when the file is not there."""
    import shutil as _sh

    def run_command(argv):
        url, dest = argv[-2], argv[-1]
        calls.append(url)
        addr, rest = url.split("@", 1)[1].split(":", 1)
        name = rest.split("/", 2)[2]
        src = os.path.join(holders[addr], name)
        if not os.path.exists(src):
            return 23, "", f'rsync: link_stat "{name}" failed'
        _sh.copyfile(src, dest)
        return 0, "", ""

    return run_command


def _gather_setup(tmp_path, corrupt=None):
    import hashlib

    from ansible_collections.llamafleet.mtp.plugins.modules import model_peer_fetch as mpf

    data = os.urandom(3 * 1024 * 1024 + 11)
    bounds = mf.piece_bounds(len(data), 3)
    holders, sums = {}, []
    for b in bounds:
        d = tmp_path / f"holder{b['index']}"
        d.mkdir()
        chunk = data[b["offset"] : b["offset"] + b["size"]]
        sums.append(hashlib.sha256(chunk).hexdigest())
        if b["index"] == corrupt:
            chunk = b"\xff" * len(chunk)
        (d / f".a.gguf.piece-{b['index']}").write_bytes(chunk)
        holders[f"10.0.0.{b['index']}"] = str(d)
    me = tmp_path / "me"
    me.mkdir()
    (me / ".a.gguf.piece-0").write_bytes(data[: bounds[0]["size"]])  # the piece the controller sent this host
    f = {"model": "m", "name": "a.gguf", "path": str(me / "a.gguf"), "sha256": hashlib.sha256(data).hexdigest(),
         "size": len(data), "sources": [{"host": f"h{i}", "address": f"10.0.0.{i}"} for i in (1, 2)],
         "pieces": [{**b, "holder": f"h{b['index']}"} for b in bounds], "piece_sha256": sums}  # fmt: skip
    p = {"port": 8873, "timeout": 5, "bwlimit_kib": 0, "min_rate_kib": 0, "piece_parallel": 4}
    return mpf, f, p, holders, me, data


class _Module:
    def __init__(self, run_command):
        self.run_command = run_command


def test_gather_puts_the_pieces_together_verifies_and_keeps_only_its_own_piece(tmp_path):
    mpf, f, p, holders, me, data = _gather_setup(tmp_path)
    calls = []
    out = mpf.gather_one(_Module(_fake_rsync(holders, calls)), f, p, {}, "/run/.pw")
    assert out["status"] == "adopted" and out["attempts"] == [] and out["pieces"] == 3, out
    assert (me / "a.gguf").read_bytes() == data
    assert sorted(x.name for x in me.iterdir()) == [".a.gguf.piece-0", "a.gguf", "a.gguf.verified.json"]
    assert len(calls) == 2 and out["bytes"] == len(data) - f["pieces"][0]["size"]
    assert out["source"] == "h1, h2 (pieces)"


def test_gather_refuses_a_corrupt_piece_and_adopts_nothing(tmp_path):
    mpf, f, p, holders, me, _ = _gather_setup(tmp_path, corrupt=2)
    out = mpf.gather_one(_Module(_fake_rsync(holders, [])), f, p, {}, "/run/.pw")
    assert out["status"] == "failed"
    assert out["attempts"] == [{"host": "h2", "error": "refused its copy: piece 3 does not match its sha256"}]
    assert not (me / "a.gguf").exists() and not (me / ".a.gguf.piece-2").exists()


def test_gather_resumes_keeping_the_regions_already_in_place(tmp_path):
    mpf, f, p, holders, me, data = _gather_setup(tmp_path)
    (me / ".a.gguf.incoming").write_bytes(data[: f["pieces"][1]["offset"] + f["pieces"][1]["size"]])
    calls = []
    out = mpf.gather_one(_Module(_fake_rsync(holders, calls)), f, p, {}, "/run/.pw")
    assert out["status"] == "adopted" and calls == ["rsync://llamafleet@10.0.0.2:8873/m/.a.gguf.piece-2"]
    assert (me / "a.gguf").read_bytes() == data


def test_peer_fetch_refuses_pieces_that_do_not_tile_the_file():
    from ansible_collections.llamafleet.mtp.plugins.modules import model_peer_fetch as mpf

    f = {"path": "/m/a", "size": 10, "pieces": [{"index": 0, "offset": 0, "size": 4, "holder": "h"},
                                                {"index": 1, "offset": 5, "size": 5, "holder": "h"}]}  # fmt: skip
    assert mpf.bad_pieces(f) == ["/m/a: the pieces do not tile the file at byte 4"]
    f["pieces"][1]["offset"] = 4
    assert mpf.bad_pieces(f) == ["/m/a: the pieces cover 9 bytes of 10"]


def test_model_split_cuts_hashes_and_reuses_its_pieces(tmp_path):
    import hashlib

    from ansible_collections.llamafleet.mtp.plugins.modules import model_split as ms

    src = tmp_path / "a.gguf"
    data = os.urandom(5 * 1024 * 1024 + 3)
    src.write_bytes(data)
    bounds = mf.piece_bounds(len(data), 3)
    p = {"src": str(src), "sha256": SHA, "dest": str(tmp_path / "pieces"), "pieces": bounds, "state": "present"}
    assert ms.problems_of(p) == []
    os.makedirs(p["dest"])
    sums = ms.cut(str(src), p["dest"], bounds)
    assert sums == [hashlib.sha256(data[b["offset"] : b["offset"] + b["size"]]).hexdigest() for b in bounds]
    want = ms.manifest_of(p)
    with open(os.path.join(p["dest"], "manifest.json"), "w") as fh:
        json.dump({**want, "sums": sums}, fh)
    assert ms.reusable(p["dest"], want) == sums
    assert ms.reusable(p["dest"], {**want, "sha256": "b" * 64}) is None  # another version: cut again
    assert ms.problems_of({**p, "pieces": bounds[:2]}) == [
        f"the pieces cover {bounds[2]['offset']} bytes of {len(data)}"
    ]
