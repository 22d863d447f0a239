"""model_files: sha256, sidecars, atomic adoption - on real files in tmp_path."""

from __future__ import annotations

import hashlib
import json
import os
import stat

import pytest
from ansible_collections.llamafleet.mtp.plugins.module_utils import model_files as mf


def _write(path, data: bytes) -> str:
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def test_names():
    assert mf.sidecar_path("/m/x.gguf") == "/m/x.gguf.verified.json"
    assert mf.partial_path("/m/x.gguf") == "/m/.x.gguf.partial"
    assert mf.incoming_path("/m/sub/x.gguf") == "/m/sub/.x.gguf.incoming"
    assert mf.check_file_name("Q8_0/x-00001-of-00002.gguf") is None
    for bad in ("", "/abs.gguf", "../x.gguf", "a//b.gguf", ".hidden.gguf", "a/./b", "x.gguf.verified.json"):
        assert mf.check_file_name(bad), bad


def test_check_file_hashes_once_then_trusts_the_sidecar(tmp_path):
    f = tmp_path / "m.gguf"
    digest = _write(f, b"GGUF" + b"\x01" * 1000)
    first = mf.check_file(str(f), digest, 1004)
    assert first["status"] == "ok" and first["hashed"] and first["changed"]
    side = json.loads((tmp_path / "m.gguf.verified.json").read_text())
    assert side["sha256"] == digest and side["size"] == 1004 and side["mtime_ns"] == f.stat().st_mtime_ns

    again = mf.check_file(str(f), digest, 1004)
    assert again == {**again, "status": "ok", "hashed": False, "changed": False, "sha256": digest}

    # Same size and mtime but other bytes: the quick check trusts the sidecar, a full check does not.
    st = f.stat()
    f.write_bytes(b"GGUF" + b"\x02" * 1000)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert mf.check_file(str(f), digest, 1004)["status"] == "ok"
    full = mf.check_file(str(f), digest, 1004, full=True)
    assert full["status"] == "stale" and full["hashed"]
    assert full["sha256"] == hashlib.sha256(b"GGUF" + b"\x02" * 1000).hexdigest()


def test_check_file_rehashes_when_mtime_changes(tmp_path):
    f = tmp_path / "m.gguf"
    digest = _write(f, b"abc")
    mf.check_file(str(f), digest)
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    res = mf.check_file(str(f), digest)
    assert res["status"] == "ok" and res["hashed"] and res["changed"]  # sidecar rewritten for the new mtime


def test_check_file_states(tmp_path):
    f = tmp_path / "m.gguf"
    assert mf.check_file(str(f))["status"] == "missing"
    digest = _write(f, b"abc")
    assert mf.check_file(str(f), expected_size=4)["status"] == "stale"
    res = mf.check_file(str(f), "0" * 64, write=False)
    assert res["status"] == "stale" and "expected" in res["reason"]
    assert not (tmp_path / "m.gguf.verified.json").exists()
    # A verified sidecar for other content: stale without hashing again.
    mf.check_file(str(f), digest)
    res = mf.check_file(str(f), "1" * 64)
    assert res["status"] == "stale" and not res["hashed"]
    # No expectation: whatever it hashes to is fine.
    assert mf.check_file(str(f))["status"] == "ok"


def test_corrupt_sidecar_is_rewritten(tmp_path):
    f = tmp_path / "m.gguf"
    digest = _write(f, b"abc")
    (tmp_path / "m.gguf.verified.json").write_text("{not json")
    res = mf.check_file(str(f), digest)
    assert res["status"] == "ok" and res["hashed"]
    assert json.loads((tmp_path / "m.gguf.verified.json").read_text())["sha256"] == digest


def test_sidecar_elsewhere(tmp_path):
    f = tmp_path / "src.gguf"
    digest = _write(f, b"xyz")
    side = tmp_path / "cache" / "src.json"
    side.parent.mkdir()
    mf.check_file(str(f), sidecar=str(side))
    assert json.loads(side.read_text())["sha256"] == digest
    assert not (tmp_path / "src.gguf.verified.json").exists()
    assert mf.check_file(str(f), sidecar=str(side))["hashed"] is False


def test_adopt_moves_verified_file_and_sets_mode(tmp_path):
    final = tmp_path / "m.gguf"
    inc = tmp_path / ".m.gguf.incoming"
    digest = _write(inc, b"new model")
    res = mf.adopt(str(inc), str(final), digest, 9, mode=0o640, source={"origin": "test"})
    assert res["status"] == "adopted" and final.read_bytes() == b"new model" and not inc.exists()
    assert stat.S_IMODE(final.stat().st_mode) == 0o640
    side = tmp_path / "m.gguf.verified.json"
    assert stat.S_IMODE(side.stat().st_mode) == 0o640
    assert json.loads(side.read_text())["source"] == {"origin": "test"}
    assert mf.check_file(str(final), digest)["hashed"] is False


def test_adopt_mismatch_deletes_temp_and_keeps_installed_file(tmp_path):
    final = tmp_path / "m.gguf"
    old = _write(final, b"old model")
    mf.check_file(str(final), old)
    before = (final.stat().st_mtime_ns, (tmp_path / "m.gguf.verified.json").read_text())
    inc = tmp_path / ".m.gguf.incoming"
    _write(inc, b"tampered!")
    extra = tmp_path / ".m.gguf.partial.json"
    extra.write_text("{}")
    with pytest.raises(mf.VerifyError) as e:
        mf.adopt(str(inc), str(final), "a" * 64, source={"origin": "org/repo@abc"}, cleanup=(str(extra),))
    msg = str(e.value)
    assert "sha256 mismatch" in msg and "a" * 64 in msg and "org/repo@abc" in msg and "left untouched" in msg
    assert not inc.exists() and not extra.exists()
    assert final.read_bytes() == b"old model"
    assert before == (final.stat().st_mtime_ns, (tmp_path / "m.gguf.verified.json").read_text())


def test_adopt_size_mismatch(tmp_path):
    inc = tmp_path / ".m.gguf.incoming"
    _write(inc, b"short")
    with pytest.raises(mf.VerifyError, match="size mismatch.*expected 10 bytes, got 5.*nothing was installed"):
        mf.adopt(str(inc), str(tmp_path / "m.gguf"), None, 10)
    assert not inc.exists()


def test_apply_owner_unknown_names(tmp_path):
    f = tmp_path / "x"
    f.write_text("x")
    with pytest.raises(mf.VerifyError, match="group 'no-such-group-llamafleet' does not exist"):
        mf.apply_owner(str(f), None, "no-such-group-llamafleet", None)
    with pytest.raises(mf.VerifyError, match="user 'no-such-user-llamafleet' does not exist"):
        mf.apply_owner(str(f), "no-such-user-llamafleet", None, None)
    assert mf.apply_owner(str(f), None, None, 0o600) is True
    assert mf.apply_owner(str(f), None, None, 0o600) is False


def test_disk_space_problem():
    gib = 1024**3
    assert mf.disk_space_problem(10 * gib, 20 * gib, gib, "/m") is None
    assert mf.disk_space_problem(0, 0, gib, "/m") is None
    msg = mf.disk_space_problem(16 * gib, 16 * gib, gib, "/var/lib/llama-models")
    assert "not enough disk space in /var/lib/llama-models" in msg and "16.00 GiB" in msg and "1.00 GiB" in msg


def test_gguf_heads_and_select():
    names = [
        "README.md",
        "mmproj-F16.gguf",
        "Q8_0/m-00002-of-00003.gguf",
        "Q8_0/m-00001-of-00003.gguf",
        "Q8_0/m-00003-of-00003.gguf",
        "m-Q4_K_M.gguf",
    ]
    assert mf.gguf_heads(names) == ["Q8_0/m-00001-of-00003.gguf", "m-Q4_K_M.gguf", "mmproj-F16.gguf"]
    assert mf.select_files(names, ["Q8_0/*-of-*.gguf"]) == [
        "Q8_0/m-00001-of-00003.gguf",
        "Q8_0/m-00002-of-00003.gguf",
        "Q8_0/m-00003-of-00003.gguf",
    ]
    assert mf.select_files(names, ["*.md", "*Q4_K_M*"]) == ["README.md", "m-Q4_K_M.gguf"]
    assert mf.select_files(names, ["nothing*"]) == []
