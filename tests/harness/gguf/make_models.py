#!/usr/bin/env python3
"""Generators for small, servable GGUF test models (test harness, not product code).

Hugging Face is out of reach on the test machines, so the tests serve models written here with
the ``gguf`` package's GGUFWriter (the writer llama.cpp's own converters use). The models load
and run in a real llama-server; their weights are built, not trained, so that what the server
does with them is known in advance:

* the main model maps token ``t`` to ``main_map[t]`` whatever the context: every attention
  output and FFN down projection is zero (real tensors, still multiplied at decode time), so the
  residual stream carries the token embedding, and the output matrix is built so that
  ``argmax(output . rms_norm(embd[t])) == main_map[t]``;
* ``main_map`` is a single cycle over the *text* tokens (printable ASCII and the SPM space
  "\u2581"), and sends every other token (control, byte) into that cycle, so BOS/EOS/UNK are never
  generated and a completion always runs to ``n_predict``;
* the MTP (nextn) block of the ``agree`` and ``partial`` kinds passes the embedding half of its
  input through ``eh_proj`` (the hidden half gets zero weights), zeroes its own attention output
  and expert down projections, and predicts with its ``shared_head_head``: for ``agree`` that is
  the main output matrix (draft acceptance 1.0 at temperature 0), for ``partial`` a second
  permutation ``draft_map`` that equals ``main_map`` on a chosen fraction of the text tokens.

Kinds:
  plain    llama architecture, no MTP layers (llama-server refuses ``--spec-type draft-mtp``)
  mtp      glm4moe with one nextn block of random weights (serves with draft-mtp, drafts mostly rejected)
  agree    glm4moe, MTP head reproduces the main model (acceptance 1.0)
  partial  glm4moe, MTP head agrees on ``agree_fraction`` of the text tokens
Any kind can be written as a multi-part split GGUF (``--split N``), which llama-server loads from
its first part.

The trunk layers of the glm4moe models are all dense (``leading_dense_block_count = n_layer``);
the nextn block is always MoE in llama.cpp's glm4moe graph, so it has ``n_expert`` (default 2)
small routed experts, one used per token, plus one shared expert.

Same arguments give the same bytes (seeded numpy RNG, fixed tensor and key order).

CLI:  python3 tests/harness/gguf/make_models.py --kind agree --out DIR [--n-embd 1024 --n-layer 6]
      [--dtype F16] [--split 3] [--agree-fraction 0.7]        (prints "sha256  path" per file)
      python3 tests/harness/gguf/make_models.py --kind all-small --out DIR
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, LlamaFileType, TokenType
from gguf.constants import ExpertGatingFuncType

KINDS = ("plain", "mtp", "agree", "partial")
MTP_KINDS = ("mtp", "agree", "partial")
DTYPES = {"F32": np.float32, "F16": np.float16}

# Vocabulary layout (SentencePiece "llama" tokenizer with byte fallback).
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
BYTE_BASE = 3  # <0x00> .. <0xFF> are ids 3 .. 258
SPM_SPACE = "\u2581"
TEXT_PIECES = [SPM_SPACE] + [chr(c) for c in range(0x21, 0x7F)]  # 95 pieces
TEXT_BASE = BYTE_BASE + 256
MIN_VOCAB = TEXT_BASE + len(TEXT_PIECES)  # 354

# Logit gap between the intended token and the runner-up, in nats: large enough that sampling at
# the server's default temperature still picks the intended token practically always.
LOGIT_MARGIN = 24.0


@dataclass(frozen=True)
class ModelSpec:
    """Everything that determines a model's bytes."""

    kind: str
    n_embd: int = 64
    n_layer: int = 2
    n_ff: int | None = None  # default 4 * n_embd
    n_head: int | None = None  # default n_embd // 64 (at least 1)
    n_head_kv: int | None = None  # default n_head
    n_vocab: int = MIN_VOCAB
    dtype: str = "F32"
    agree_fraction: float = 0.7  # partial only
    n_expert: int = 2  # nextn block (glm4moe) only
    n_ff_exp: int | None = None  # default max(16, n_ff // 4)
    n_ctx_train: int = 4096
    seed: int = 0

    def resolved(self) -> ModelSpec:
        """Fill the derived defaults and check the arguments; raises ValueError with a hint."""
        if self.kind not in KINDS:
            raise ValueError(f"unknown kind {self.kind!r}: use one of {', '.join(KINDS)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}: use F32 or F16")
        if self.n_embd < 16 or self.n_embd % 16:
            raise ValueError(f"n_embd must be a multiple of 16 and at least 16, got {self.n_embd}")
        if self.n_layer < 1:
            raise ValueError(f"n_layer must be at least 1, got {self.n_layer}")
        n_head = self.n_head or max(1, self.n_embd // 64)
        if self.n_embd % n_head or (self.n_embd // n_head) % 2:
            raise ValueError(f"n_embd ({self.n_embd}) must split into n_head ({n_head}) heads of even size")
        n_head_kv = self.n_head_kv or n_head
        if n_head % n_head_kv:
            raise ValueError(f"n_head ({n_head}) must be a multiple of n_head_kv ({n_head_kv})")
        n_ff = self.n_ff or 4 * self.n_embd
        if n_ff < 1:
            raise ValueError(f"n_ff must be positive, got {n_ff}")
        if self.n_vocab < MIN_VOCAB:
            raise ValueError(f"n_vocab must be at least {MIN_VOCAB} (specials, 256 bytes, 95 text pieces)")
        if self.n_expert < 1:
            raise ValueError(f"n_expert must be at least 1, got {self.n_expert}")
        n_ff_exp = self.n_ff_exp or max(16, n_ff // 4)
        if self.kind == "partial":
            n_agree = agreeing_count(self.agree_fraction)
            if not 0.0 <= self.agree_fraction <= 1.0 or len(TEXT_PIECES) - n_agree < 2:
                raise ValueError(
                    f"agree_fraction must lie in [0, {1 - 2 / len(TEXT_PIECES):.3f}] so that at least two text "
                    f"tokens disagree, got {self.agree_fraction}; use kind 'agree' for full agreement"
                )
        return ModelSpec(
            kind=self.kind,
            n_embd=self.n_embd,
            n_layer=self.n_layer,
            n_ff=n_ff,
            n_head=n_head,
            n_head_kv=n_head_kv,
            n_vocab=self.n_vocab,
            dtype=self.dtype,
            agree_fraction=self.agree_fraction,
            n_expert=self.n_expert,
            n_ff_exp=n_ff_exp,
            n_ctx_train=self.n_ctx_train,
            seed=self.seed,
        )


@dataclass
class ModelFiles:
    """What a generator wrote: the files (first part first), their sha256 and the built maps."""

    name: str
    spec: ModelSpec
    paths: list[Path]
    sha256: dict[str, str]  # file name -> hex digest
    size_bytes: int
    main_map: list[int]  # greedy next token of the main model, per token id
    draft_map: list[int] | None = None  # greedy draft of the MTP head (agree / partial)
    text_tokens: list[int] = field(default_factory=list)

    @property
    def path(self) -> Path:
        """The file to give llama-server (the first part of a split model)."""
        return self.paths[0]

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "kind": self.spec.kind,
            "spec": asdict(self.spec),
            "paths": [str(p) for p in self.paths],
            "sha256": self.sha256,
            "size_bytes": self.size_bytes,
        }


def agreeing_count(agree_fraction: float) -> int:
    return int(math.floor(len(TEXT_PIECES) * agree_fraction + 1e-9))


def vocab(n_vocab: int = MIN_VOCAB) -> tuple[list[str], list[float], list[int]]:
    """SPM vocabulary: <unk> <s> </s>, 256 byte tokens, the 95 text pieces, then unused fillers."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list(TEXT_PIECES)
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    types += [TokenType.NORMAL] * len(TEXT_PIECES)
    scores = [0.0] * TEXT_BASE + [-float(i) for i in range(len(TEXT_PIECES))]
    for i in range(len(tokens), n_vocab):
        tokens.append(f"<unused{i}>")
        types.append(TokenType.UNUSED)
        scores.append(0.0)
    return tokens, scores, [int(t) for t in types]


def text_token_ids() -> list[int]:
    return list(range(TEXT_BASE, TEXT_BASE + len(TEXT_PIECES)))


def build_maps(spec: ModelSpec, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """main_map (a single cycle on the text tokens, everything else sent into it), the draft map
    of the MTP head (None for plain/mtp) and the cycle order of the text tokens."""
    text = np.array(text_token_ids())
    cycle = text[rng.permutation(len(text))]
    main_map = np.empty(spec.n_vocab, dtype=np.int64)
    main_map[cycle] = np.roll(cycle, -1)
    others = np.setdiff1d(np.arange(spec.n_vocab), text)
    main_map[others] = cycle[rng.integers(0, len(cycle), size=len(others))]
    if spec.kind == "agree":
        return main_map, main_map.copy(), cycle
    if spec.kind != "partial":
        return main_map, None, cycle
    # Agreeing tokens spread evenly along the cycle, which is the order a completion visits them.
    n = len(cycle)
    f = spec.agree_fraction
    agree = np.array([math.floor((i + 1) * f + 1e-9) > math.floor(i * f + 1e-9) for i in range(n)])
    draft_map = main_map.copy()
    bad = cycle[~agree]  # shift the main targets of the disagreeing tokens by one: a derangement
    draft_map[bad] = main_map[np.roll(bad, -1)]
    return main_map, draft_map, cycle


def _unit_rows(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    v = rng.standard_normal((n, d))
    return v / np.linalg.norm(v, axis=1, keepdims=True)


class _Builder:
    def __init__(self, spec: ModelSpec):
        self.spec = spec
        self.rng = np.random.default_rng(spec.seed)
        self.wdtype = DTYPES[spec.dtype]
        self.tensors: list[tuple[str, np.ndarray]] = []

    def add(self, name: str, arr: np.ndarray, keep_f32: bool = False) -> None:
        self.tensors.append((name, np.ascontiguousarray(arr, dtype=np.float32 if keep_f32 else self.wdtype)))

    def rand(self, *shape: int, std: float) -> np.ndarray:
        return self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    def ones(self, n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    def zeros(self, *shape: int) -> np.ndarray:
        return np.zeros(shape, dtype=np.float32)


def _attention(b: _Builder, i: int, *, zero_out: bool) -> None:
    s = b.spec
    d, hd = s.n_embd, s.n_embd // s.n_head
    b.add(f"blk.{i}.attn_norm.weight", b.ones(d), keep_f32=True)
    b.add(f"blk.{i}.attn_q.weight", b.rand(s.n_head * hd, d, std=0.02))
    b.add(f"blk.{i}.attn_k.weight", b.rand(s.n_head_kv * hd, d, std=0.02))
    b.add(f"blk.{i}.attn_v.weight", b.rand(s.n_head_kv * hd, d, std=0.02))
    wo = b.zeros(d, s.n_head * hd) if zero_out else b.rand(d, s.n_head * hd, std=0.02)
    b.add(f"blk.{i}.attn_output.weight", wo)


def _dense_ffn(b: _Builder, i: int) -> None:
    s = b.spec
    b.add(f"blk.{i}.ffn_gate.weight", b.rand(s.n_ff, s.n_embd, std=0.02))
    b.add(f"blk.{i}.ffn_up.weight", b.rand(s.n_ff, s.n_embd, std=0.02))
    b.add(f"blk.{i}.ffn_down.weight", b.zeros(s.n_embd, s.n_ff))


def _build_tensors(spec: ModelSpec) -> tuple[_Builder, np.ndarray, np.ndarray | None, np.ndarray]:
    b = _Builder(spec)
    d = spec.n_embd
    main_map, draft_map, cycle = build_maps(spec, b.rng)
    text = np.array(text_token_ids())

    # One unit code per text token; embd[t] = sqrt(d) * code[main_map[t]] (RMS 1), and the output
    # row of a text token j is scale * code[j]: rms_norm(embd[t]) . row_j = scale * d^0.5 * cos.
    codes = np.zeros((spec.n_vocab, d))
    codes[text] = _unit_rows(b.rng, len(text), d)
    gram = codes[text] @ codes[text].T
    np.fill_diagonal(gram, -1.0)
    max_cos = float(gram.max())
    scale = LOGIT_MARGIN / (math.sqrt(d) * (1.0 - max_cos))
    embd = math.sqrt(d) * codes[main_map]
    output = np.zeros((spec.n_vocab, d))
    output[text] = scale * codes[text]

    b.add("token_embd.weight", embd)
    b.add("output_norm.weight", b.ones(d), keep_f32=True)
    b.add("output.weight", output)

    for i in range(spec.n_layer):
        _attention(b, i, zero_out=True)
        if spec.kind == "plain":
            b.add(f"blk.{i}.ffn_norm.weight", b.ones(d), keep_f32=True)
        else:
            b.add(f"blk.{i}.post_attention_norm.weight", b.ones(d), keep_f32=True)
        _dense_ffn(b, i)

    if spec.kind == "plain":
        return b, main_map, draft_map, cycle

    # The nextn (MTP) block, blk.{n_layer}.
    i = spec.n_layer
    built = spec.kind != "mtp"  # agree / partial: constructed; mtp: random weights
    fe, ne = spec.n_ff_exp, spec.n_expert
    eh = np.concatenate([np.eye(d), np.zeros((d, d))], axis=1) if built else b.rand(d, 2 * d, std=0.02)
    b.add(f"blk.{i}.nextn.eh_proj.weight", eh)
    b.add(f"blk.{i}.nextn.enorm.weight", b.ones(d), keep_f32=True)
    b.add(f"blk.{i}.nextn.hnorm.weight", b.ones(d), keep_f32=True)
    _attention(b, i, zero_out=built)
    b.add(f"blk.{i}.post_attention_norm.weight", b.ones(d), keep_f32=True)
    b.add(f"blk.{i}.ffn_gate_inp.weight", b.rand(ne, d, std=0.02))
    b.add(f"blk.{i}.exp_probs_b.bias", b.zeros(ne), keep_f32=True)
    b.add(f"blk.{i}.ffn_gate_exps.weight", b.rand(ne, fe, d, std=0.02))
    b.add(f"blk.{i}.ffn_up_exps.weight", b.rand(ne, fe, d, std=0.02))
    b.add(f"blk.{i}.ffn_down_exps.weight", b.zeros(ne, d, fe) if built else b.rand(ne, d, fe, std=0.02))
    b.add(f"blk.{i}.ffn_gate_shexp.weight", b.rand(fe, d, std=0.02))
    b.add(f"blk.{i}.ffn_up_shexp.weight", b.rand(fe, d, std=0.02))
    b.add(f"blk.{i}.ffn_down_shexp.weight", b.zeros(d, fe) if built else b.rand(d, fe, std=0.02))
    b.add(f"blk.{i}.nextn.shared_head_norm.weight", b.ones(d), keep_f32=True)
    if built:
        # MTP input for draft token x is rms_norm(embd[x]) ~ code[main_map[x]]; the head row of the
        # wanted draft draft_map[x] must be that code: head[draft_map[x]] = scale * code[main_map[x]].
        head = np.zeros((spec.n_vocab, d))
        head[draft_map[text]] = scale * codes[main_map[text]]
    else:
        head = b.rand(spec.n_vocab, d, std=0.02)
    b.add(f"blk.{i}.nextn.shared_head_head.weight", head)
    return b, main_map, draft_map, cycle


def _add_metadata(w: GGUFWriter, spec: ModelSpec, name: str) -> None:
    w.add_name(name)
    w.add_file_type(LlamaFileType.ALL_F32 if spec.dtype == "F32" else LlamaFileType.MOSTLY_F16)
    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(spec.n_embd)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(spec.n_embd // spec.n_head)
    w.add_vocab_size(spec.n_vocab)
    if spec.kind == "plain":
        w.add_block_count(spec.n_layer)
    else:
        w.add_block_count(spec.n_layer + 1)  # block_count includes the nextn block
        w.add_nextn_predict_layers(1)
        w.add_leading_dense_block_count(spec.n_layer)  # all trunk layers dense
        w.add_expert_count(spec.n_expert)
        w.add_expert_used_count(1)
        w.add_expert_shared_count(1)
        w.add_expert_feed_forward_length(spec.n_ff_exp)
        w.add_expert_weights_scale(1.0)
        w.add_expert_weights_norm(True)
        w.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
    tokens, scores, types = vocab(spec.n_vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(UNK_ID)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def split_part_names(name: str, n: int) -> list[str]:
    """llama.cpp's split naming (llama_split_path / gguf-split): <name>-00001-of-0000N.gguf."""
    if n <= 1:
        return [f"{name}.gguf"]
    return [f"{name}-{k:05d}-of-{n:05d}.gguf" for k in range(1, n + 1)]


def build_model(
    kind: str,
    out_dir: str | Path,
    *,
    name: str | None = None,
    split: int = 1,
    **spec_args,
) -> ModelFiles:
    """Write one model into out_dir and return its files, sha256s and the built token maps.

    spec_args are ModelSpec fields (n_embd, n_layer, n_ff, n_head, n_head_kv, n_vocab, dtype,
    agree_fraction, n_expert, n_ff_exp, n_ctx_train, seed). split > 1 writes a split GGUF of exactly
    that many parts (tensors spread evenly by count; the metadata lives in the first part,
    every part carries split.no / split.count / split.tensors.count).
    """
    unknown = set(spec_args) - set(ModelSpec.__dataclass_fields__)
    if unknown:
        raise ValueError(f"unknown model arguments: {', '.join(sorted(unknown))}")
    spec = ModelSpec(kind=kind, **spec_args).resolved()
    name = name or f"tiny-{kind}"
    if split < 1:
        raise ValueError(f"split must be at least 1, got {split}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    b, main_map, draft_map, _cycle = _build_tensors(spec)
    if split > len(b.tensors):
        raise ValueError(f"split {split} exceeds the model's {len(b.tensors)} tensors")
    arch = "llama" if kind == "plain" else "glm4moe"
    names = split_part_names(name, split)
    for stale in out.glob(f"{name}-*-of-*.gguf"):
        stale.unlink()

    w = GGUFWriter(out / f"{name}.gguf", arch)
    _add_metadata(w, spec, name)
    # Part k starts at tensor starts[k]: GGUFWriter opens a new part when a part already holds
    # split_max_tensors tensors, so set that limit to 1 exactly where a new part must begin.
    starts = {int(x[0]) for x in np.array_split(np.arange(len(b.tensors)), split)[1:]}
    for idx, (tname, arr) in enumerate(b.tensors):
        w.split_max_tensors = 1 if idx in starts else 0
        w.add_tensor(tname, arr)
    w.split_max_tensors = 0
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    paths = [out / n for n in names]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise RuntimeError(f"GGUFWriter did not write the expected parts: {', '.join(missing)}")
    return ModelFiles(
        name=name,
        spec=spec,
        paths=paths,
        sha256={p.name: sha256_file(p) for p in paths},
        size_bytes=sum(p.stat().st_size for p in paths),
        main_map=[int(x) for x in main_map],
        draft_map=None if draft_map is None else [int(x) for x in draft_map],
        text_tokens=text_token_ids(),
    )


SMALL_SET = {
    "tiny-plain": {"kind": "plain"},
    "tiny-mtp": {"kind": "mtp"},
    "tiny-agree": {"kind": "agree"},
    "tiny-partial": {"kind": "partial", "agree_fraction": 0.7},
    "tiny-agree-f16": {"kind": "agree", "dtype": "F16"},
    "tiny-agree-split": {"kind": "agree", "split": 3},
    "tiny-plain-split": {"kind": "plain", "split": 2},
}


def write_all_small(out_dir: str | Path) -> dict[str, ModelFiles]:
    """Write the small set (plain, mtp, agree, partial, an F16 agree and split variants) into
    out_dir; returns name -> ModelFiles. Each model is about 1 MB or less."""
    result = {}
    for name, args in SMALL_SET.items():
        args = dict(args)
        result[name] = build_model(args.pop("kind"), out_dir, name=name, **args)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--kind", required=True, choices=[*KINDS, "all-small"])
    p.add_argument("--out", required=True, type=Path, help="output directory (created if missing)")
    p.add_argument("--name", help="file name stem (default tiny-<kind>)")
    p.add_argument("--n-embd", type=int, default=64)
    p.add_argument("--n-layer", type=int, default=2, help="trunk layers (the nextn block comes on top)")
    p.add_argument("--n-ff", type=int, help="dense FFN width (default 4 * n_embd)")
    p.add_argument("--n-head", type=int, help="attention heads (default n_embd // 64)")
    p.add_argument("--n-head-kv", type=int)
    p.add_argument("--n-vocab", type=int, default=MIN_VOCAB)
    p.add_argument("--n-expert", type=int, default=2, help="routed experts of the nextn block")
    p.add_argument("--n-ff-exp", type=int, help="expert FFN width (default max(16, n_ff // 4))")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="F32")
    p.add_argument(
        "--agree-fraction", type=float, default=0.7, help="partial: share of text tokens the MTP head gets right"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", type=int, default=1, help="write N split parts (<name>-0000k-of-0000N.gguf)")
    p.add_argument("--json", action="store_true", help="print a JSON document instead of sha256sum lines")
    a = p.parse_args(argv)
    try:
        if a.kind == "all-small":
            models = list(write_all_small(a.out).values())
        else:
            spec_args = {
                k: v
                for k, v in {
                    "n_embd": a.n_embd,
                    "n_layer": a.n_layer,
                    "n_ff": a.n_ff,
                    "n_head": a.n_head,
                    "n_head_kv": a.n_head_kv,
                    "n_vocab": a.n_vocab,
                    "n_expert": a.n_expert,
                    "n_ff_exp": a.n_ff_exp,
                    "dtype": a.dtype,
                    "agree_fraction": a.agree_fraction,
                    "seed": a.seed,
                }.items()
                if v is not None
            }
            models = [build_model(a.kind, a.out, name=a.name, split=a.split, **spec_args)]
    except ValueError as e:
        print(f"make_models: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps([m.to_json() for m in models], indent=2))
    else:
        for m in models:
            for path in m.paths:
                print(f"{m.sha256[path.name]}  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
