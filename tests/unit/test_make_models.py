"""Fast checks of the GGUF test-model generators (no llama-server).

The files are read back with gguf's GGUFReader and the greedy path of the built models is
recomputed with numpy from the stored tensors, the way llama.cpp's graph computes it when the
attention output and FFN down projections are zero.
"""

import json
import math
import re

import numpy as np
import pytest
from gguf import GGUFReader, TokenType
from gguf.constants import MODEL_ARCH, MODEL_ARCH_NAMES, MODEL_TENSORS, TENSOR_NAMES

from tests.harness.gguf import make_models as mm

EPS = 1e-5


def rms_norm(x):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS)


def tensors(path):
    return {t.name: np.array(t.data, dtype=np.float32) for t in GGUFReader(path).tensors}


def field(reader, key):
    return reader.fields[key].contents()


def top2(logits):
    order = np.argsort(-logits, axis=1)
    rows = np.arange(len(logits))
    return order[:, 0], logits[rows, order[:, 0]] - logits[rows, order[:, 1]]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return mm.write_all_small(tmp_path_factory.mktemp("small"))


def test_same_args_same_bytes_other_seed_other_bytes(tmp_path):
    a = mm.build_model("partial", tmp_path / "a", agree_fraction=0.6, split=2)
    b = mm.build_model("partial", tmp_path / "b", agree_fraction=0.6, split=2)
    c = mm.build_model("partial", tmp_path / "c", agree_fraction=0.6, split=2, seed=1)
    assert a.sha256 == b.sha256
    assert [p.read_bytes() for p in a.paths] == [p.read_bytes() for p in b.paths]
    assert set(a.sha256.values()).isdisjoint(c.sha256.values())
    assert a.sha256 == {p.name: mm.sha256_file(p) for p in a.paths}


def test_vocab_is_a_valid_spm_vocab(small):
    r = GGUFReader(small["tiny-agree"].path)
    tokens = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    assert field(r, "tokenizer.ggml.model") == "llama"
    assert len(tokens) == len(set(tokens)) == mm.MIN_VOCAB == len(types) == len(field(r, "tokenizer.ggml.scores"))
    assert tokens[mm.EOS_ID] == "</s>" and types[mm.EOS_ID] == TokenType.CONTROL
    assert tokens[mm.BOS_ID] == "<s>" and field(r, "tokenizer.ggml.bos_token_id") == mm.BOS_ID
    assert all(re.fullmatch(r"<0x[0-9A-F]{2}>", tokens[i]) for i in range(mm.BYTE_BASE, mm.TEXT_BASE))
    assert {types[i] for i in range(mm.BYTE_BASE, mm.TEXT_BASE)} == {TokenType.BYTE}
    assert [tokens[i] for i in mm.text_token_ids()] == mm.TEXT_PIECES
    padded, _, ptypes = mm.vocab(400)
    assert len(padded) == len(set(padded)) == 400 and ptypes[-1] == TokenType.UNUSED


@pytest.mark.parametrize("name", ["tiny-plain", "tiny-mtp", "tiny-agree", "tiny-partial", "tiny-agree-f16"])
def test_tensor_names_and_metadata_follow_llama_cpp(small, name):
    m = small[name]
    r = GGUFReader(m.path)
    arch = field(r, "general.architecture")
    n_blocks = field(r, f"{arch}.block_count")
    want_arch = MODEL_ARCH.LLAMA if m.spec.kind == "plain" else MODEL_ARCH.GLM4_MOE
    assert arch == MODEL_ARCH_NAMES[want_arch]
    allowed = {
        TENSOR_NAMES[t].format(bid=b) + suffix
        for t in MODEL_TENSORS[want_arch]
        for b in range(n_blocks)
        for suffix in (".weight", ".bias")
    }
    names = [t.name for t in r.tensors]
    assert len(names) == len(set(names)) and not set(names) - allowed
    if m.spec.kind == "plain":
        assert n_blocks == m.spec.n_layer and f"{arch}.nextn_predict_layers" not in r.fields
        assert not [n for n in names if "nextn" in n]
    else:
        assert n_blocks == m.spec.n_layer + 1
        assert field(r, f"{arch}.nextn_predict_layers") == 1
        assert field(r, f"{arch}.leading_dense_block_count") == m.spec.n_layer
        # the probe llama.cpp uses to recognise an embedded MTP head
        assert f"blk.{n_blocks - 1}.nextn.eh_proj.weight" in names
        assert not [n for n in names if "_exps" in n and not n.startswith(f"blk.{n_blocks - 1}.")]
    want_type = {"F32": 0, "F16": 1}[m.spec.dtype]
    assert {t.tensor_type for t in r.tensors if len(t.shape) > 1} == {want_type}
    assert {t.tensor_type for t in r.tensors if len(t.shape) == 1} == {0}


@pytest.mark.parametrize("name", ["tiny-plain", "tiny-mtp", "tiny-agree", "tiny-partial", "tiny-agree-f16"])
def test_main_model_greedily_follows_main_map(small, name):
    m = small[name]
    t = tensors(m.path)
    # the residual stream carries the embedding only when these projections are zero
    zeroed = [f"blk.{i}.{n}.weight" for i in range(m.spec.n_layer) for n in ("attn_output", "ffn_down")]
    assert all(not t[n].any() for n in zeroed)
    h = rms_norm(t["token_embd.weight"]) * t["output_norm.weight"]
    pred, margin = top2(h @ t["output.weight"].T)
    assert pred.tolist() == m.main_map
    assert margin.min() > 10.0  # greedy choice not decided by rounding
    text = m.text_tokens
    assert set(pred) <= set(text)  # BOS/EOS/UNK/bytes unreachable: completions run to n_predict
    # on the text tokens the map is one cycle through all of them
    seen, tok = [], text[0]
    for _ in text:
        seen.append(tok)
        tok = m.main_map[tok]
    assert tok == text[0] and sorted(seen) == text


def mtp_draft(t, block, tokens):
    """Greedy draft of the nextn block for input tokens, given zeroed hidden half and projections."""
    d = t["token_embd.weight"].shape[1]
    eh = t[f"blk.{block}.nextn.eh_proj.weight"]
    assert np.array_equal(eh[:, :d], np.eye(d)) and not eh[:, d:].any()
    for n in ("attn_output", "ffn_down_exps", "ffn_down_shexp"):
        assert not t[f"blk.{block}.{n}.weight"].any()
    e = rms_norm(t["token_embd.weight"][tokens]) * t[f"blk.{block}.nextn.enorm.weight"]
    x = rms_norm(e @ eh[:, :d].T) * t[f"blk.{block}.nextn.shared_head_norm.weight"]
    return top2(x @ t[f"blk.{block}.nextn.shared_head_head.weight"].T)


@pytest.mark.parametrize("name", ["tiny-agree", "tiny-agree-f16"])
def test_agree_head_drafts_what_the_main_model_generates(small, name):
    m = small[name]
    text = m.text_tokens
    draft, margin = mtp_draft(tensors(m.path), m.spec.n_layer, text)
    assert draft.tolist() == [m.main_map[x] for x in text] == [m.draft_map[x] for x in text]
    assert margin.min() > 10.0


@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.7, 0.9])
def test_partial_head_agrees_on_the_requested_fraction(tmp_path, fraction):
    m = mm.build_model("partial", tmp_path, agree_fraction=fraction)
    text = m.text_tokens
    draft, margin = mtp_draft(tensors(m.path), m.spec.n_layer, text)
    assert draft.tolist() == [m.draft_map[x] for x in text]
    assert sorted(draft.tolist()) == text  # a second permutation of the text tokens
    agree = [m.main_map[x] == m.draft_map[x] for x in text]
    assert sum(agree) == math.floor(len(text) * fraction + 1e-9)
    assert margin.min() > 10.0
    # spread along the cycle a completion walks: any 20 consecutive steps agree about as often
    walk, tok = [], text[0]
    for _ in range(2 * len(text)):
        walk.append(m.main_map[tok] == m.draft_map[tok])
        tok = m.main_map[tok]
    windows = [sum(walk[i : i + 20]) / 20 for i in range(len(text))]
    assert max(abs(w - fraction) for w in windows) <= 0.1


def test_mtp_kind_has_a_random_head(small):
    m = small["tiny-mtp"]
    t = tensors(m.path)
    b = m.spec.n_layer
    assert m.draft_map is None
    assert t[f"blk.{b}.nextn.eh_proj.weight"][:, m.spec.n_embd :].any()
    assert t[f"blk.{b}.ffn_down_exps.weight"].any()


@pytest.mark.parametrize(("name", "parts"), [("tiny-agree-split", 3), ("tiny-plain-split", 2)])
def test_split_parts_carry_llama_cpp_split_metadata(small, name, parts):
    m = small[name]
    assert [p.name for p in m.paths] == [f"{name}-{k:05d}-of-{parts:05d}.gguf" for k in range(1, parts + 1)]
    readers = [GGUFReader(p) for p in m.paths]
    total = sum(len(r.tensors) for r in readers)
    for k, r in enumerate(readers):
        assert field(r, "split.no") == k
        assert field(r, "split.count") == parts
        assert field(r, "split.tensors.count") == total
        assert len(r.tensors) >= 1
        assert ("general.architecture" in r.fields) == (k == 0)  # metadata in the first part
    # the parts hold exactly the tensors of the unsplit model of the same arguments
    whole = small[name.replace("-split", "")]
    joined = {}
    for p in m.paths:
        joined.update(tensors(p))
    ref = tensors(whole.path)
    assert list(joined) == list(ref)
    assert all(np.array_equal(joined[n], ref[n]) for n in ref)
    assert m.main_map == whole.main_map


def test_split_rewrite_removes_stale_parts(tmp_path):
    mm.build_model("agree", tmp_path, name="x", split=3)
    m = mm.build_model("agree", tmp_path, name="x", split=2)
    assert sorted(p.name for p in tmp_path.glob("x-*.gguf")) == [p.name for p in m.paths]


def test_size_knobs_shape_the_tensors(tmp_path):
    m = mm.build_model("agree", tmp_path, n_embd=128, n_layer=3, n_ff=320, n_head=2, dtype="F16", n_vocab=500)
    r = GGUFReader(m.path)
    shapes = {t.name: tuple(int(x) for x in t.shape) for t in r.tensors}  # ggml order: ne0 first
    assert shapes["token_embd.weight"] == (128, 500)
    assert shapes["blk.2.ffn_gate.weight"] == (128, 320)
    assert shapes["blk.3.nextn.eh_proj.weight"] == (256, 128)
    assert field(r, "glm4moe.block_count") == 4 and field(r, "glm4moe.attention.head_count") == 2
    f32 = mm.build_model("agree", tmp_path / "f32", n_embd=128, n_layer=3, n_ff=320, n_head=2, n_vocab=500)
    assert f32.size_bytes > 3 * mm.build_model("agree", tmp_path / "small").size_bytes
    assert 0.45 < m.size_bytes / f32.size_bytes < 0.55  # F16 halves the matrices
    t = tensors(m.path)
    pred, _ = top2(rms_norm(t["token_embd.weight"]) @ t["output.weight"].T)
    assert pred.tolist() == m.main_map


@pytest.mark.parametrize(
    ("kind", "args", "message"),
    [
        ("moe", {}, "unknown kind"),
        ("agree", {"dtype": "Q4_0"}, "use F32 or F16"),
        ("agree", {"n_embd": 60}, "multiple of 16"),
        ("agree", {"n_embd": 64, "n_head": 3}, "heads of even size"),
        ("agree", {"n_vocab": 100}, "at least 354"),
        ("partial", {"agree_fraction": 0.99}, "use kind 'agree'"),
        ("partial", {"agree_fraction": -0.1}, "agree_fraction must lie"),
        ("agree", {"split": 99}, "exceeds the model's"),
        ("agree", {"n_embed": 64}, "unknown model arguments: n_embed"),
    ],
)
def test_bad_arguments_fail_with_a_hint(tmp_path, kind, args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        mm.build_model(kind, tmp_path, **args)


def test_cli_prints_sha256sum_lines(tmp_path, capsys):
    assert mm.main(["--kind", "partial", "--out", str(tmp_path), "--split", "2", "--agree-fraction", "0.5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    for line in lines:
        digest, path = line.split("  ")
        assert re.fullmatch(r"[0-9a-f]{64}", digest) and digest == mm.sha256_file(path)
    assert lines[0].endswith("tiny-partial-00001-of-00002.gguf")


def test_cli_json_and_errors(tmp_path, capsys):
    assert mm.main(["--kind", "plain", "--out", str(tmp_path), "--name", "p", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc[0]["kind"] == "plain" and doc[0]["paths"] == [str(tmp_path / "p.gguf")]
    assert doc[0]["sha256"]["p.gguf"] == mm.sha256_file(tmp_path / "p.gguf")
    assert mm.main(["--kind", "partial", "--out", str(tmp_path), "--agree-fraction", "1"]) == 2
    assert "use kind 'agree'" in capsys.readouterr().err
