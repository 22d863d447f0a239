"""plugins/modules/model_peer_fetch.py: gathering a file from its pieces (gather_one / gather_piece).

STAND-IN: rsync and the holders' shares. ``run_command`` here copies the piece from a directory per holder (what
the holder's rsync daemon would serve), appending to a shorter local copy as ``rsync --append-verify`` does; the
real rsync between real hosts runs in tests/integration/test_model_fanout.py. Everything else (the pieces' checks,
their placement, the resume, the whole file's verification and adoption) is the module's own code on real files.
"""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest
from ansible_collections.llamafleet.mtp.plugins.module_utils.model_fanout import piece_name
from ansible_collections.llamafleet.mtp.plugins.modules import model_peer_fetch as mpf

PIECE = 1000
P = {"port": 8873, "timeout": 5, "bwlimit_kib": 0, "min_rate_kib": 0, "piece_parallel": 4}


class FakeModule:
    """run_command for ``rsync ... rsync://llamafleet@ADDR:PORT/MODEL/NAME DEST``: ADDR is a holder's directory."""

    def __init__(self, shares: dict):
        self.shares, self.calls = shares, []

    def run_command(self, argv):
        url, dest = argv[-2], argv[-1]
        addr, rest = url.split("@", 1)[1].split(":", 1)
        rel = rest.split("/", 1)[1].split("/", 1)[1]  # past PORT/MODEL/
        self.calls.append((addr, rel))
        src = os.path.join(self.shares[addr], rel)
        if not os.path.exists(src):
            return 23, "", f'rsync: link_stat "{rel}" failed: No such file or directory (2)'
        have = os.path.getsize(dest) if os.path.exists(dest) else 0
        with open(src, "rb") as s, open(dest, "ab") as d:
            s.seek(have)
            shutil.copyfileobj(s, d)
        return 0, "", ""


@pytest.fixture
def fleet(tmp_path):
    """A 3-piece file: piece 0 was sent to this host (h1), pieces 1 and 2 to h2 and h3 (their share dirs)."""
    data = os.urandom(3 * PIECE - 17)
    cuts = [(i * PIECE, min(PIECE, len(data) - i * PIECE)) for i in range(3)]
    mine = tmp_path / "h1" / "m"
    mine.mkdir(parents=True)
    shares = {}
    for i, (off, size) in enumerate(cuts):
        where = mine if i == 0 else tmp_path / f"h{i + 1}"
        where.mkdir(parents=True, exist_ok=True)
        (where / piece_name("f.gguf", i)).write_bytes(data[off : off + size])
        if i:
            shares[f"10.0.0.{i + 1}"] = str(where)
    f = {
        "model": "m",
        "name": "f.gguf",
        "path": str(mine / "f.gguf"),
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "sources": [{"host": f"h{i}", "address": f"10.0.0.{i}"} for i in (2, 3)],
        "pieces": [
            {"index": i, "offset": off, "size": size, "holder": f"h{i + 1}"} for i, (off, size) in enumerate(cuts)
        ],
        "piece_sha256": [hashlib.sha256(data[o : o + s]).hexdigest() for o, s in cuts],
    }
    return {"data": data, "f": f, "mine": mine, "shares": shares, "root": tmp_path}


def gather(fleet, module=None):
    module = module or FakeModule(fleet["shares"])
    pw = fleet["root"] / "pw"
    pw.write_text("x")
    fs = {"owner": None, "group": None, "mode": None}
    return mpf.gather_one(module, fleet["f"], P, fs, str(pw)), module


def test_gather_adopts_the_file_and_keeps_only_its_own_piece(fleet):
    out, module = gather(fleet)
    assert out["status"] == "adopted", out
    assert out["source"] == "h2, h3 (pieces)" and out["bytes"] == len(fleet["data"]) - PIECE
    assert (fleet["mine"] / "f.gguf").read_bytes() == fleet["data"]
    left = sorted(p.name for p in fleet["mine"].iterdir() if "piece" in p.name or "incoming" in p.name)
    assert left == [".f.gguf.piece-0"]  # its peers may still gather it
    assert sorted(module.calls) == [("10.0.0.2", ".f.gguf.piece-1"), ("10.0.0.3", ".f.gguf.piece-2")]


def test_a_corrupt_piece_from_its_holder_is_refused_and_never_adopted(fleet):
    bad = fleet["root"] / "h3" / ".f.gguf.piece-2"
    raw = bytearray(bad.read_bytes())
    raw[5] ^= 0xFF
    bad.write_bytes(bytes(raw))
    out, _ = gather(fleet)
    assert out["status"] == "failed"
    assert out["attempts"] == [{"host": "h3", "error": "refused its copy: piece 3 does not match its sha256"}]
    assert not (fleet["mine"] / "f.gguf").exists()
    assert not (fleet["mine"] / ".f.gguf.piece-2").exists()  # the refused piece is not kept


def test_its_own_corrupt_piece_names_itself(fleet):
    own = fleet["mine"] / ".f.gguf.piece-0"
    own.write_bytes(b"\0" * own.stat().st_size)
    out, _ = gather(fleet)
    assert out["status"] == "failed"
    assert out["attempts"] == [
        {"host": "h1", "error": "piece 1: this host's copy does not match its sha256 and no other host holds it"}
    ]


def test_a_holder_that_is_not_serving(fleet):
    fleet["f"]["sources"] = fleet["f"]["sources"][:1]  # h3 did not start its share
    out, _ = gather(fleet)
    assert out["attempts"] == [{"host": "h3", "error": "piece 3: its holder h3 is not serving"}]


def test_an_interrupted_gather_resumes_and_refetches_only_what_is_missing(fleet):
    # As if interrupted: the temp name holds pieces 1 and 3; piece 2 had half arrived (300 bytes).
    data, final = fleet["data"], fleet["mine"] / "f.gguf"
    (fleet["mine"] / ".f.gguf.incoming").write_bytes(data[:PIECE] + b"\0" * PIECE + data[2 * PIECE :])
    (fleet["mine"] / ".f.gguf.piece-1").write_bytes(data[PIECE : PIECE + 300])
    out, module = gather(fleet)
    assert out["status"] == "adopted", out
    assert final.read_bytes() == data
    assert module.calls == [("10.0.0.2", ".f.gguf.piece-1")] and out["bytes"] == PIECE - 300


def test_a_whole_but_wrong_leftover_piece_is_fetched_again(fleet):
    (fleet["mine"] / ".f.gguf.piece-1").write_bytes(b"\1" * PIECE)
    out, module = gather(fleet)
    assert out["status"] == "adopted", out
    assert ("10.0.0.2", ".f.gguf.piece-1") in module.calls
