"""Bytes of weights a decode step reads (gguf_header.decode_step_bytes, gguf_info's ``decode_bytes``).

Oracle: the ``gguf`` package's GGUFReader reads the same real files (written by the test-model
generator, tests/harness/gguf/make_models.py, and the Qwen3.6-27B header stand-in) and the rule is
written out here over its tensor list: trunk blocks whole (routed experts by used/count), output
norm and head whole, one row of token_embd; the MTP draft step reads the nextn block and, when the
block has no shared_head_head, the main output head.
"""

from __future__ import annotations

import gguf
import pytest
from ansible_collections.llamafleet.mtp.plugins.module_utils.gguf_header import decode_step_bytes, gguf_info

from tests.harness.gguf import make_models as mm
from tests.harness.gguf import qwen36_27b_header as qwen


def _reader_tensors(path):
    r = gguf.GGUFReader(path)
    return {t.name: (int(t.n_bytes), [int(x) for x in t.shape]) for t in r.tensors}


def _expected(tensors, n_layer, frac):
    token = mtp = 0
    own_head = False
    for name, (nbytes, _shape) in tensors.items():
        if name.startswith("blk."):
            layer = int(name.split(".")[1])
            b = round(nbytes * frac) if "_exps." in name else nbytes
            if layer < n_layer:
                token += b
            else:
                mtp += b
                own_head = own_head or name.endswith("shared_head_head.weight")
        elif name != "token_embd.weight":
            token += nbytes
    embd_bytes, embd_shape = tensors["token_embd.weight"]
    row = embd_bytes // embd_shape[1]
    head = tensors["output.weight"][0] if "output.weight" in tensors else embd_bytes
    if "output.weight" not in tensors:
        token += head
    return token + row, (mtp + row + (0 if own_head else head)) if mtp else 0


@pytest.mark.parametrize("kind", ["agree", "partial", "plain"])
def test_generated_models_match_the_rule_over_gguf_reader(tmp_path, kind):
    mf = mm.build_model(kind, tmp_path, n_embd=128, n_layer=3, n_expert=4, n_vocab=512, dtype="F16")
    info = gguf_info(mf.paths[0])
    tensors = _reader_tensors(mf.paths[0])
    frac = 0.25 if kind != "plain" else 1.0  # the generator routes 1 of n_expert experts
    token, mtp = _expected(tensors, 3, frac)
    assert info["decode_bytes"] == {"token": token, "mtp_draft": mtp, "expert_fraction": frac}
    # plain decode reads nearly the whole file but never the MTP block or the whole token_embd
    total = sum(b for b, _ in tensors.values())
    embd = tensors["token_embd.weight"][0]
    assert token < total - embd + embd // 512 + 1
    if kind == "plain":
        assert mtp == 0
        assert token == total - embd + embd // 512
    else:
        # the nextn block predicts with its own shared_head_head: the main output is not re-read
        assert mtp < info["tensor_bytes"]["mtp"] + embd // 512 + 1
        assert token + info["tensor_bytes"]["mtp"] > total - embd  # every block tensor counted once


def test_tied_head_reads_the_whole_token_embd(tmp_path):
    path = tmp_path / "tied.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_embedding_length(64)
    w.add_head_count(1)
    import numpy as np

    w.add_tensor("token_embd.weight", np.zeros((100, 64), dtype=np.float16))  # 100 rows of 64
    w.add_tensor("blk.0.attn_q.weight", np.zeros((64, 64), dtype=np.float16))
    w.add_tensor("output_norm.weight", np.ones(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    d = gguf_info(path)["decode_bytes"]
    assert d["token"] == 100 * 64 * 2 + 64 * 2 + 64 * 64 * 2 + 64 * 4
    assert d["mtp_draft"] == 0


def test_qwen36_27b_q4_k_m_stand_in(tmp_path):
    """The real Qwen3.6-27B Q4_K_M MTP tensor table: the MTP block has no shared_head_head, so a draft
    step reads the main output head too (about 0.84 GB of the draft step)."""
    f = qwen.write_qwen36_27b_header(tmp_path / "q.gguf")
    info = gguf_info(f["path"])
    tensors = {name: (nbytes, list(dims)) for name, dims, _t, nbytes in f["tensors"]}
    token, mtp = _expected(tensors, qwen.HPARAMS["n_layer"], 1.0)
    d = info["decode_bytes"]
    assert (d["token"], d["mtp_draft"]) == (token, mtp)
    assert d["mtp_draft"] > tensors["output.weight"][0] > 0
    # a decode step reads most of the 16.8 GB file, never the MTP block or the embedding table
    tb = info["tensor_bytes"]
    embd_row = tensors["token_embd.weight"][0] // tensors["token_embd.weight"][1][1]
    assert d["token"] == sum(b for b, _ in tensors.values()) - tb["mtp"] - tb["token_embd"] + embd_row


def test_moe_fraction_and_embed_tokens_row():
    from ansible_collections.llamafleet.mtp.plugins.module_utils.gguf_header import TensorInfo

    def t(name, dims, nbytes):
        return TensorInfo(name=name, dims=tuple(dims), ggml_type=1, offset=0, n_bytes=nbytes)

    tensors = [
        t("token_embd.weight", (8, 10), 160),
        t("output.weight", (8, 10), 160),
        t("blk.0.ffn_up_exps.weight", (8, 4, 8), 800),
        t("blk.0.ffn_up_shexp.weight", (8, 4), 64),
        t("blk.1.ffn_gate_up_exps.weight", (8, 8, 8), 1600),
        t("blk.1.nextn.embed_tokens.weight", (8, 10), 160),
    ]
    d = decode_step_bytes(tensors, n_layer=1, n_layer_all=2, n_expert=8, n_expert_used=2)
    assert d == {"token": 200 + 64 + 160 + 16, "mtp_draft": 400 + 16 + 16 + 160, "expert_fraction": 0.25}
