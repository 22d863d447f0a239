"""The gguf_info module run for real through ``ansible localhost -m llamafleet.mtp.gguf_info``.

Each case is a real ansible ad-hoc run (AnsiballZ packaging, module_utils import by collection
path, argument spec, JSON result) against real GGUF files written in tmp_path.
"""

from __future__ import annotations

import json
import os

import gguf
import numpy as np
import pytest
from ansible_collections.llamafleet.mtp.plugins.module_utils.gguf_header import gguf_info
from ansible_run import needs_ansible, run_module

from tests.harness.gguf import qwen36_27b_header as qwen

pytestmark = needs_ansible


@pytest.fixture(scope="module")
def qwen_file(tmp_path_factory):
    return qwen.write_qwen36_27b_header(tmp_path_factory.mktemp("mod") / "Qwen3.6-27B-Q4_K_M-mtp.gguf")


def test_module_reads_the_qwen_stand_in(qwen_file):
    result = run_module("gguf_info", f"path={qwen_file['path']}")
    assert result.get("failed") is not True, result
    assert result["changed"] is False
    g = result["gguf"]
    # the module returns exactly the pure function's summary (JSON round trip)
    assert g == json.loads(json.dumps(gguf_info(qwen_file["path"])))
    assert g["architecture"] == "qwen35"
    assert g["mtp"] is True and g["block_count"] == 65 and g["trunk_layers"] == 64
    assert g["kv_layers"] == [il for il in range(64) if (il + 1) % 4 == 0]
    assert g["size_bytes"] == os.path.getsize(qwen_file["path"])


def test_module_check_mode_and_split_part(tmp_path):
    # a 2-part split set written by the gguf package; the module is given the second part
    w = gguf.GGUFWriter(tmp_path / "m.gguf", "llama", split_max_tensors=2)
    w.add_block_count(1)
    w.add_embedding_length(32)
    w.add_head_count(2)
    w.add_context_length(128)
    w.add_feed_forward_length(64)
    for name in ("token_embd.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight", "output.weight"):
        w.add_tensor(name, np.zeros((48, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    parts = w.format_shard_names(tmp_path / "m.gguf")
    assert len(parts) == 2

    result = run_module("gguf_info", f"path={parts[1]}", check_mode=True)
    assert result.get("failed") is not True, result
    assert result["changed"] is False
    g = result["gguf"]
    assert g["split"] == {"count": 2, "paths": [str(p) for p in parts]}
    assert g["size_bytes"] == sum(p.stat().st_size for p in parts)
    assert g["tensor_count"] == 4
    assert g["vocab_size"] == 48


def test_module_fails_clearly_on_missing_file(tmp_path):
    missing = tmp_path / "nope.gguf"
    result = run_module("gguf_info", f"path={missing}")
    assert result["failed"] is True
    assert result["changed"] is False
    assert result["msg"].startswith(f"{missing}: no such file")


def test_module_fails_clearly_on_corrupt_and_truncated_files(tmp_path, qwen_file):
    bad = tmp_path / "model.gguf"
    bad.write_text("<html>404 Not Found</html>\n")
    result = run_module("gguf_info", f"path={bad}")
    assert result["failed"] is True
    assert "not a GGUF file: magic is '<htm'" in result["msg"]

    # an interrupted download: the first 4 MiB of the stand-in (inside its tokenizer arrays)
    cut = tmp_path / "partial.gguf"
    with open(qwen_file["path"], "rb") as src:
        cut.write_bytes(src.read(4 * 2**20))
    result = run_module("gguf_info", f"path={cut}")
    assert result["failed"] is True
    assert result["msg"].startswith(f"{cut}: file is truncated")
    assert "at byte offset" in result["msg"]
