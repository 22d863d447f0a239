#!/usr/bin/env python3
"""Header-faithful stand-in for Qwen3.6-27B Q4_K_M with MTP (test harness, not product code).

The real file (about 16.5 GB, e.g. ``Qwen3.6-27B-Q4_K_M-mtp.gguf``) lives on Hugging Face, which
the test machines cannot reach. This generator writes a GGUF whose *header* is what llama.cpp's
qwen35 loader reads from the real one, and whose data section is a sparse hole of the right size:

* metadata: the ``qwen35.*`` keys T's converter writes (conversion/qwen.py Qwen3NextModel /
  Qwen3_5TextModel, _QwenMtpMixin): block_count 65 with nextn_predict_layers 1,
  full_attention_interval 4 and the per-layer ``attention.recurrent_layers`` array, 24 heads /
  4 KV heads of 256, n_embd 5120, ffn 17408, context 262144, ssm conv_kernel 4 / state_size 128 /
  group_count 16 / time_step_rank 48 / inner_size 6144, rope dims 64 with sections [11, 11, 10, 0];
* the full tensor-info table, names and shapes exactly as T's qwen35 loader creates them
  (src/models/qwen35.cpp load_arch_tensors, src/llama-arch.cpp names): 48 gated-delta-net layers,
  16 gated full-attention layers (every 4th), the MTP block ``blk.64`` (full attention + nextn
  eh_proj/enorm/hnorm/shared_head_norm), token_embd, output_norm and an untied output;
* ggml types as T's quantizer picks them for LLAMA_FTYPE_MOSTLY_Q4_K_M (src/llama-quant.cpp
  llama_tensor_get_type_impl): Q4_K by default; Q6_K for output and for the attn_v/attn_qkv and
  ffn_down tensors that ``use_more_bits`` selects; F32 for 1-D tensors, norms, ssm_a, ssm_dt.bias
  and ssm_conv1d;
* then the file is extended to its full size with ``truncate`` (a sparse hole): a structurally
  valid ~16.9 GB GGUF that costs about 11 MB of disk (the tokenizer arrays).

What is NOT faithful: the tensor data (zeros), and the tokenizer *strings* (synthetic tokens and
merges of realistic count and size, placeholder special-token ids and chat template). The
metadata keys, the tensor table and therefore every size derived from the header are real.

Written with the ``gguf`` package's GGUFWriter (header, KV and tensor infos only; no tensor data).

CLI:  python3 tests/harness/gguf/qwen36_27b_header.py OUT.gguf [--no-mtp] [--no-recurrent-layers-key]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

# Qwen3.6-27B text model (docs: /work/shared/LLAMACPP.md section 7; conversion/qwen.py)
HPARAMS = {
    "n_layer": 64,  # trunk
    "n_nextn": 1,  # MTP blocks appended (blk.64)
    "n_embd": 5120,
    "n_ff": 17408,
    "n_head": 24,
    "n_head_kv": 4,
    "head_dim": 256,
    "n_vocab": 248320,
    "n_ctx": 262144,
    "full_attention_interval": 4,
    "ssm_conv_kernel": 4,
    "ssm_state_size": 128,  # linear_key_head_dim (= linear_value_head_dim)
    "ssm_group_count": 16,  # linear_num_key_heads
    "ssm_time_step_rank": 48,  # linear_num_value_heads
    "ssm_inner_size": 6144,  # linear_value_head_dim * linear_num_value_heads
    "rope_dim": 64,  # head_dim * partial_rotary_factor 0.25
    "rope_sections": [11, 11, 10, 0],
    "rope_freq_base": 10_000_000.0,
    "rms_eps": 1e-6,
}

N_MERGES = 247_000  # synthetic BPE merges, about the real tokenizer's count

# ggml type ids (ggml/include/ggml.h) and sizes (bytes per block, block size)
F32, Q4_K, Q6_K = 0, 12, 14
_TYPE_SIZES = {F32: (4, 1), Q4_K: (144, 256), Q6_K: (210, 256)}
LLAMA_FTYPE_MOSTLY_Q4_K_M = 15
ALIGNMENT = 32


def _nbytes(ggml_type: int, ne: tuple[int, ...]) -> int:
    size, blck = _TYPE_SIZES[ggml_type]
    n = 1
    for d in ne:
        n *= d
    assert ne[0] % blck == 0, (ggml_type, ne)
    return n // blck * size


def is_recurrent(il: int, hp: dict = HPARAMS) -> bool:
    """T qwen35.cpp: trunk layer il is gated delta net unless (il + 1) % full_attention_interval == 0."""
    return il < hp["n_layer"] and (il + 1) % hp["full_attention_interval"] != 0


def tensor_shapes(hp: dict = HPARAMS, mtp: bool = True) -> list[tuple[str, tuple[int, ...]]]:
    """(name, ne) in file order, exactly the tensors T's qwen35 loader creates for these hparams."""
    n_embd, n_ff, n_vocab = hp["n_embd"], hp["n_ff"], hp["n_vocab"]
    hd, n_head, n_head_kv = hp["head_dim"], hp["n_head"], hp["n_head_kv"]
    head_k_dim = head_v_dim = hp["ssm_state_size"]
    n_k_heads, n_v_heads = hp["ssm_group_count"], hp["ssm_time_step_rank"]
    key_dim, value_dim = head_k_dim * n_k_heads, head_v_dim * n_v_heads
    conv_dim = key_dim * 2 + value_dim
    n_layer_all = hp["n_layer"] + (hp["n_nextn"] if mtp else 0)

    out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (n_embd, n_vocab))]

    def attention(b: str) -> None:
        out.extend(
            [
                (b + "attn_q.weight", (n_embd, hd * n_head * 2)),  # query + output gate
                (b + "attn_k.weight", (n_embd, hd * n_head_kv)),
                (b + "attn_v.weight", (n_embd, hd * n_head_kv)),
                (b + "attn_output.weight", (hd * n_head, n_embd)),
                (b + "attn_q_norm.weight", (hd,)),
                (b + "attn_k_norm.weight", (hd,)),
            ]
        )

    def ffn(b: str) -> None:
        out.extend(
            [
                (b + "ffn_gate.weight", (n_embd, n_ff)),
                (b + "ffn_down.weight", (n_ff, n_embd)),
                (b + "ffn_up.weight", (n_embd, n_ff)),
            ]
        )

    for il in range(n_layer_all):
        b = f"blk.{il}."
        out.append((b + "attn_norm.weight", (n_embd,)))
        out.append((b + "post_attention_norm.weight", (n_embd,)))
        if il < hp["n_layer"] and is_recurrent(il, hp):
            out.extend(
                [
                    (b + "attn_qkv.weight", (n_embd, conv_dim)),
                    (b + "attn_gate.weight", (n_embd, value_dim)),
                    (b + "ssm_conv1d.weight", (hp["ssm_conv_kernel"], conv_dim)),
                    (b + "ssm_dt.bias", (n_v_heads,)),
                    (b + "ssm_a", (n_v_heads,)),
                    (b + "ssm_beta.weight", (n_embd, n_v_heads)),
                    (b + "ssm_alpha.weight", (n_embd, n_v_heads)),
                    (b + "ssm_norm.weight", (head_v_dim,)),
                    (b + "ssm_out.weight", (value_dim, n_embd)),
                ]
            )
        else:
            attention(b)
        ffn(b)
        if il >= hp["n_layer"]:
            out.extend(
                [
                    (b + "nextn.eh_proj.weight", (2 * n_embd, n_embd)),
                    (b + "nextn.enorm.weight", (n_embd,)),
                    (b + "nextn.hnorm.weight", (n_embd,)),
                    (b + "nextn.shared_head_norm.weight", (n_embd,)),
                ]
            )
    out.append(("output_norm.weight", (n_embd,)))
    out.append(("output.weight", (n_embd, n_vocab)))
    return out


def q4_k_m_types(shapes: list[tuple[str, tuple[int, ...]]], n_layer_all: int) -> list[int]:
    """ggml type per tensor as T's llama_tensor_get_type_impl picks it for MOSTLY_Q4_K_M (this tensor set)."""

    def use_more_bits(i: int, n: int) -> bool:
        return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2

    n_attention_wv = sum(1 for name, _ in shapes if "attn_v.weight" in name or "attn_qkv.weight" in name)
    i_attention_wv = i_ffn_down = 0
    types = []
    for name, ne in shapes:
        quantize = len(ne) >= 2 and name.endswith("weight") and "_norm.weight" not in name and "ssm_conv1d" not in name
        if not quantize:
            types.append(F32)
        elif name == "output.weight":
            types.append(Q6_K)
        elif "attn_v.weight" in name or "attn_qkv.weight" in name:
            types.append(Q6_K if use_more_bits(i_attention_wv, n_attention_wv) else Q4_K)
            i_attention_wv += 1
        elif "ffn_down" in name:
            types.append(Q6_K if use_more_bits(i_ffn_down, n_layer_all) else Q4_K)
            i_ffn_down += 1
        else:
            types.append(Q4_K)
    return types


def write_qwen36_27b_header(
    out: str | os.PathLike, *, mtp: bool = True, recurrent_layers_key: bool = True, sparse_data: bool = True
) -> dict:
    """Write the stand-in GGUF to `out`. Returns {"path", "size_bytes", "tensor_count", "data_offset", "tensors"}.

    mtp=False writes the trunk only (block_count 64, no nextn key), like ``convert_hf_to_gguf.py --no-mtp``.
    recurrent_layers_key=False leaves out ``qwen35.attention.recurrent_layers`` (older converters), so
    readers must fall back to full_attention_interval. sparse_data=False stops after the tensor-info
    table (a deliberately truncated file).
    """
    import gguf  # the writer llama.cpp's converters use; only needed to generate

    hp = HPARAMS
    n_layer_all = hp["n_layer"] + (hp["n_nextn"] if mtp else 0)
    arch = "qwen35"
    out = Path(out)
    w = gguf.GGUFWriter(out, arch)

    w.add_type("model")
    w.add_name("Qwen3.6 27B")
    w.add_basename("Qwen3.6")
    w.add_size_label("27B")
    w.add_license("apache-2.0")
    w.add_block_count(n_layer_all)
    w.add_context_length(hp["n_ctx"])
    w.add_embedding_length(hp["n_embd"])
    w.add_feed_forward_length(hp["n_ff"])
    w.add_head_count(hp["n_head"])
    w.add_head_count_kv(hp["n_head_kv"])
    w.add_rope_freq_base(hp["rope_freq_base"])
    w.add_layer_norm_rms_eps(hp["rms_eps"])
    w.add_key_length(hp["head_dim"])
    w.add_value_length(hp["head_dim"])
    w.add_file_type(LLAMA_FTYPE_MOSTLY_Q4_K_M)
    w.add_ssm_conv_kernel(hp["ssm_conv_kernel"])
    w.add_ssm_state_size(hp["ssm_state_size"])
    w.add_ssm_group_count(hp["ssm_group_count"])
    w.add_ssm_time_step_rank(hp["ssm_time_step_rank"])
    w.add_ssm_inner_size(hp["ssm_inner_size"])
    if recurrent_layers_key:
        # T gguf_writer.add_recurrent_layers (not in gguf 0.19): a BOOL array over all blocks
        w.add_array(f"{arch}.attention.recurrent_layers", [is_recurrent(i, hp) for i in range(n_layer_all)])
    w.add_full_attention_interval(hp["full_attention_interval"])
    w.add_rope_dimension_count(hp["rope_dim"])
    w.add_rope_dimension_sections(hp["rope_sections"])
    if mtp:
        w.add_nextn_predict_layers(hp["n_nextn"])

    # tokenizer: real counts, synthetic strings (see module docstring)
    n_vocab = hp["n_vocab"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35")
    w.add_token_list([f"t{i:06d}" for i in range(n_vocab)])
    n_special = 320
    w.add_token_types([1] * (n_vocab - n_special) + [3] * n_special)
    w.add_token_merges([f"m{i:06d} n{i:06d}" for i in range(N_MERGES)])
    w.add_eos_token_id(n_vocab - n_special + 46)
    w.add_pad_token_id(n_vocab - n_special + 44)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}")
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    shapes = tensor_shapes(hp, mtp)
    types = q4_k_m_types(shapes, n_layer_all)
    data_size = 0
    tensors = []
    for (name, ne), t in zip(shapes, types, strict=True):
        nbytes = _nbytes(t, ne)
        # GGUFWriter takes numpy order (outermost first) and a byte count; raw_dtype sets the ggml type
        w.add_tensor_info(
            name, tuple(reversed(ne)), np.dtype(np.float32), nbytes, raw_dtype=gguf.GGMLQuantizationType(t)
        )
        tensors.append((name, ne, t, nbytes))
        data_size += (nbytes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()

    header_end = out.stat().st_size
    data_offset = (header_end + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
    size = data_offset + data_size
    if sparse_data:
        os.truncate(out, size)  # a hole: the data section reads as zeros and takes no disk blocks
    return {
        "path": str(out),
        "size_bytes": size if sparse_data else header_end,
        "tensor_count": len(tensors),
        "data_offset": data_offset,
        "tensors": tensors,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="output .gguf path")
    p.add_argument("--no-mtp", action="store_true", help="trunk only (block_count 64, no nextn block)")
    p.add_argument(
        "--no-recurrent-layers-key", action="store_true", help="omit qwen35.attention.recurrent_layers (older files)"
    )
    args = p.parse_args(argv)
    r = write_qwen36_27b_header(args.out, mtp=not args.no_mtp, recurrent_layers_key=not args.no_recurrent_layers_key)
    used = os.stat(r["path"]).st_blocks * 512
    print(f"{r['path']}: {r['size_bytes']} bytes ({r['tensor_count']} tensors), {used} bytes on disk")
    return 0


if __name__ == "__main__":
    sys.exit(main())
