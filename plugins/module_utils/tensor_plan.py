# Copyright: llamafleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tensor-split planner: which GPUs, which ``-ts`` split, and does it fit.

Pure logic (no Ansible imports). Inputs are the ``gpu_facts`` and ``gguf_info`` dicts of
docs/facts.md; the result is the ``plan`` the ``llamafleet.mtp.tensor_split`` module returns.

Every placement rule below follows the llama.cpp tree "T" this project pins (commit 0c1e570,
vendored in llama-cpp-python 0.3.36); ``file:line`` references are relative to that tree.

Memory model, per device (all sizes in bytes until the MiB report, which rounds each category up):

* weights   - ``blk.N.*`` of the trunk blocks the device holds (layer split). ``token_embd`` is the
  input layer, which llama.cpp always keeps on the CPU (src/llama-model.cpp:1603-1605: "always keep
  it on the CPU"), so it never counts against GPU memory; it is reported as ``host_mib``.
* kv        - K and V cache of the trunk KV layers the device holds. The KV tensor of layer ``il``
  lives on ``dev_layer(il)`` (src/llama-kv-cache.cpp:216-218), ``kv_size = n_ctx_seq`` cells per
  stream and ``n_stream = 1`` (unified) or ``n_seq_max`` (src/llama-kv-cache.cpp:84,233-234), each
  row ``ggml_row_size(type, n_embd_k_gqa)``; quantized types are stored in blocks (q8_0: 34 bytes
  per 32 values, q4_0: 18 per 32, ...; ggml/src/ggml-common.h). The MTP (nextn) layers are filtered
  out of the trunk context's cache (src/llama-model.cpp:2797-2803).
* recurrent - F32 conv + SSM state of the recurrent layers the device holds
  (src/llama-memory-recurrent.cpp:86-103): ``n_rows = n_seq_max * (1 + n_rs_seq)``, where
  ``n_rs_seq = --spec-draft-n-max`` when draft-mtp is on (common/common.h:396-401) and the
  architecture supports partial rollback (src/llama-arch.cpp:1123-1140), else 0
  (src/llama-context.cpp:105-110).
* mtp_weights - the nextn blocks (``blk.<trunk_layers>..``). They are loaded only when draft-mtp is
  requested (``TENSOR_SKIP`` otherwise, src/models/qwen35.cpp:37) and sit on ``dev_layer`` of their
  block index like any repeating layer.
* mtp_kv    - the MTP draft context's own KV cache: only the nextn layers
  (src/llama-model.cpp:2797-2801), at ``--spec-draft-type-k/v`` (default f16,
  common/speculative.cpp:2478-2479) and the target's total ``n_ctx`` (speculative.cpp:2530).
* output    - ``output.weight`` (or the duplicated ``token_embd`` when the output is tied,
  src/models/qwen35.cpp:46-49 and src/llama-model-loader.cpp:1162-1168) + ``output_norm`` + any
  other global tensor, on ``dev_output = get_layer_buft_list(n_layer_all)``
  (src/llama-model.cpp:1614).
* compute   - ESTIMATE of the compute buffers (see ``estimate_compute_terms``: activations calibrated
  on llama.cpp's own buffer sizes, plus the CUDA-only terms taken from its source), or the caller's
  flat ``compute_buffer_mib``.
* cuda_context - the CUDA context (driver state, kernels, cuBLAS handles) each llama-server process
  creates on every GPU it uses, before any buffer: nvidia-smi's free memory still includes it,
  while llama.cpp's ``--fit-target`` is applied to the free memory CUDA reports after it exists.
  Default DEFAULT_CUDA_CONTEXT_MIB (docs/measurements.md).
* reserve   - free memory left untouched, like llama.cpp's ``--fit-target`` (default 1024 MiB,
  common/fit.cpp), on top of the CUDA context.

Layer placement (layer split): llama.cpp prefix-sums and normalizes ``-ts`` (src/llama-model.cpp:
1556-1587), then sends "layer" ``il`` in ``0..n_layer_all`` (``n_layer_all`` = block_count, MTP
blocks included; index ``n_layer_all`` is the output layer) to
``upper_bound(splits, float(il - i_gpu_start) / act_gpu_layers)`` (src/llama-model.cpp:1589-1599).
The planner chooses integer ``-ts`` values (one per device: the number of those "layers" it should
hold) and then re-runs exactly that float32 formula (``simulate_layer_assignment``) and plans from
the simulated assignment, not from its own intent.
"""

from __future__ import annotations

import bisect
import itertools
import math
import struct

MIB = 1024 * 1024

# ggml type -> (values per block, bytes per block): ggml/src/ggml-common.h (block_q4_0 = half + 16
# bytes, block_q8_0 = half + 32 bytes, ...) and the type_traits table in ggml/src/ggml.c.
CACHE_TYPES = {
    "f32": (1, 4),
    "f16": (1, 2),
    "bf16": (1, 2),
    "q8_0": (32, 34),
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "iq4_nl": (32, 18),
    "q5_0": (32, 22),
    "q5_1": (32, 24),
}
UNQUANTIZED_TYPES = frozenset({"f32", "f16", "bf16"})
# Cheaper cache types checked when a context does not fit, in order of preference (most bits first);
# every one that is cheaper than the requested type is checked and each that fits is suggested.
# iq4_nl is left out: CUDA's flash attention has no iq4_nl K/V (ggml_cuda_fattn_kv_type_supported,
# ggml/src/ggml-cuda/fattn.cu:525-539), and a quantized V cache needs flash attention.
FALLBACK_CACHE_TYPES = ("q8_0", "q5_1", "q5_0", "q4_1", "q4_0")

# Architectures with a draft-mtp graph (the models/*.cpp that honour ml.load_mtp, LLAMACPP.md 2).
MTP_ARCHS = frozenset(
    {
        "qwen35",
        "qwen35moe",
        "qwen3next",
        "glm4moe",
        "deepseek2",
        "deepseek32",
        "deepseek4",
        "glm-dsa",
        "glm5-next",
        "step35",
        "mimo2",
        "hy_v3",
        "bailingmoe3",
        "cohere2moe",
        "nemotron_h_moe",
    }
)
# llm_arch_supports_rs_rollback (src/llama-arch.cpp:1123-1140).
RS_ROLLBACK_ARCHS = frozenset(
    {
        "kimi-k3",
        "qwen35",
        "qwen35moe",
        "qwen4exp",
        "deepseek4",
        "glm5-next",
        "nemotron_h",
        "nemotron_h_moe",
        "lfm2",
        "lfm2moe",
        "bailingmoe3",
    }
)
# llm_arch_supports_sm_tensor returns false for these (src/llama-arch.cpp:1142-1177).
SM_TENSOR_UNSUPPORTED_ARCHS = frozenset(
    {
        "grok",
        "mpt",
        "plamo2",
        "minicpm3",
        "gemma3n",
        "mamba",
        "mamba2",
        "jamba",
        "falcon-h1",
        "olmo2",
        "olmoe",
        "deepseek2",
        "deepseek32",
        "hy_v4",
        "dots3note",
        "glm-dsa",
        "bitnet",
        "t5",
        "nemotron_h",
        "nemotron_h_moe",
        "granitehybrid",
        "minimax-01",
        "minimax-m2",
        "minimax-m3",
        "mistral4",
        "kimi-linear",
        "bailingmoe3",
        "kimi-k3",
        "glm5-next",
        "qwen3tts",
        "qwen4exp",
    }
)

SPLIT_MODES = ("auto", "none", "layer", "tensor")
DEFAULT_RESERVE_MIB = 1024  # llama.cpp --fit-target default (LLAMACPP.md 3)
# CUDA context per GPU per process: 526 MiB in use on an H200 (CUDA 13.0, driver 580) before any
# llama.cpp buffer (docs/measurements.md, 2026-11-29); older GPUs/toolkits use less.
DEFAULT_CUDA_CONTEXT_MIB = 512
DEFAULT_DRAFT_N_MAX = 2
DEFAULT_N_UBATCH = 512  # common/common.h:454
DEFAULT_N_BATCH = 2048  # common/common.h:453
# ggml_backend_sched keeps this many copies of every split input when pipeline parallelism is on
# (ggml/src/ggml-backend.cpp:771-773, 1888, 1379-1387); llama.cpp turns it on for a layer split over
# more than one device with every layer offloaded (src/llama-context.cpp:430-435).
SCHED_MAX_COPIES = 4
# Activation part of the compute buffers, per context, as factors of ``n_ubatch * 4 * (3 * n_ff +
# 8 * n_embd)`` bytes, fitted to llama.cpp's own "compute buffer size" lines minus the terms counted
# separately (KQ mask, logits) at 7 points (tests/gpu/calibrate_compute.py --backend cpu; table and
# raw logs in docs/measurements.md and tests/gpu/results/cpu-2026-12-01/), each the largest fitted
# value times CALIBRATION_MARGIN, rounded up:
# * trunk context: measured = activations + mask + logits at every point; fitted 0.711 (129.4 MiB for
#   Qwen3.6-27B at n_ubatch 512) -> ACTIVATION_FACTOR;
# * MTP draft context: measured = max(peak, activations + mask) + logits - a mask-independent peak
#   (fitted 0.761, 138.6 MiB, one mask included) dominates up to about 64k cells, activations beside
#   the mask (fitted 0.358, 65.2 MiB) beyond -> MTP_PEAK_FACTOR, MTP_ACTIVATION_FACTOR.
# Measured on the CPU backend (no GPU was available): the CUDA graph is the same graph, allocated by
# the same ggml-alloc; the CUDA-only terms are added apart.
CALIBRATION_MARGIN = 1.10
ACTIVATION_FACTOR = 0.79
MTP_ACTIVATION_FACTOR = 0.40
MTP_PEAK_FACTOR = 0.84

# nvidia-smi topo -m link codes, best first (judged by the worst link inside a GPU set). ``NV<n>`` is a
# bonded set of n NVLinks (the legend: "Connection traversing a bonded set of # NVLinks"), so its
# bandwidth grows with n: NV18 < NV12 < ... < NV2 < NV1 in rank, every NV# above every PCIe path.
_NV_MAX = 64  # more bonded links than any GPU has (H100/H200: 18)
_LINK_RANK = {"PIX": _NV_MAX + 1, "PXB": _NV_MAX + 2, "PHB": _NV_MAX + 3, "NODE": _NV_MAX + 4, "SOC": _NV_MAX + 5}
_LINK_RANK["SYS"] = _LINK_RANK["SOC"]  # SOC is the old name of SYS
_UNKNOWN_LINK_RANK = _NV_MAX + 6


class PlanError(Exception):
    """Planning failed; ``details`` carries the numbers (needed vs available, what would fit)."""

    def __init__(self, message, details=None):
        super().__init__(message)
        self.message = message
        self.details = details or {}


# --------------------------------------------------------------------------------------------
# small helpers


def _pad(x, n):
    return ((x + n - 1) // n) * n


def _mib(nbytes):
    """Bytes -> MiB, rounded up (a plan must never under-count)."""
    return int(math.ceil(nbytes / MIB)) if nbytes > 0 else 0


def _f32(x):
    """Round a Python float to IEEE float32, as C++ ``float`` arithmetic does after each operation."""
    return struct.unpack("f", struct.pack("f", x))[0]


def row_size(cache_type, n_values):
    """``ggml_row_size``: bytes of ``n_values`` elements of ``cache_type``."""
    blck, tsize = CACHE_TYPES[cache_type]
    if n_values % blck:
        raise PlanError(f"row of {n_values} values is not a multiple of the {cache_type} block size {blck}")
    return n_values // blck * tsize


def _check_cache_type(name, value):
    if value not in CACHE_TYPES:
        raise PlanError(f"{name}={value!r} is not a llama.cpp KV cache type; use one of: {', '.join(CACHE_TYPES)}")
    return value


def _int(name, value, minimum=None):
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanError(f"{name} must be an integer, got {value!r}")
    ivalue = value
    if minimum is not None and ivalue < minimum:
        raise PlanError(f"{name} must be >= {minimum}, got {ivalue}")
    return ivalue


# --------------------------------------------------------------------------------------------
# llama.cpp arithmetic


def context_cells(context, parallel, kv_unified=False):
    """KV geometry llama.cpp derives from ``-c context -np parallel`` (src/llama-context.cpp:290-305).

    ``-c`` is the TOTAL context across all slots: n_ctx is padded to 256; with a unified cache one
    stream holds all n_ctx cells, otherwise each of ``parallel`` streams holds
    ``n_ctx_seq = pad(n_ctx / parallel, 256)`` cells. Returns a dict with n_ctx, n_ctx_seq,
    n_stream and cells (the cells per layer, all streams together).
    """
    n_ctx = _pad(context, 256)
    if kv_unified:
        n_ctx_seq, n_stream = n_ctx, 1
    else:
        n_ctx_seq = _pad(n_ctx // parallel, 256)
        if n_ctx_seq == 0:
            raise PlanError(f"context {context} is too small for {parallel} slots (n_ctx_seq == 0)")
        n_stream = parallel
        n_ctx = n_ctx_seq * parallel
    return {"n_ctx": n_ctx, "n_ctx_seq": n_ctx_seq, "n_stream": n_stream, "cells": n_ctx_seq * n_stream}


def simulate_layer_assignment(tensor_split, n_layer_all, n_gpu_layers=-1):
    """Device index llama.cpp gives each layer ``0..n_layer_all`` (the last one is the output layer).

    A float32 re-implementation of src/llama-model.cpp:1556-1614 (split points from ``-ts``:
    prefix sum, normalize, then ``upper_bound`` of ``float(il - i_gpu_start)/act_gpu_layers``).
    ``None`` marks a layer left on the CPU. ``n_gpu_layers=-1`` means all (llama-model.cpp:2002-2005).
    """
    n_dev = len(tensor_split)
    if n_dev == 0:
        raise PlanError("tensor_split is empty")
    splits = [_f32(float(x)) for x in tensor_split]
    if any(x < 0 for x in splits) or all(x == 0.0 for x in splits):
        raise PlanError(f"tensor_split {list(tensor_split)} must be non-negative and not all zero")
    split_sum = 0.0
    cumulative = []
    for value in splits:
        split_sum = _f32(split_sum + value)
        cumulative.append(split_sum)
    cumulative = [_f32(c / split_sum) for c in cumulative]
    if n_gpu_layers < 0:
        n_gpu_layers = n_layer_all + 1
    i_gpu_start = max(n_layer_all + 1 - n_gpu_layers, 0)
    act_gpu_layers = min(n_gpu_layers, n_layer_all + 1)
    result = []
    for il in range(n_layer_all + 1):
        if il < i_gpu_start or (il - i_gpu_start) >= act_gpu_layers:
            result.append(None)
            continue
        x = _f32(_f32(float(il - i_gpu_start)) / _f32(float(act_gpu_layers)))
        dev = bisect.bisect_right(cumulative, x)
        if dev >= n_dev:  # devices.at() would throw in llama.cpp; cannot happen for x < 1.0
            raise PlanError(f"layer {il} maps past the last device for tensor_split {list(tensor_split)}")
        result.append(dev)
    return result


# --------------------------------------------------------------------------------------------
# model


class ModelSpec:
    """The parts of ``gguf_info`` the planner needs, validated."""

    def __init__(self, gguf):
        if not isinstance(gguf, dict):
            raise PlanError("gguf must be the gguf_info dict returned by llamafleet.mtp.gguf_info")

        def need(key, src=gguf, where="gguf"):
            if key not in src or src[key] is None:
                raise PlanError(
                    f"{where} is missing '{key}': pass the `gguf` result of llamafleet.mtp.gguf_info (docs/facts.md)"
                )
            return src[key]

        self.name = gguf.get("name") or gguf.get("path") or "model"
        self.arch = str(need("architecture"))
        self.n_layer_all = _int("gguf.block_count", need("block_count"), 1)
        self.n_nextn = _int("gguf.nextn_predict_layers", gguf.get("nextn_predict_layers") or 0, 0)
        self.n_trunk = self.n_layer_all - self.n_nextn
        if "trunk_layers" in gguf and gguf["trunk_layers"] is not None and int(gguf["trunk_layers"]) != self.n_trunk:
            raise PlanError(
                f"gguf.trunk_layers={gguf['trunk_layers']} disagrees with block_count - nextn_predict_layers "
                f"= {self.n_trunk}"
            )
        self.has_mtp = self.n_nextn > 0
        self.n_embd = _int("gguf.embedding_length", need("embedding_length"), 1)
        ff = need("feed_forward_length")
        self.n_ff = max(int(v) for v in ff) if isinstance(ff, list) else _int("gguf.feed_forward_length", ff, 0)
        self.n_vocab = _int("gguf.vocab_size", need("vocab_size"), 1)
        self.head_count_kv = need("head_count_kv")
        self.key_length = _int("gguf.key_length", need("key_length"), 1)
        self.value_length = _int("gguf.value_length", need("value_length"), 1)
        self.context_length = gguf.get("context_length")
        self.size_bytes = gguf.get("size_bytes")

        self.kv_layers = sorted(int(i) for i in need("kv_layers"))
        bad = [i for i in self.kv_layers if not 0 <= i < self.n_trunk]
        if bad:
            raise PlanError(f"gguf.kv_layers {bad} are not trunk layers (0..{self.n_trunk - 1})")

        rec = gguf.get("recurrent")
        self.recurrent_layers = []
        self.state_bytes_per_layer = 0
        if rec:
            self.recurrent_layers = sorted(int(i) for i in need("layers", rec, "gguf.recurrent"))
            sbpl = rec.get("state_bytes_per_layer")
            if sbpl is None:
                # n_embd_r + n_embd_s floats (src/llama-hparams.cpp:208-258), F32
                d_conv = int(need("conv_kernel", rec, "gguf.recurrent"))
                d_inner = int(need("inner_size", rec, "gguf.recurrent"))
                d_state = int(need("state_size", rec, "gguf.recurrent"))
                n_group = int(need("group_count", rec, "gguf.recurrent"))
                sbpl = 4 * ((d_conv - 1) * (d_inner + 2 * n_group * d_state) + d_state * d_inner)
            self.state_bytes_per_layer = int(sbpl)

        tb = need("tensor_bytes")
        per_layer = need("per_layer", tb, "gguf.tensor_bytes")
        if len(per_layer) != self.n_layer_all:
            raise PlanError(
                f"gguf.tensor_bytes.per_layer has {len(per_layer)} entries, expected block_count={self.n_layer_all}"
            )
        self.layer_bytes = [int(x) for x in per_layer]
        self.token_embd_bytes = int(tb.get("token_embd") or 0)
        output = int(tb.get("output") or 0)
        # A tied output loads token_embd a second time as the output tensor, on the output device
        # (TENSOR_DUPLICATED, src/models/qwen35.cpp:46-49; src/llama-model-loader.cpp:1162-1168).
        self.output_tied = output == 0
        self.output_bytes = (
            (output or self.token_embd_bytes) + int(tb.get("output_norm") or 0) + int(tb.get("other") or 0)
        )

    def n_head_kv(self, il):
        if isinstance(self.head_count_kv, list):
            return int(self.head_count_kv[il]) if il < len(self.head_count_kv) else 0
        return int(self.head_count_kv)

    def kv_bytes_per_cell(self, il, ctk, ctv):
        """K + V bytes per cache cell of layer ``il`` (n_embd_k_gqa = key_length * n_head_kv)."""
        nkv = self.n_head_kv(il)
        return row_size(ctk, self.key_length * nkv) + row_size(ctv, self.value_length * nkv)

    def max_kv_width(self):
        return max((self.n_head_kv(il) for il in self.kv_layers), default=0)


# --------------------------------------------------------------------------------------------
# settings


def tensor_split_mtp_problem(split_mode, mtp, forced, force_name="force_tensor_split"):
    """The one rule for -sm tensor with MTP: the refusal's text, or None (another split mode, no MTP, or forced)."""
    if split_mode != "tensor" or not mtp or forced:
        return None
    return (
        "split mode tensor with MTP is refused: llama.cpp issues #23294, #23657, #24309, #24366, #24440 and #25829 "
        f"report crashes of draft-mtp with -sm tensor; use split_mode layer (or auto), or set {force_name}: true to "
        "accept the risk"
    )


# Every planner setting and its default: the one signature of Settings, plan() and with_changes (a None given for
# any but mtp means the default; mtp None means on when the model has MTP).
SETTINGS_DEFAULTS = {
    "cache_type_k": "f16",
    "cache_type_v": "f16",
    "parallel": 1,
    "mtp": None,
    "draft_n_max": DEFAULT_DRAFT_N_MAX,
    "draft_cache_type_k": "f16",
    "draft_cache_type_v": "f16",
    "reserve_mib": DEFAULT_RESERVE_MIB,
    "compute_buffer_mib": None,
    "split_mode": "auto",
    "force_tensor_split": False,
    "kv_unified": False,
    "n_ubatch": DEFAULT_N_UBATCH,
    "n_batch": DEFAULT_N_BATCH,
    "cuda_context_mib": DEFAULT_CUDA_CONTEXT_MIB,
}


class Settings:
    """Validated planning inputs (the module's options, minus the facts)."""

    def __init__(self, model, context, **options):
        unknown = sorted(set(options) - set(SETTINGS_DEFAULTS))
        if unknown:
            raise TypeError(f"unknown planner settings: {', '.join(unknown)}")
        o = dict(SETTINGS_DEFAULTS, **{k: v for k, v in options.items() if v is not None or k == "mtp"})
        cache_type_k, cache_type_v, parallel = o["cache_type_k"], o["cache_type_v"], o["parallel"]
        mtp, draft_n_max = o["mtp"], o["draft_n_max"]
        draft_cache_type_k, draft_cache_type_v = o["draft_cache_type_k"], o["draft_cache_type_v"]
        reserve_mib, compute_buffer_mib, split_mode = o["reserve_mib"], o["compute_buffer_mib"], o["split_mode"]
        force_tensor_split, kv_unified = o["force_tensor_split"], o["kv_unified"]
        n_ubatch, n_batch, cuda_context_mib = o["n_ubatch"], o["n_batch"], o["cuda_context_mib"]
        self.context = _int("context", context, 1)
        self.cache_type_k = _check_cache_type("cache_type_k", cache_type_k)
        self.cache_type_v = _check_cache_type("cache_type_v", cache_type_v)
        self.parallel = _int("parallel", parallel, 1)
        self.draft_n_max = _int("draft_n_max", draft_n_max, 1)
        self.draft_cache_type_k = _check_cache_type("draft_cache_type_k", draft_cache_type_k)
        self.draft_cache_type_v = _check_cache_type("draft_cache_type_v", draft_cache_type_v)
        self.reserve_mib = _int("reserve_mib", reserve_mib, 0)
        self.cuda_context_mib = _int("cuda_context_mib", cuda_context_mib, 0)
        self.compute_buffer_mib = (
            None if compute_buffer_mib is None else _int("compute_buffer_mib", compute_buffer_mib, 0)
        )
        self.force_tensor_split = bool(force_tensor_split)
        self.kv_unified = bool(kv_unified)
        self.n_ubatch = _int("n_ubatch", n_ubatch, 1)
        self.n_batch = _int("n_batch", n_batch, 1)
        if split_mode not in SPLIT_MODES:
            raise PlanError(f"split_mode={split_mode!r} is not one of {', '.join(SPLIT_MODES)}")
        self.split_mode = split_mode

        if mtp is None:
            mtp = model.has_mtp and model.arch in MTP_ARCHS
        self.mtp = bool(mtp)
        if self.mtp and not model.has_mtp:
            # llama.cpp: "context type MTP requested but model doesn't contain MTP layers" (llama-context.cpp:3883)
            raise PlanError(
                f"mtp=true but {model.name} has no MTP (nextn) layers (nextn_predict_layers=0); "
                "set mtp=false or use a GGUF that includes the MTP head"
            )
        if self.mtp and model.arch not in MTP_ARCHS:
            raise PlanError(
                f"mtp=true but llama.cpp has no draft-mtp graph for architecture '{model.arch}' "
                f"(supported: {', '.join(sorted(MTP_ARCHS))}); set mtp=false"
            )
        if split_mode == "tensor":
            refused = tensor_split_mtp_problem(split_mode, self.mtp, self.force_tensor_split)
            if refused:
                raise PlanError(refused)
            if model.arch in SM_TENSOR_UNSUPPORTED_ARCHS:
                raise PlanError(
                    f"split_mode=tensor is not implemented in llama.cpp for architecture '{model.arch}' "
                    "(src/llama-arch.cpp:1142-1177); use split_mode=layer"
                )
            quantized = [t for t in (self.cache_type_k, self.cache_type_v) if t not in UNQUANTIZED_TYPES]
            if quantized:
                raise PlanError(
                    f"split_mode=tensor needs an unquantized KV cache (f32/f16/bf16), got {'/'.join(quantized)}; "
                    "use split_mode=layer or f16 cache types"
                )

        # n_rs_seq (common/common.h:396-401; src/llama-context.cpp:105-110)
        self.n_rs_seq = self.draft_n_max if (self.mtp and model.arch in RS_ROLLBACK_ARCHS) else 0
        self.cells = context_cells(self.context, self.parallel, self.kv_unified)
        # cparams.n_batch = min(n_ctx, n_batch) for causal models, n_ubatch = min(n_batch, n_ubatch)
        self.ubatch = min(self.n_ubatch, self.n_batch, self.cells["n_ctx"])
        # server_output_limits (tools/server/server-context.cpp:41-53, common/speculative.cpp:2586-2595)
        self.n_outputs = min(self.n_batch, self.parallel * (1 + (self.draft_n_max if self.mtp else 0)))

    def options(self):
        """The settings as Settings takes them (context and every SETTINGS_DEFAULTS key)."""
        return dict({k: getattr(self, k) for k in SETTINGS_DEFAULTS}, context=self.context)

    def with_changes(self, model, **changes):
        return Settings(model, **dict(self.options(), **changes))


# --------------------------------------------------------------------------------------------
# per-layer costs and the compute estimate

CATEGORIES = ("weights", "kv", "recurrent", "mtp_weights", "mtp_kv", "output")


def layer_costs(model, s):
    """Bytes by category for each llama.cpp "layer" 0..n_layer_all (the last one is the output layer)."""
    cells = s.cells["cells"]
    kv_set = set(model.kv_layers)
    rec_set = set(model.recurrent_layers)
    rows = max(1, s.parallel) * (1 + s.n_rs_seq)
    costs = []
    for il in range(model.n_layer_all):
        c = dict.fromkeys(CATEGORIES, 0)
        if il < model.n_trunk:
            c["weights"] = model.layer_bytes[il]
            if il in kv_set:
                c["kv"] = cells * model.kv_bytes_per_cell(il, s.cache_type_k, s.cache_type_v)
            if il in rec_set:
                c["recurrent"] = rows * model.state_bytes_per_layer
        elif s.mtp:
            c["mtp_weights"] = model.layer_bytes[il]
            # the MTP context has the same n_ctx and n_seq_max as the target (speculative.cpp:2530)
            c["mtp_kv"] = cells * model.kv_bytes_per_cell(il, s.draft_cache_type_k, s.draft_cache_type_v)
        elif model.arch not in MTP_ARCHS:
            # archs without a draft-mtp graph do not skip nextn tensors: count them (conservative)
            c["mtp_weights"] = model.layer_bytes[il]
        costs.append(c)
    out = dict.fromkeys(CATEGORIES, 0)
    out["output"] = model.output_bytes
    costs.append(out)
    return costs


COMPUTE_TERMS = (
    "activations",
    "kq_mask",
    "inputs",
    "kv_f16",
    "logits",
    "mtp_activations",
    "mtp_kq_mask",
    "mtp_inputs",
    "mtp_kv_f16",
    "mtp_logits",
)


def estimate_compute_terms(
    model, s, *, has_kv, has_output, has_mtp, receives_hidden=False, pipeline=False, backend="cuda"
):
    """ESTIMATE, by term, of one device's compute buffers (bytes): the trunk context's, plus the MTP draft
    context's on the device that holds the MTP block. ``backend="cpu"`` leaves out the CUDA-only terms
    (what llama.cpp's CPU backend allocates for the same graph, for calibration and CPU plans).

    * activations: ``ACTIVATION_FACTOR * n_ubatch * 4 * (3 * n_ff + 8 * n_embd)`` - the intermediate
      tensors ggml-alloc keeps alive at once; they are reused from layer to layer, so this does not
      grow with the layers a device holds. Calibrated on llama.cpp's own "compute buffer size"
      lines (docs/measurements.md), with CALIBRATION_MARGIN; only Qwen3.6-27B's geometry was
      measured, other architectures keep the shape of the formula.
    * kq_mask: the F16 mask ``n_ctx_seq x n_ubatch`` (src/llama-graph.cpp:982) on devices with attention
      layers. It is a graph input, so the scheduler places it on the CPU backend (ggml-backend.cpp:
      944-948) and every GPU split that reads it gets its own copy (:1375-1388, CUDA cannot read the
      host buffer, ggml-cuda.cu:5630-5634); with pipeline parallelism (a layer split over several
      GPUs) each copy exists SCHED_MAX_COPIES times, all allocated up front (:1563-1590). CUDA: copies
      times the mask; CPU: the mask once.
    * inputs (CUDA only): the n_embd x n_ubatch F32 hidden state each GPU split receives - the token
      embeddings from the CPU (token_embd stays on the CPU) on the first GPU, the previous GPU's
      output on the others - times the same copies.
    * kv_f16 (CUDA only): with a quantized K or V cache, the flash-attention kernels for batches (tile /
      mma) read F16, and ggml_cuda_flash_attn_ext_get_alloc_size (ggml/src/ggml-cuda/fattn.cu:722-756,
      fattn-common.cuh:53-86) enlarges the attention output's allocation in the compute buffer by an F16
      copy of the whole K and V view: ``cells * n_embd_k_gqa * 2`` bytes (and the same for V).
    * logits: ``n_outputs * n_vocab * 4`` on the output device (server caps n_outputs at
      ``parallel * (1 + draft_n_max)``, tools/server/server-context.cpp:41-53).
    * mtp_*: the MTP draft context (same n_ctx, n_ubatch and pipeline setting as the target,
      common/speculative.cpp:2522-2535): its own activations (the larger of MTP_PEAK_FACTOR's peak less
      one mask and MTP_ACTIVATION_FACTOR's activations beside the mask, as fitted), mask copies, two
      inputs (token embeddings and the target's hidden state), F16 conversion for a quantized draft
      cache, and logits.
    """
    cuda = backend == "cuda"
    ub = s.ubatch
    copies = SCHED_MAX_COPIES if (pipeline and cuda) else 1
    width = 3 * model.n_ff + 8 * model.n_embd
    mask = s.cells["n_ctx_seq"] * ub * 2
    hidden = ub * model.n_embd * 4
    logits = s.n_outputs * model.n_vocab * 4
    t = dict.fromkeys(COMPUTE_TERMS, 0)
    t["activations"] = int(ACTIVATION_FACTOR * ub * 4 * width)
    if has_kv:
        t["kq_mask"] = copies * mask
        if cuda:
            nkv = model.max_kv_width()
            if s.cache_type_k not in UNQUANTIZED_TYPES:
                t["kv_f16"] += s.cells["cells"] * model.key_length * nkv * 2
            if s.cache_type_v not in UNQUANTIZED_TYPES:
                t["kv_f16"] += s.cells["cells"] * model.value_length * nkv * 2
    if cuda:
        t["inputs"] = copies * hidden
    if has_output:
        t["logits"] = logits
    if has_mtp:
        # max(peak, activations + mask), the peak counting one mask: the mask term stays apart (copies)
        peak = int(MTP_PEAK_FACTOR * ub * 4 * width)
        t["mtp_activations"] = max(peak - mask, int(MTP_ACTIVATION_FACTOR * ub * 4 * width))
        t["mtp_kq_mask"] = copies * mask
        t["mtp_logits"] = logits
        if cuda:
            t["mtp_inputs"] = copies * 2 * hidden
            nkv = max(model.n_head_kv(il) for il in range(model.n_trunk, model.n_layer_all))
            if s.draft_cache_type_k not in UNQUANTIZED_TYPES:
                t["mtp_kv_f16"] += s.cells["cells"] * model.key_length * nkv * 2
            if s.draft_cache_type_v not in UNQUANTIZED_TYPES:
                t["mtp_kv_f16"] += s.cells["cells"] * model.value_length * nkv * 2
    return t


def estimate_compute_bytes(
    model, s, *, has_kv, has_output, has_mtp, receives_hidden=False, pipeline=False, backend="cuda"
):
    """The sum of ``estimate_compute_terms``: ESTIMATE of one device's compute buffers, in bytes."""
    return sum(
        estimate_compute_terms(
            model,
            s,
            has_kv=has_kv,
            has_output=has_output,
            has_mtp=has_mtp,
            receives_hidden=receives_hidden,
            pipeline=pipeline,
            backend=backend,
        ).values()
    )


# --------------------------------------------------------------------------------------------
# one instance on a given ordered GPU set


class _Layout:
    """Prefix sums over the layer costs, to price any contiguous run of layers quickly."""

    def __init__(self, model, s, backend="cuda"):
        self.model = model
        self.s = s
        self.backend = backend
        self.costs = layer_costs(model, s)
        self.n = len(self.costs)  # n_layer_all + 1
        self.prefix = [0]
        self.kv_prefix = [0]
        kv_set = set(model.kv_layers)
        for il, c in enumerate(self.costs):
            self.prefix.append(self.prefix[-1] + sum(c.values()))
            self.kv_prefix.append(self.kv_prefix[-1] + (1 if il in kv_set else 0))
        self.mtp_first = model.n_trunk if (s.mtp and model.has_mtp) else None
        self._compute_cache = {}
        self.split_cache = {}

    def flags(self, a, b):
        return {
            "has_kv": self.kv_prefix[b] - self.kv_prefix[a] > 0,
            "has_output": a <= self.n - 1 < b,
            "has_mtp": self.mtp_first is not None and a <= self.mtp_first < b,
        }

    def compute_terms(self, a, b, position, pipeline):
        """The estimate's terms (bytes) for layers [a, b) at this position; None with a flat value."""
        if self.s.compute_buffer_mib is not None:
            return None
        flags = self.flags(a, b)
        key = (flags["has_kv"], flags["has_output"], flags["has_mtp"], position > 0, pipeline)
        if key not in self._compute_cache:
            self._compute_cache[key] = estimate_compute_terms(
                self.model, self.s, receives_hidden=position > 0, pipeline=pipeline, backend=self.backend, **flags
            )
        return self._compute_cache[key]

    def compute(self, a, b, position, pipeline):
        if self.s.compute_buffer_mib is not None:
            return self.s.compute_buffer_mib * MIB
        return sum(self.compute_terms(a, b, position, pipeline).values())

    def overhead_bytes(self):
        """Per device, besides its buffers: the CUDA context and the reserve."""
        context = self.s.cuda_context_mib if self.backend == "cuda" else 0
        return (context + self.s.reserve_mib) * MIB

    def need(self, a, b, position, pipeline):
        return self.prefix[b] - self.prefix[a] + self.compute(a, b, position, pipeline) + self.overhead_bytes()


def _balanced_counts(layout, free_bytes):
    """Contiguous layer counts per device (each >= 1): minimize the worst needed/free ratio (exact DP),
    ties broken towards an even spread (smaller sum of squared ratios)."""
    k, n = len(free_bytes), layout.n
    pipeline = k > 1
    big = 1e9  # a device with no free memory

    def ratio(a, b, i):
        return layout.need(a, b, i, pipeline) / free_bytes[i] if free_bytes[i] > 0 else big

    # best[i][b]: (worst ratio, sum of squares) placing layers [0, b) on devices 0..i
    best = [[None] * (n + 1) for dummy in range(k)]
    back = [[-1] * (n + 1) for dummy in range(k)]
    for b in range(1, n - k + 2):
        r = ratio(0, b, 0)
        best[0][b] = (r, r * r)
        back[0][b] = 0
    for i in range(1, k):
        for b in range(i + 1, n - (k - 1 - i) + 1):
            for a in range(i, b):
                prev = best[i - 1][a]
                if prev is None:
                    continue
                r = ratio(a, b, i)
                cand = (max(prev[0], r), prev[1] + r * r)
                if best[i][b] is None or cand < best[i][b]:
                    best[i][b] = cand
                    back[i][b] = a
    counts = []
    b = n
    for i in range(k - 1, -1, -1):
        a = back[i][b]
        counts.append(b - a)
        b = a
    counts.reverse()
    return counts


# Per-device MiB keys that add up to total_mib, in the order the refusal message lists them.
COUNTED = (*CATEGORIES, "compute", "cuda_context", "reserve")
_COUNTED_WORDS = {
    "weights": "weights",
    "kv": "KV",
    "recurrent": "recurrent state",
    "mtp_weights": "MTP weights",
    "mtp_kv": "MTP KV",
    "output": "output",
    "compute": "compute",
    "cuda_context": "CUDA context",
    "reserve": "reserve",
}


def _device_plan(layout, gpu, a, b, position, pipeline, bytes_by_cat):
    s = layout.s
    compute = layout.compute(a, b, position, pipeline) if b > a else 0
    terms = layout.compute_terms(a, b, position, pipeline) if b > a else None
    entry = {"device": gpu["index"], "name": gpu.get("name")}
    for cat in CATEGORIES:
        entry[f"{cat}_mib"] = _mib(bytes_by_cat[cat])
    entry["compute_mib"] = _mib(compute)
    entry["compute_terms_mib"] = {k: round(v / MIB, 1) for k, v in terms.items() if v} if terms else None
    entry["cuda_context_mib"] = s.cuda_context_mib if layout.backend == "cuda" else 0
    entry["reserve_mib"] = s.reserve_mib
    entry["total_mib"] = sum(entry[f"{cat}_mib"] for cat in COUNTED)
    free = int(gpu.get("memory_free_mib") or 0)
    entry["free_before_mib"] = free
    # expected free memory once llama-server runs (the reserve is not consumed)
    entry["free_after_mib"] = free - (entry["total_mib"] - s.reserve_mib)
    entry["fits"] = entry["total_mib"] <= free
    return entry


def counted_words(d):
    """``weights 8551 + KV 2592 + ... + reserve 1024`` for a per_device entry (zero terms left out)."""
    return " + ".join(f"{_COUNTED_WORDS[c]} {d[c + '_mib']}" for c in COUNTED if d.get(c + "_mib"))


def plan_instance(model, s, gpus, layout=None):
    """Plan one llama-server instance on the ordered GPU list ``gpus`` (gpu_facts entries)."""
    layout = layout or _Layout(model, s)
    k = len(gpus)
    n = layout.n
    if k == 1 or s.split_mode == "none":
        gpus = gpus[:1]
        return _assemble(layout, gpus, [0] * n, None, "none")
    if s.split_mode == "tensor":
        return _plan_tensor(layout, gpus)
    free = tuple(int(g.get("memory_free_mib") or 0) * MIB for g in gpus)
    if free not in layout.split_cache:  # the split depends only on the free memory, in order
        layout.split_cache[free] = _balanced_counts(layout, free)
    counts = layout.split_cache[free]
    ts = list(counts)
    assignment = simulate_layer_assignment(ts, model.n_layer_all)
    return _assemble(layout, gpus, assignment, ts, "layer")


def _assemble(layout, gpus, assignment, ts, split_mode):
    model, s = layout.model, layout.s
    k = len(gpus)
    pipeline = split_mode == "layer" and k > 1
    per_device = []
    layers = []
    for pos, gpu in enumerate(gpus):
        idx = [il for il, d in enumerate(assignment) if d == pos]
        a, b = (idx[0], idx[-1] + 1) if idx else (0, 0)
        if idx and idx != list(range(a, b)):
            raise PlanError("internal: llama.cpp assignment is not contiguous")  # cannot happen (monotone)
        by_cat = dict.fromkeys(CATEGORIES, 0)
        for il in idx:
            for cat, v in layout.costs[il].items():
                by_cat[cat] += v
        per_device.append(_device_plan(layout, gpu, a, b, pos, pipeline, by_cat))
        blocks = [il for il in idx if il < model.n_layer_all]
        layers.append(
            {
                "device": gpu["index"],
                "cuda_index": pos,
                "count": len(idx),
                "first": idx[0] if idx else None,
                "last": idx[-1] if idx else None,
                "blocks": len(blocks),
                "trunk_blocks": len([il for il in blocks if il < model.n_trunk]),
                "kv_layers": len([il for il in blocks if il in set(model.kv_layers)]),
                "recurrent_layers": len([il for il in blocks if il in set(model.recurrent_layers)]),
                "holds_mtp": any(il >= model.n_trunk for il in blocks) and s.mtp,
                "holds_output": model.n_layer_all in idx,
            }
        )
    return _instance(layout, gpus, ts, split_mode, per_device, layers)


def _plan_tensor(layout, gpus):
    """-sm tensor: every device holds its -ts share of each layer (an approximation; see module docs)."""
    free = [int(g.get("memory_free_mib") or 0) for g in gpus]
    total_free = sum(free) or 1
    ts = [max(1, round(100 * f / total_free)) for f in free]
    share = [t / sum(ts) for t in ts]
    totals = dict.fromkeys(CATEGORIES, 0)
    for c in layout.costs:
        for cat, v in c.items():
            totals[cat] += v
    per_device, layers = [], []
    for pos, gpu in enumerate(gpus):
        by_cat = {cat: int(math.ceil(v * share[pos])) for cat, v in totals.items()}
        per_device.append(_device_plan(layout, gpu, 0, layout.n, 0, False, by_cat))
        layers.append(
            {
                "device": gpu["index"],
                "cuda_index": pos,
                "count": layout.n,
                "first": 0,
                "last": layout.n - 1,
                "blocks": layout.model.n_layer_all,
                "trunk_blocks": layout.model.n_trunk,
                "kv_layers": len(layout.model.kv_layers),
                "recurrent_layers": len(layout.model.recurrent_layers),
                "holds_mtp": layout.s.mtp,
                "holds_output": True,
                "share": round(share[pos], 4),
            }
        )
    # compute: estimate_compute_bytes counts a whole device's buffers on each device (no pipeline copies)
    return _instance(layout, gpus, ts, "tensor", per_device, layers)


def _instance(layout, gpus, ts, split_mode, per_device, layers):
    model, s = layout.model, layout.s
    n_gpu_layers = model.n_layer_all + 1
    inst = {
        "devices": [g["index"] for g in gpus],
        "cuda_visible_devices": ",".join(str(g["index"]) for g in gpus),
        "tensor_split": ts,
        "tensor_split_arg": ",".join(str(t) for t in ts) if ts else None,
        "split_mode": split_mode,
        "main_gpu": 0,
        "n_gpu_layers": n_gpu_layers,
        "layers": layers,
        "per_device": per_device,
        "fits": all(d["fits"] for d in per_device),
        "required_mib": sum(d["total_mib"] for d in per_device),
        "available_mib": sum(d["free_before_mib"] for d in per_device),
        "host_mib": _mib(model.token_embd_bytes),
    }
    inst["llama_args"] = _llama_args(model, s, inst)
    return inst


def _llama_args(model, s, inst):
    args = ["-c", str(s.cells["n_ctx"]), "-np", str(s.parallel)]
    args += ["-ctk", s.cache_type_k, "-ctv", s.cache_type_v]
    if inst is None:
        args += ["-ngl", "0"]
    else:
        args += ["-ngl", str(inst["n_gpu_layers"]), "-sm", inst["split_mode"], "-mg", str(inst["main_gpu"])]
        if inst["tensor_split_arg"]:
            args += ["-ts", inst["tensor_split_arg"]]
    if s.kv_unified:
        args.append("--kv-unified")
    if s.mtp:
        # The speculative type's spelling (mtp / draft-mtp) depends on the binary: the server role
        # adds it from the capability probe. Only the draft context's cache types belong to the plan.
        args += ["--spec-draft-n-max", str(s.draft_n_max), "-ctkd", s.draft_cache_type_k, "-ctvd", s.draft_cache_type_v]
    return args


# --------------------------------------------------------------------------------------------
# GPU selection


def nvlink_count(code):
    """Bonded NVLinks of a ``topo -m`` code: ``NV4`` -> 4; 0 for anything else."""
    if isinstance(code, str):
        code = code.strip().upper()
        if code.startswith("NV") and code[2:].isdigit() and 0 < int(code[2:]) <= _NV_MAX:
            return int(code[2:])
    return 0


def _link_rank(code):
    """Lower is faster: NV<n> by n bonded links (NV18 first), then PIX, PXB, PHB, NODE, SYS/SOC, unknown."""
    links = nvlink_count(code)
    if links:
        return _NV_MAX - links
    if not isinstance(code, str):
        return _UNKNOWN_LINK_RANK
    return _LINK_RANK.get(code.strip().upper(), _UNKNOWN_LINK_RANK)


def _link(matrix, i, j):
    try:
        return matrix[i][j]
    except (IndexError, KeyError, TypeError):
        return None


def _group_key(group, matrix):
    """Sort key: the worst link inside the set (NV18 < ... < NV2 < NV1 < PIX < PXB < PHB < NODE < SYS),
    then the most NVLinks inside the set in total (bandwidth over all its pairs), then one NUMA node,
    then most free memory, then lowest indices."""
    worst, worst_code = -1, None
    total_links = 0
    for a, b in itertools.combinations(group, 2):
        code = _link(matrix, a["index"], b["index"])
        rank = _link_rank(code)
        total_links += nvlink_count(code)
        if rank > worst:
            worst, worst_code = rank, code
    numas = {g.get("numa_node") for g in group}
    one_numa = 0 if (len(numas) == 1 and None not in numas) or len(group) == 1 else 1
    free = sum(int(g.get("memory_free_mib") or 0) for g in group)
    return (max(worst, 0), -total_links, one_numa, -free, [g["index"] for g in group]), worst_code


def usable_gpus(gpu_facts, devices=None):
    """(usable GPUs, skipped notes) from gpu_facts: drops MIG-enabled and unhealthy GPUs, honours ``devices``."""
    if not isinstance(gpu_facts, dict):
        raise PlanError("gpu_facts must be the dict gathered by llamafleet.mtp.gpu_facts (docs/facts.md)")
    gpus = gpu_facts.get("gpus") or []
    by_index = {}
    for g in gpus:
        if "index" not in g:
            raise PlanError("gpu_facts.gpus entries need an 'index' (docs/facts.md)")
        by_index[int(g["index"])] = g
    skipped = []
    pool = sorted(by_index)
    if devices is not None:
        if not devices:
            raise PlanError("devices is an empty list: omit it to plan on all GPUs, or list GPU indices")
        wanted = [_int("devices[]", d, 0) for d in devices]
        missing = [d for d in wanted if d not in by_index]
        if missing:
            raise PlanError(
                f"devices {missing} are not GPUs on this host (nvidia-smi lists {sorted(by_index) or 'none'})"
            )
        pool = sorted(set(wanted))
    usable = []
    for i in pool:
        g = by_index[i]
        if str(g.get("mig_mode") or "").lower() == "enabled":
            skipped.append(
                {"index": i, "reason": "MIG mode is enabled (llama.cpp would see MIG instances, not the GPU)"}
            )
        elif g.get("healthy") is False:
            skipped.append({"index": i, "reason": f"not healthy: {g.get('error') or 'nvidia-smi reported an error'}"})
        elif g.get("memory_free_mib") is None:
            skipped.append({"index": i, "reason": "nvidia-smi did not report free memory"})
        else:
            usable.append(g)
    return usable, skipped


def _candidate_groups(pool, size, matrix):
    keyed = []
    for combo in itertools.combinations(pool, size):
        key, worst_code = _group_key(combo, matrix)
        keyed.append((key, list(combo), worst_code))
    keyed.sort(key=lambda t: t[0])
    return keyed


def find_group(model, s, pool, matrix, max_gpus):
    """Smallest fitting GPU set from ``pool`` by preference; returns (instance, worst_link) or (None, None)."""
    sizes = range(1, min(max_gpus, len(pool)) + 1)
    if s.split_mode == "none":
        sizes = range(1, min(1, len(pool)) + 1)
    layout = _Layout(model, s)
    for size in sizes:
        bound = (layout.prefix[-1] + size * layout.overhead_bytes()) / MIB
        for _key, group, worst_code in _candidate_groups(pool, size, matrix):
            if sum(int(g["memory_free_mib"]) for g in group) < bound:
                continue
            inst = plan_instance(model, s, group, layout)
            if inst["fits"]:
                return inst, worst_code
    return None, None


# --------------------------------------------------------------------------------------------
# top level


def _explain_model(model, s):
    cells = s.cells
    kvb = sum(model.kv_bytes_per_cell(il, s.cache_type_k, s.cache_type_v) for il in model.kv_layers)
    lines = [
        f"Model {model.name} ({model.arch}): {model.n_layer_all} blocks = {model.n_trunk} trunk + {model.n_nextn} MTP; "
        f"{len(model.kv_layers)} KV layers, {len(model.recurrent_layers)} recurrent layers.",
        f"Context: -c {s.context} -> n_ctx {cells['n_ctx']} over {s.parallel} slot(s) "
        f"({cells['n_stream']} stream(s) of {cells['n_ctx_seq']} cells); KV {s.cache_type_k}/{s.cache_type_v} = "
        f"{kvb} bytes per cell over all KV layers = {_mib(kvb * cells['cells'])} MiB.",
    ]
    if s.mtp:
        rows = s.parallel * (1 + s.n_rs_seq)
        lines.append(
            f"MTP on (--spec-type draft-mtp, --spec-draft-n-max {s.draft_n_max}): MTP KV at "
            f"{s.draft_cache_type_k}/{s.draft_cache_type_v}; recurrent state rows = {s.parallel} x (1 + {s.n_rs_seq}) "
            f"= {rows}."
        )
    else:
        lines.append("MTP off: nextn tensors are not loaded." if model.has_mtp else "Model has no MTP head.")
    if s.compute_buffer_mib is None:
        lines.append(
            "Compute buffers are an ESTIMATE per GPU (compute_terms_mib): activations calibrated on llama.cpp's "
            "own buffer sizes, plus the KQ mask copies (4 per GPU in a layer split), the hidden-state inputs and, "
            "for a quantized cache, CUDA's F16 copy of K/V for the flash-attention batch kernels."
        )
    else:
        lines.append(f"Compute buffers: flat {s.compute_buffer_mib} MiB per device (given).")
    lines.append(
        f"Per GPU also counted: the CUDA context ({s.cuda_context_mib} MiB) and the reserve ({s.reserve_mib} MiB "
        "left free, like llama.cpp's --fit-target)."
    )
    return lines


def _explain_instance(model, inst, worst_code, n):
    lines = []
    devs = inst["cuda_visible_devices"]
    if inst["split_mode"] == "none":
        d = inst["per_device"][0]
        lines.append(
            f"Instance {n}: GPU {devs} alone ({d['name']}): needs {d['total_mib']} MiB incl. {d['reserve_mib']} MiB "
            f"reserve, {d['free_before_mib']} MiB free -> -sm none, no -ts."
        )
    else:
        link = f"worst link {worst_code}" if worst_code else "link unknown"
        lines.append(
            f"Instance {n}: no smaller GPU set fits; GPUs {devs} ({link}) with -sm {inst['split_mode']} "
            f"-ts {inst['tensor_split_arg']}."
        )
        if inst["split_mode"] == "layer":
            for k, lay in enumerate(inst["layers"]):
                d = inst["per_device"][k]
                extra = []
                if lay["holds_mtp"]:
                    extra.append("MTP block")
                if lay["holds_output"]:
                    extra.append("output")
                blocks = (
                    f"blocks {lay['first']}-{min(lay['last'], model.n_layer_all - 1)}" if lay["blocks"] else "no blocks"
                )
                lines.append(
                    f"  CUDA{lay['cuda_index']} = GPU {lay['device']}: {blocks}"
                    + (f" + {' + '.join(extra)}" if extra else "")
                    + f"; {d['total_mib']} of {d['free_before_mib']} MiB free ({counted_words(d)})."
                )
            lines.append(
                "  Layer ranges are llama.cpp's own assignment for this -ts, re-computed with its float32 "
                "formula (src/llama-model.cpp:1556-1614)."
            )
    return lines


def _failure_numbers(inst):
    return [
        {
            "device": d["device"],
            "needed_mib": d["total_mib"],
            "available_mib": d["free_before_mib"],
            "short_mib": max(0, d["total_mib"] - d["free_before_mib"]),
            "counted_mib": {c: d[c + "_mib"] for c in COUNTED},
            "compute_terms_mib": d.get("compute_terms_mib"),
        }
        for d in inst["per_device"]
    ]


def _fits_anywhere(model, s, pool, matrix, max_gpus):
    return find_group(model, s, pool, matrix, max_gpus)[0] is not None


def _best_attempt(model, s, pool, matrix, max_gpus):
    """The plan on the preferred largest allowed GPU set (for numbers when nothing fits)."""
    for size in range(min(max_gpus, len(pool)), 0, -1):
        groups = _candidate_groups(pool, size, matrix)
        if groups:
            return plan_instance(model, s, groups[0][1])
    return None


def _suggest(model, s, pool, matrix, max_gpus):
    """What would fit: the largest context (multiple of 256) at these cache types, cheaper cache types."""
    out = {"max_context": None, "cache_types": []}
    lo_ctx = 256 * s.parallel
    if lo_ctx < s.context and _fits_anywhere(model, s.with_changes(model, context=lo_ctx), pool, matrix, max_gpus):
        lo, hi = lo_ctx // 256, s.context // 256  # lo fits; hi (or above) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if _fits_anywhere(model, s.with_changes(model, context=mid * 256), pool, matrix, max_gpus):
                lo = mid
            else:
                hi = mid
        out["max_context"] = lo * 256

    def per_value(name):
        return CACHE_TYPES[name][1] / CACHE_TYPES[name][0]

    bytes_now = per_value(s.cache_type_k) + per_value(s.cache_type_v)
    out["checked_cache_types"] = []
    for t in FALLBACK_CACHE_TYPES:
        if 2 * per_value(t) >= bytes_now:
            continue
        try:
            alt = s.with_changes(model, cache_type_k=t, cache_type_v=t)
        except PlanError:
            continue
        fits = _fits_anywhere(model, alt, pool, matrix, max_gpus)
        check = {"cache_type": t, "fits": fits, "short_mib": 0}
        if fits:
            out["cache_types"].append(t)
        else:
            attempt = _best_attempt(model, alt, pool, matrix, max_gpus)
            if attempt:
                check["short_mib"] = max(max(0, d["total_mib"] - d["free_before_mib"]) for d in attempt["per_device"])
        out["checked_cache_types"].append(check)
    return out


def _plan_context(model, context):
    """The total context to plan: the one given, else the model's training context (llama-server -c 0)."""
    if context is None:
        # llama-server -c 0: the model's training context (src/llama-context.cpp:133)
        if not model.context_length:
            raise PlanError("context is not set and the GGUF has no context_length; set context")
        context = model.context_length
    return context


def _host_notes(gpu_facts, skipped):
    """Explanation lines about the host's GPUs: the ones left out of the plan, and links that are unknown."""
    lines = []
    for sk in skipped:
        lines.append(f"Skipped GPU {sk['index']}: {sk['reason'].rstrip('.')}; planning on the other GPUs.")
    topo_error = (gpu_facts.get("topology") or {}).get("error")
    if topo_error:
        lines.append(f"GPU links unknown ({topo_error.rstrip('.')}): GPU sets are chosen by NUMA node and free memory.")
    return lines


def _settings_report(model, s, replicas):
    """The plan's ``settings``: the llama-server settings planned for, as llama.cpp derives them."""
    return {
        "context": s.context,
        "n_ctx": s.cells["n_ctx"],
        "n_ctx_seq": s.cells["n_ctx_seq"],
        "kv_cells": s.cells["cells"],
        "parallel": s.parallel,
        "cache_type_k": s.cache_type_k,
        "cache_type_v": s.cache_type_v,
        "mtp": s.mtp,
        "draft_n_max": s.draft_n_max,
        "draft_cache_type_k": s.draft_cache_type_k,
        "draft_cache_type_v": s.draft_cache_type_v,
        "recurrent_rows": s.parallel * (1 + s.n_rs_seq) if model.recurrent_layers else 0,
        "reserve_mib": s.reserve_mib,
        "cuda_context_mib": s.cuda_context_mib,
        "compute_buffer_mib": s.compute_buffer_mib,
        "compute_estimated": s.compute_buffer_mib is None,
        "n_batch": s.n_batch,
        "n_ubatch": s.n_ubatch,
        "split_mode": s.split_mode,
        "replicas": replicas,
    }


def _without_gpus(model, s, result, explanation, count, skipped, cpu_ok):
    """No usable GPU: a CPU plan where ``cpu_ok`` allows it (unset: only on a host with no GPUs), else refuse."""
    if cpu_ok is None:
        cpu_ok = count == 0
    if not cpu_ok:
        why = (
            "no GPUs"
            if count == 0
            else "no usable GPU (" + "; ".join(f"GPU {sk['index']}: {sk['reason']}" for sk in skipped) + ")"
        )
        raise PlanError(
            f"Nothing to plan on: {why}. Set cpu_ok=true to plan a CPU-only llama-server, or fix the GPUs.",
            {"skipped": skipped},
        )
    return _cpu_plan(model, s, result, explanation, count)


def _place_replicas(model, s, pool, matrix, max_gpus, target):
    """Replicas on disjoint GPU sets, each the smallest fitting set by preference, until ``target`` replicas (None:
    as many as fit) or no set fits; returns ``(instances, remaining GPUs, explanation lines)``."""
    instances, lines = [], []
    remaining = list(pool)
    while remaining and (target is None or len(instances) < target):
        inst, worst = find_group(model, s, remaining, matrix, max_gpus)
        if inst is None:
            break
        instances.append(inst)
        lines += _explain_instance(model, inst, worst, len(instances))
        used = set(inst["devices"])
        remaining = [g for g in remaining if g["index"] not in used]
    return instances, remaining, lines


def plan(gpu_facts, gguf, context=None, devices=None, max_gpus=None, replicas=1, cpu_ok=None, **settings):
    """Plan llama-server instance(s) for ``gguf`` on the host described by ``gpu_facts``.

    Raises PlanError (with ``details``: needed vs available per GPU, and what would fit) when the
    model does not fit; the returned dict is documented in the tensor_split module's RETURN block.
    """
    model = ModelSpec(gguf)
    s = Settings(model, _plan_context(model, context), **settings)
    if replicas != "auto":
        replicas = _int("replicas", replicas, 1)
    if max_gpus is not None:
        max_gpus = _int("max_gpus", max_gpus, 1)

    pool, skipped = usable_gpus(gpu_facts, devices)
    count = int(gpu_facts.get("count") or len(gpu_facts.get("gpus") or []))
    matrix = (gpu_facts.get("topology") or {}).get("matrix")
    explanation = _explain_model(model, s)
    explanation += _host_notes(gpu_facts, skipped)
    result = {
        "fits": False,
        "mode": "gpu",
        "instances": [],
        "skipped": skipped,
        "settings": _settings_report(model, s, replicas),
    }
    if not pool:
        return _without_gpus(model, s, result, explanation, count, skipped, cpu_ok)

    max_gpus = min(max_gpus or len(pool), len(pool))
    if s.split_mode == "none":
        max_gpus = 1
    target = None if replicas == "auto" else replicas
    instances, remaining, lines = _place_replicas(model, s, pool, matrix, max_gpus, target)
    if not instances or (target is not None and len(instances) < target):
        raise _refusal(model, s, pool, matrix, max_gpus, instances, target, skipped)
    explanation += lines

    result["fits"] = True
    result["instances"] = instances
    if replicas == "auto" or (target and target > 1):
        left = [g["index"] for g in remaining]
        explanation.append(
            f"{len(instances)} replica(s) on disjoint GPU sets" + (f"; GPUs {left} left unused." if left else ".")
        )
    result["explanation"] = explanation
    return result


def _refusal(model, s, pool, matrix, max_gpus, instances, target, skipped):
    if instances:
        msg = (
            f"replicas={target} requested but only {len(instances)} disjoint GPU set(s) can each hold "
            f"{model.name} at context {s.context}: "
            + ", ".join(f"[{i['cuda_visible_devices']}]" for i in instances)
            + ". Lower replicas (or use replicas=auto), or the context/cache types."
        )
        return PlanError(msg, {"instances": instances, "skipped": skipped})
    # best effort on the largest allowed set, to report numbers
    best = _best_attempt(model, s, pool, matrix, max_gpus)
    numbers = _failure_numbers(best) if best else []
    sugg = _suggest(model, s, pool, matrix, max_gpus)
    parts = [
        f"{model.name} does not fit at context {s.context} with KV {s.cache_type_k}/{s.cache_type_v}"
        + (f", MTP (draft-n-max {s.draft_n_max})" if s.mtp else "")
        + f", {s.parallel} slot(s), reserve {s.reserve_mib} MiB per GPU."
    ]
    if best:
        parts.append(
            f"Best attempt on GPU(s) {best['cuda_visible_devices']}"
            + (f" (-ts {best['tensor_split_arg']})" if best["tensor_split_arg"] else "")
            + ": "
            + "; ".join(
                f"GPU {n['device']} needs {n['needed_mib']} MiB ({counted_words(best['per_device'][k])}), "
                f"has {n['available_mib']} MiB free"
                for k, n in enumerate(numbers)
            )
            + "."
        )
    would = []
    if sugg["max_context"]:
        would.append(f"context <= {sugg['max_context']} at {s.cache_type_k}/{s.cache_type_v}")
    for t in sugg["cache_types"]:
        would.append(f"cache_type_k/v {t} at context {s.context}")
    too_big = [c for c in sugg.get("checked_cache_types", []) if not c["fits"]]
    if would:
        parts.append("Would fit: " + ", or ".join(would) + ".")
        if too_big:
            parts.append(
                "Checked and too big at this context: "
                + ", ".join(f"{c['cache_type']} (short by {c['short_mib']} MiB on one GPU)" for c in too_big)
                + "."
            )
    else:
        weights = _mib(sum(model.layer_bytes[: model.n_trunk]) + model.output_bytes)
        parts.append(
            f"No context or cache type fits on these GPUs (trunk + output weights alone are {weights} MiB): "
            "use a smaller quantization, more GPUs, or fewer busy GPUs."
        )
    details = {
        "needed_vs_available": numbers,
        "attempt": best,
        "suggestions": sugg,
        "skipped": skipped,
    }
    return PlanError(" ".join(parts), details)


def _cpu_plan(model, s, result, explanation, count):
    layout = _Layout(model, s, backend="cpu")
    by_cat = dict.fromkeys(CATEGORIES, 0)
    for c in layout.costs:
        for cat, v in c.items():
            by_cat[cat] += v
    compute = layout.compute(0, layout.n, 0, False)
    terms = layout.compute_terms(0, layout.n, 0, False)
    entry = {"device": "cpu", "name": "host"}
    for cat in CATEGORIES:
        entry[f"{cat}_mib"] = _mib(by_cat[cat])
    entry["weights_mib"] += _mib(model.token_embd_bytes)
    entry["compute_mib"] = _mib(compute)
    entry["compute_terms_mib"] = {k: round(v / MIB, 1) for k, v in terms.items() if v} if terms else None
    entry["cuda_context_mib"] = 0
    entry["reserve_mib"] = 0
    entry["total_mib"] = sum(entry[f"{cat}_mib"] for cat in COUNTED)
    entry["free_before_mib"] = None
    entry["free_after_mib"] = None
    entry["fits"] = True
    inst = {
        "devices": [],
        "cuda_visible_devices": None,
        "tensor_split": None,
        "tensor_split_arg": None,
        "split_mode": "none",
        "main_gpu": None,
        "n_gpu_layers": 0,
        "layers": [],
        "per_device": [entry],
        "fits": True,
        "required_mib": entry["total_mib"],
        "available_mib": None,
        "host_mib": entry["total_mib"],
    }
    inst["llama_args"] = _llama_args(model, s, None)
    result.update({"fits": True, "mode": "cpu", "instances": [inst]})
    why = "no GPUs on this host" if count == 0 else "no usable GPU"
    explanation.append(
        f"CPU plan ({why}): llama-server runs with -ngl 0 and no CUDA_VISIBLE_DEVICES; it needs about "
        f"{entry['total_mib']} MiB of host RAM (weights mmap'ed + KV + state + compute). Host RAM is not in "
        "gpu_facts, so this planner does not check it."
    )
    result["explanation"] = explanation
    return result
