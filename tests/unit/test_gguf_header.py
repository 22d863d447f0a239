"""Tests of the header-only GGUF reader and the gguf_info summary.

Oracles: the ``gguf`` package (GGUFWriter writes the files, GGUFReader reads them back), llama.cpp's
own tables where its source tree is present (T, commit 0c1e570), and the rules of T's loader written
out in the tests (which layers are recurrent, the recurrent state formula). Files are real GGUFs in
tmp_path; the Qwen3.6-27B stand-in is a real 16.8 GB (sparse) file.
"""

from __future__ import annotations

import importlib.util
import os
import re
import struct
import tarfile
from pathlib import Path

import gguf
import numpy as np
import pytest
from ansible_collections.llamafleet.mtp.plugins.module_utils.gguf_header import (
    GGML_TYPES,
    LLAMA_FTYPES,
    GGUFError,
    find_split_paths,
    gguf_info,
    kv_bytes_per_token,
    read_gguf_header,
    read_gguf_parts,
    tensor_nbytes,
)

from tests.harness.gguf import qwen36_27b_header as qwen

# T: the llama.cpp tree vendored in the llama-cpp-python 0.3.36 sdist, the source the harness's mirror is made of
# (tests/harness/llamacpp/mirror.sh downloads it into the cache; the full lane runs that before the unit tests)
T_SDIST = (
    Path(os.environ.get("LLAMA_MTP_CACHE", "/var/cache/llama-mtp-fleet")) / "src" / "llama_cpp_python-0.3.36.tar.gz"
)
T_FILES = ("gguf-py/gguf/constants.py", "ggml/include/ggml.h", "include/llama.h")
VT = gguf.GGUFValueType
QT = gguf.GGMLQuantizationType


# ---------------------------------------------------------------------------------------------
# helpers: write models with the gguf package, compare with its reader
# ---------------------------------------------------------------------------------------------


def _byte_shape(ne: tuple[int, ...], qtype: int) -> tuple[int, ...]:
    blck, size = gguf.GGML_QUANT_SIZES[QT(qtype)]
    np_shape = tuple(reversed(ne))
    return (*np_shape[:-1], np_shape[-1] // blck * size)


def write_model(path: Path, arch: str, kv: list, tensors: list, alignment=None, **writer_kw) -> list[Path]:
    """Write a GGUF with real tensor data (zeros) and return the written file(s).

    kv: (key, value, GGUFValueType, sub_type or None); tensors: (name, ne, ggml type id).
    """
    w = gguf.GGUFWriter(path, arch, **writer_kw)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, value, vtype, sub in kv:
        w.add_key_value(key, value, vtype, sub_type=sub)
    for name, ne, t in tensors:
        if t == QT.F32:
            w.add_tensor(name, np.zeros(tuple(reversed(ne)), dtype=np.float32))
        elif t == QT.F16:
            w.add_tensor(name, np.zeros(tuple(reversed(ne)), dtype=np.float16))
        else:
            w.add_tensor(name, np.zeros(_byte_shape(ne, t), dtype=np.uint8), raw_dtype=QT(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return w.format_shard_names(Path(path))


def assert_matches_reader(path: Path) -> None:
    """Our header of `path` equals what the gguf package's GGUFReader reads."""
    ours = read_gguf_header(path)
    ref = gguf.GGUFReader(path)
    fields = {k: f for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert list(ours.metadata) == list(fields)
    for key, f in fields.items():
        assert ours.metadata[key] == f.contents(), key
        sub = f.types[-1] if f.types[0] == VT.ARRAY else None
        assert ours.value_types[key] == (f.types[0], sub), key
    assert ours.version == ref.fields["GGUF.version"].contents()
    assert ours.alignment == ref.alignment
    assert ours.data_offset == ref.data_offset
    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    for mine, theirs in zip(ours.tensors, ref.tensors, strict=True):
        assert mine.dims == tuple(int(x) for x in theirs.shape), mine.name
        assert mine.ggml_type == int(theirs.tensor_type), mine.name
        assert mine.n_bytes == theirs.n_bytes, mine.name
        assert mine.n_elements == theirs.n_elements, mine.name
        assert ours.data_offset + mine.offset == theirs.data_offset, mine.name
    assert ours.file_size == os.path.getsize(path)


def llama_kv(arch: str, n_layer: int, n_embd: int, n_head: int, n_head_kv, n_ff, vocab: list[str] | None) -> list:
    kv = [
        (f"{arch}.block_count", n_layer, VT.UINT32, None),
        (f"{arch}.context_length", 4096, VT.UINT32, None),
        (f"{arch}.embedding_length", n_embd, VT.UINT32, None),
        (f"{arch}.attention.head_count", n_head, VT.UINT32, None),
        ("general.file_type", 7, VT.UINT32, None),
        ("general.name", "tiny", VT.STRING, None),
    ]
    if isinstance(n_head_kv, list):
        kv.append((f"{arch}.attention.head_count_kv", n_head_kv, VT.ARRAY, VT.INT32))
    elif n_head_kv is not None:
        kv.append((f"{arch}.attention.head_count_kv", n_head_kv, VT.UINT32, None))
    if isinstance(n_ff, list):
        kv.append((f"{arch}.feed_forward_length", n_ff, VT.ARRAY, VT.INT32))
    else:
        kv.append((f"{arch}.feed_forward_length", n_ff, VT.UINT32, None))
    if vocab is not None:
        kv.append(("tokenizer.ggml.tokens", vocab, VT.ARRAY, VT.STRING))
    return kv


def llama_tensors(n_layer: int, n_embd: int, n_vocab: int, kv_dim: int, n_ff: int, tied=False, wtype=QT.Q8_0):
    t = [("token_embd.weight", (n_embd, n_vocab), wtype)]
    for i in range(n_layer):
        b = f"blk.{i}."
        t += [
            (b + "attn_norm.weight", (n_embd,), QT.F32),
            (b + "attn_q.weight", (n_embd, n_embd), wtype),
            (b + "attn_k.weight", (n_embd, kv_dim), wtype),
            (b + "attn_v.weight", (n_embd, kv_dim), QT.F16),
            (b + "attn_output.weight", (n_embd, n_embd), wtype),
            (b + "ffn_norm.weight", (n_embd,), QT.F32),
            (b + "ffn_gate.weight", (n_embd, n_ff), wtype),
            (b + "ffn_up.weight", (n_embd, n_ff), wtype),
            (b + "ffn_down.weight", (n_ff, n_embd), wtype),
        ]
    t.append(("output_norm.weight", (n_embd,), QT.F32))
    if not tied:
        t.append(("output.weight", (n_embd, n_vocab), QT.Q6_K if n_embd % 256 == 0 else wtype))
    t.append(("rope_freqs.weight", (32,), QT.F32))
    return t


# ---------------------------------------------------------------------------------------------
# type tables
# ---------------------------------------------------------------------------------------------


def test_ggml_type_sizes_match_gguf_package():
    """Every type the gguf package knows has the same block/type size here.

    gguf 0.19 still has Q8_1 as 40 bytes; T's ggml-common.h block_q8_1 is two ggml_half + 32 int8
    = 36 (and T's gguf-py says 2 + 2 + 32), so that one entry must be T's value, not the package's.
    """
    for qtype, (blck, size) in gguf.GGML_QUANT_SIZES.items():
        name, my_blck, my_size = GGML_TYPES[int(qtype)]
        assert name == qtype.name
        if qtype == QT.Q8_1:
            assert (my_blck, my_size) == (32, 2 + 2 + 32)
        else:
            assert (my_blck, my_size) == (blck, size), name


@pytest.fixture(scope="module")
def T(tmp_path_factory):
    """The files of T these tests read, taken from the harness's sdist. Skipped in the fast lane (no harness there);
    a failure in the full lane (LLAMA_SERVER_BIN set: the harness ran), where a missing tree would hide the checks."""
    if not T_SDIST.is_file():
        if os.environ.get("LLAMA_SERVER_BIN"):
            pytest.fail(f"the harness ran (LLAMA_SERVER_BIN is set) but its llama.cpp source {T_SDIST} is missing")
        pytest.skip(f"llama.cpp source {T_SDIST} not here (tests/harness/llamacpp/mirror.sh makes it; full lane)")
    out = tmp_path_factory.mktemp("llama-tree")
    with tarfile.open(T_SDIST) as tar:
        for rel in T_FILES:
            data = tar.extractfile(f"llama_cpp_python-0.3.36/vendor/llama.cpp/{rel}").read()
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (out / rel).write_bytes(data)
    return out


def test_ggml_type_sizes_match_llama_cpp_tree(T):
    spec = importlib.util.spec_from_file_location("t_gguf_constants", T / "gguf-py/gguf/constants.py")
    consts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(consts)
    expected = {int(q): (q.name, b, s) for q, (b, s) in consts.GGML_QUANT_SIZES.items()}
    assert expected == GGML_TYPES
    # ids as in ggml.h enum ggml_type
    enum = re.findall(r"^\s*GGML_TYPE_(\w+)\s*=\s*(\d+),", (T / "ggml/include/ggml.h").read_text(), re.M)
    ids = {int(v): n for n, v in enum if n != "COUNT"}
    assert {i: GGML_TYPES[i][0] for i in GGML_TYPES} == ids


def test_llama_ftype_names_match_gguf_package():
    for member in gguf.LlamaFileType:
        assert LLAMA_FTYPES[int(member)] == member.name


def test_llama_ftype_names_match_llama_h(T):
    text = (T / "include/llama.h").read_text()
    body = text[text.index("enum llama_ftype {") : text.index("};", text.index("enum llama_ftype {"))]
    found = {int(v): n for n, v in re.findall(r"^\s*LLAMA_FTYPE_(\w+)\s*=\s*(\d+),", body, re.M)}
    assert found == LLAMA_FTYPES


def test_tensor_nbytes():
    assert tensor_nbytes(int(QT.Q4_K), (5120, 17408)) == 5120 * 17408 // 256 * 144
    assert tensor_nbytes(int(QT.F32), (7,)) == 28
    with pytest.raises(GGUFError, match="not a multiple of block size 256"):
        tensor_nbytes(int(QT.Q4_K), (100, 2))
    with pytest.raises(GGUFError, match="unknown ggml type 4"):
        tensor_nbytes(4, (32,))


# ---------------------------------------------------------------------------------------------
# the reader against GGUFReader
# ---------------------------------------------------------------------------------------------

ALL_VALUE_TYPES = [
    ("t.u8", 200, VT.UINT8, None),
    ("t.i8", -100, VT.INT8, None),
    ("t.u16", 60000, VT.UINT16, None),
    ("t.i16", -30000, VT.INT16, None),
    ("t.u32", 4_000_000_000, VT.UINT32, None),
    ("t.i32", -2_000_000_000, VT.INT32, None),
    ("t.f32", 0.1, VT.FLOAT32, None),
    ("t.bool_true", True, VT.BOOL, None),
    ("t.bool_false", False, VT.BOOL, None),
    ("t.str", "Ünïcødé ✓ and \n newline", VT.STRING, None),
    ("t.empty_str", "", VT.STRING, None),
    ("t.u64", 2**63 + 5, VT.UINT64, None),
    ("t.i64", -(2**62), VT.INT64, None),
    ("t.f64", 1e-300, VT.FLOAT64, None),
    ("t.arr_u8", [0, 1, 255], VT.ARRAY, VT.UINT8),
    ("t.arr_i8", [-128, 127], VT.ARRAY, VT.INT8),
    ("t.arr_u16", [1, 65535], VT.ARRAY, VT.UINT16),
    ("t.arr_i16", [-32768, 5], VT.ARRAY, VT.INT16),
    ("t.arr_u32", [7] * 1000, VT.ARRAY, VT.UINT32),
    ("t.arr_i32", [-1, 0, 1], VT.ARRAY, VT.INT32),
    ("t.arr_f32", [0.5, -2.25, 1e10], VT.ARRAY, VT.FLOAT32),
    ("t.arr_bool", [True, False, True], VT.ARRAY, VT.BOOL),
    ("t.arr_str", ["a", "", "ß" * 300, "<0x0A>"], VT.ARRAY, VT.STRING),
    ("t.arr_u64", [2**64 - 1, 0], VT.ARRAY, VT.UINT64),
    ("t.arr_i64", [-(2**63), 2**63 - 1], VT.ARRAY, VT.INT64),
    ("t.arr_f64", [3.141592653589793], VT.ARRAY, VT.FLOAT64),
]


@pytest.mark.parametrize("endian", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_every_value_type_and_tensor_type_matches_gguf_reader(tmp_path, endian):
    vocab = [f"tok{i}" for i in range(300)]
    kv = llama_kv("llama", 2, 256, 4, 2, 512, vocab) + ALL_VALUE_TYPES
    tensors = llama_tensors(2, 256, 300 - 300 % 32, 128, 512)
    tensors += [
        ("x.q4_0", (64, 3), QT.Q4_0),
        ("x.q5_1", (32,), QT.Q5_1),
        ("x.q2_k", (256, 2), QT.Q2_K),
        ("x.q3_k", (512,), QT.Q3_K),
        ("x.q5_k", (256, 1, 2), QT.Q5_K),
        ("x.iq4_xs", (256, 2, 1, 2), QT.IQ4_XS),
        ("x.iq2_xxs", (256,), QT.IQ2_XXS),
        ("x.bf16", (3, 5), QT.BF16),
        ("x.i32", (9,), QT.I32),
        ("x.empty", (0, 4), QT.F32),
    ]
    [path] = write_model(tmp_path / "m.gguf", "llama", kv, tensors, endianess=endian)
    assert_matches_reader(path)
    h = read_gguf_header(path)
    assert h.byte_order == ("big" if endian == gguf.GGUFEndian.BIG else "little")
    assert h.version == 3
    assert h.metadata["t.u64"] == 2**63 + 5
    assert h.metadata["t.arr_bool"] == [True, False, True]
    assert h.metadata["t.str"] == "Ünïcødé ✓ and \n newline"
    assert h.tensors[-1].n_bytes == 0


def test_custom_alignment_matches_gguf_reader(tmp_path):
    kv = llama_kv("llama", 1, 64, 2, 2, 96, None)
    [path] = write_model(tmp_path / "a.gguf", "llama", kv, llama_tensors(1, 64, 64, 64, 96), alignment=256)
    assert_matches_reader(path)
    h = read_gguf_header(path)
    assert h.alignment == 256 and h.data_offset % 256 == 0
    assert all(t.offset % 256 == 0 for t in h.tensors)


def test_alignment_key_that_disagrees_with_offsets_is_refused(tmp_path):
    # general.alignment 256 written as a plain key while the writer laid tensors out 32-aligned:
    # GGUFReader accepts this, T's gguf_init_from_reader (offset != running padded size) does not
    kv = llama_kv("llama", 1, 64, 2, 2, 96, None) + [("general.alignment", 256, VT.UINT32, None)]
    [path] = write_model(tmp_path / "a.gguf", "llama", kv, llama_tensors(1, 64, 64, 64, 96))
    with pytest.raises(
        GGUFError, match=r"has data offset \d+, expected \d+ \(tensor data must be contiguous and 256-aligned\)"
    ):
        read_gguf_header(path)


def test_llama_summary(tmp_path):
    n_layer, n_embd, n_head, n_kv, n_ff, n_vocab = 3, 256, 8, 2, 512, 320
    vocab = [f"t{i}" for i in range(n_vocab)]
    tensors = llama_tensors(n_layer, n_embd, n_vocab, n_kv * n_embd // n_head, n_ff)
    [path] = write_model(
        tmp_path / "llama.gguf", "llama", llama_kv("llama", n_layer, n_embd, n_head, n_kv, n_ff, vocab), tensors
    )
    info = gguf_info(path)
    ref = gguf.GGUFReader(path)
    by_name = {t.name: t.n_bytes for t in ref.tensors}
    assert info["architecture"] == "llama"
    assert info["name"] == "tiny"
    assert info["file_type"] == 7 and info["file_type_name"] == "MOSTLY_Q8_0"
    assert info["size_bytes"] == path.stat().st_size
    assert info["split"] == {"count": 1, "paths": [str(path)]}
    assert info["tensor_count"] == len(ref.tensors)
    assert (info["block_count"], info["nextn_predict_layers"], info["mtp"], info["trunk_layers"]) == (3, 0, False, 3)
    assert info["vocab_size"] == n_vocab
    assert (info["head_count"], info["head_count_kv"]) == (n_head, n_kv)
    # key/value length default to n_embd / n_head
    assert info["key_length"] == info["value_length"] == n_embd // n_head
    assert info["kv_layers"] == [0, 1, 2]
    assert info["recurrent"] is None
    tb = info["tensor_bytes"]
    for i in range(n_layer):
        assert tb["per_layer"][i] == sum(v for k, v in by_name.items() if k.startswith(f"blk.{i}."))
    assert tb["token_embd"] == by_name["token_embd.weight"]
    assert tb["output"] == by_name["output.weight"]
    assert tb["output_norm"] == by_name["output_norm.weight"]
    assert tb["other"] == by_name["rope_freqs.weight"]
    assert tb["mtp"] == 0
    assert sum(tb["per_layer"]) + tb["token_embd"] + tb["output"] + tb["output_norm"] + tb["other"] == sum(
        by_name.values()
    )
    assert kv_bytes_per_token(info) == n_layer * 2 * n_kv * (n_embd // n_head) * 2


def test_tied_output_and_vocab_from_token_embd(tmp_path):
    # no output.weight (tied to token_embd), no tokenizer: vocab from token_embd's second dim
    kv = llama_kv("llama", 1, 64, 2, None, 96, None)
    [path] = write_model(tmp_path / "tied.gguf", "llama", kv, llama_tensors(1, 64, 96, 64, 96, tied=True))
    info = gguf_info(path)
    assert info["tensor_bytes"]["output"] == 0
    assert info["vocab_size"] == 96
    assert info["head_count_kv"] == 2  # defaults to head_count


def test_split_set_written_by_gguf_package(tmp_path):
    n_layer, n_embd, n_vocab = 2, 64, 96
    kv = llama_kv("llama", n_layer, n_embd, 2, 2, 96, [f"t{i}" for i in range(n_vocab)])
    parts = write_model(
        tmp_path / "big.gguf", "llama", kv, llama_tensors(n_layer, n_embd, n_vocab, 64, 96), split_max_tensors=7
    )
    assert len(parts) == 4
    assert [p.name for p in parts] == [f"big-{i:05d}-of-00004.gguf" for i in range(1, 5)]
    for p in parts:
        assert_matches_reader(p)
    single = tmp_path / "single"
    single.mkdir()
    [one] = write_model(single / "big.gguf", "llama", kv, llama_tensors(n_layer, n_embd, n_vocab, 64, 96))

    whole = gguf_info(one)
    for given in (parts[0], parts[2], parts[3]):
        info = gguf_info(given)
        assert info["split"] == {"count": 4, "paths": [str(p) for p in parts]}
        assert info["size_bytes"] == sum(p.stat().st_size for p in parts)
        assert info["tensor_count"] == whole["tensor_count"]
        assert info["tensor_bytes"] == whole["tensor_bytes"]
        assert info["vocab_size"] == n_vocab
        assert info["kv_layers"] == whole["kv_layers"]
    assert [h.path for h in read_gguf_parts(parts[1])] == [str(p) for p in parts]

    parts[2].unlink()
    with pytest.raises(GGUFError, match=r"split set of 4 parts is incomplete, missing: .*big-00003-of-00004\.gguf"):
        gguf_info(parts[0])


def test_split_part_with_wrong_name_is_refused(tmp_path):
    kv = llama_kv("llama", 1, 64, 2, 2, 96, None)
    parts = write_model(tmp_path / "s.gguf", "llama", kv, llama_tensors(1, 64, 64, 64, 96), split_max_tensors=6)
    n = len(parts)
    assert n > 1
    renamed = tmp_path / "renamed.gguf"
    parts[0].rename(renamed)
    with pytest.raises(
        GGUFError, match=rf"invalid split file name: part 1 of {n} must be named '<prefix>-00001-of-0000{n}.gguf'"
    ):
        find_split_paths(read_gguf_header(renamed))


def test_split_part_from_another_set_is_refused(tmp_path):
    kv = llama_kv("llama", 1, 64, 2, 2, 96, None)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = write_model(tmp_path / "a" / "m.gguf", "llama", kv, llama_tensors(1, 64, 64, 64, 96), split_max_tensors=6)
    b = write_model(tmp_path / "b" / "m.gguf", "llama", kv, llama_tensors(1, 64, 64, 64, 96), split_max_tensors=3)
    assert len(a) != len(b)
    # part 2 of one set swapped for part 1 of a set with another part count
    b[0].replace(a[1])
    with pytest.raises(GGUFError, match=rf"{a[1].name}: invalid split file: split\.no is 0, expected 1"):
        gguf_info(a[0])


# ---------------------------------------------------------------------------------------------
# hybrid and recurrent architectures: T's rules, written out here
# ---------------------------------------------------------------------------------------------


def t_state_bytes_ssm(d_conv, d_inner, n_group, d_state):
    """T llama_hparams n_embd_r() + n_embd_s() for Mamba / gated delta net layers, F32."""
    return 4 * ((d_conv - 1) * (d_inner + 2 * n_group * d_state) + d_state * d_inner)


def small_qwen35(path: Path, *, with_array: bool, interval: int = 4, n_trunk: int = 8, nextn: int = 1) -> Path:
    """A small qwen35 (hybrid gated delta net) model with T's qwen35 tensor names and shapes."""
    hp = dict(
        qwen.HPARAMS,
        n_layer=n_trunk,
        n_nextn=nextn,
        n_embd=256,
        n_ff=512,
        n_head=4,
        n_head_kv=2,
        head_dim=64,
        n_vocab=512,
        full_attention_interval=interval,
        ssm_state_size=32,
        ssm_group_count=2,
        ssm_time_step_rank=4,
        ssm_inner_size=128,
    )
    n_all = n_trunk + nextn
    arch = "qwen35"
    kv = [
        (f"{arch}.block_count", n_all, VT.UINT32, None),
        (f"{arch}.context_length", 8192, VT.UINT32, None),
        (f"{arch}.embedding_length", hp["n_embd"], VT.UINT32, None),
        (f"{arch}.feed_forward_length", hp["n_ff"], VT.UINT32, None),
        (f"{arch}.attention.head_count", hp["n_head"], VT.UINT32, None),
        (f"{arch}.attention.head_count_kv", hp["n_head_kv"], VT.UINT32, None),
        (f"{arch}.attention.key_length", hp["head_dim"], VT.UINT32, None),
        (f"{arch}.attention.value_length", hp["head_dim"], VT.UINT32, None),
        (f"{arch}.ssm.conv_kernel", 4, VT.UINT32, None),
        (f"{arch}.ssm.state_size", hp["ssm_state_size"], VT.UINT32, None),
        (f"{arch}.ssm.group_count", hp["ssm_group_count"], VT.UINT32, None),
        (f"{arch}.ssm.time_step_rank", hp["ssm_time_step_rank"], VT.UINT32, None),
        (f"{arch}.ssm.inner_size", hp["ssm_inner_size"], VT.UINT32, None),
        (f"{arch}.full_attention_interval", interval, VT.UINT32, None),
        ("general.file_type", 1, VT.UINT32, None),
    ]
    if nextn:
        kv.append((f"{arch}.nextn_predict_layers", nextn, VT.UINT32, None))
    if with_array:
        arr = [i < n_trunk and (i + 1) % interval != 0 for i in range(n_all)]
        kv.append((f"{arch}.attention.recurrent_layers", arr, VT.ARRAY, VT.BOOL))
    shapes = qwen.tensor_shapes(hp, mtp=nextn > 0)
    tensors = [(n, ne, QT.F32 if len(ne) == 1 or "ssm_conv1d" in n else QT.F16) for n, ne in shapes]
    [p] = write_model(path, arch, kv, tensors)
    return p


@pytest.mark.parametrize("with_array", [True, False])
def test_qwen35_hybrid_small(tmp_path, with_array):
    path = small_qwen35(tmp_path / "q.gguf", with_array=with_array)
    assert_matches_reader(path)
    info = gguf_info(path)
    # T qwen35.cpp: recurrent iff (il + 1) % full_attention_interval != 0, trunk only
    assert info["kv_layers"] == [3, 7]
    assert info["recurrent"]["layers"] == [0, 1, 2, 4, 5, 6]
    assert info["recurrent"]["state_bytes_per_layer"] == t_state_bytes_ssm(4, 128, 2, 32)
    assert info["mtp"] is True and info["trunk_layers"] == 8 and info["block_count"] == 9
    # the loader creates attn_k only for attention layers: kv_layers must be exactly those trunk layers
    h = read_gguf_header(path)
    with_k = sorted(int(t.name.split(".")[1]) for t in h.tensors if t.name.endswith("attn_k.weight"))
    assert info["kv_layers"] == [i for i in with_k if i < info["trunk_layers"]]
    assert info["tensor_bytes"]["mtp"] == sum(t.n_bytes for t in h.tensors if t.name.startswith("blk.8."))
    assert info["tensor_bytes"]["mtp"] == info["tensor_bytes"]["per_layer"][8]
    assert kv_bytes_per_token(info, layers=range(8, 9)) == 2 * 2 * 64 * 2


def test_qwen35_interval_other_than_4(tmp_path):
    path = small_qwen35(tmp_path / "q.gguf", with_array=False, interval=3, n_trunk=6, nextn=0)
    info = gguf_info(path)
    assert info["kv_layers"] == [2, 5]
    assert info["recurrent"]["layers"] == [0, 1, 3, 4]
    assert info["mtp"] is False and info["tensor_bytes"]["mtp"] == 0


def test_recurrent_layers_array_wins_over_interval(tmp_path):
    # T reads {arch}.attention.recurrent_layers first; full_attention_interval is only the fallback
    arch = "qwen3next"
    arr = [True, False, True, True, False]
    kv = llama_kv(arch, 5, 64, 2, 1, 96, None) + [
        (f"{arch}.attention.recurrent_layers", arr, VT.ARRAY, VT.BOOL),
        (f"{arch}.full_attention_interval", 4, VT.UINT32, None),
        (f"{arch}.ssm.conv_kernel", 4, VT.UINT32, None),
        (f"{arch}.ssm.state_size", 16, VT.UINT32, None),
        (f"{arch}.ssm.group_count", 2, VT.UINT32, None),
        (f"{arch}.ssm.inner_size", 64, VT.UINT32, None),
    ]
    [path] = write_model(tmp_path / "n.gguf", arch, kv, [("token_embd.weight", (64, 96), QT.F32)])
    info = gguf_info(path)
    assert info["kv_layers"] == [1, 4]
    assert info["recurrent"]["layers"] == [0, 2, 3]


def test_recurrent_layers_array_of_wrong_length_fails(tmp_path):
    kv = llama_kv("qwen35", 5, 64, 2, 1, 96, None) + [
        ("qwen35.attention.recurrent_layers", [True, False], VT.ARRAY, VT.BOOL)
    ]
    [path] = write_model(tmp_path / "n.gguf", "qwen35", kv, [("token_embd.weight", (64, 96), QT.F32)])
    with pytest.raises(GGUFError, match="recurrent_layers has wrong array length; expected 5, got 2"):
        gguf_info(path)


def test_jamba_like_hybrid_with_per_layer_head_count_kv(tmp_path):
    # jamba/granitehybrid/plamo2/lfm2...: a layer is recurrent iff head_count_kv(il) == 0
    arch = "jamba"
    hkv = [0, 0, 0, 2, 0, 0, 0, 2]
    kv = llama_kv(arch, 8, 64, 4, hkv, 96, None) + [
        (f"{arch}.ssm.conv_kernel", 4, VT.UINT32, None),
        (f"{arch}.ssm.inner_size", 128, VT.UINT32, None),
        (f"{arch}.ssm.state_size", 16, VT.UINT32, None),
        (f"{arch}.ssm.time_step_rank", 4, VT.UINT32, None),
    ]
    [path] = write_model(tmp_path / "j.gguf", arch, kv, [("token_embd.weight", (64, 32), QT.F32)])
    info = gguf_info(path)
    assert info["head_count_kv"] == hkv
    assert info["kv_layers"] == [3, 7]
    assert info["recurrent"]["layers"] == [0, 1, 2, 4, 5, 6]
    assert info["recurrent"]["state_bytes_per_layer"] == t_state_bytes_ssm(4, 128, 0, 16)
    assert kv_bytes_per_token(info) == 2 * 2 * 2 * 16 * 2


def test_nemotron_h_layer_kinds(tmp_path):
    # T nemotron-h.cpp: recurrent iff head_count_kv == 0 and n_ff == 0; attention KV iff not recurrent
    # and n_ff == 0; MLP-only layers (n_ff > 0) hold neither
    arch = "nemotron_h"
    hkv = [0, 0, 2, 0, 0, 2]
    ff = [0, 96, 0, 0, 96, 0]
    kv = llama_kv(arch, 6, 64, 4, hkv, ff, None) + [
        (f"{arch}.ssm.conv_kernel", 4, VT.UINT32, None),
        (f"{arch}.ssm.inner_size", 128, VT.UINT32, None),
        (f"{arch}.ssm.state_size", 16, VT.UINT32, None),
        (f"{arch}.ssm.group_count", 8, VT.UINT32, None),
    ]
    [path] = write_model(tmp_path / "nh.gguf", arch, kv, [("token_embd.weight", (64, 32), QT.F32)])
    info = gguf_info(path)
    assert info["kv_layers"] == [2, 5]
    assert info["recurrent"]["layers"] == [0, 3]
    assert info["feed_forward_length"] == ff
    assert info["recurrent"]["state_bytes_per_layer"] == t_state_bytes_ssm(4, 128, 8, 16)


def test_pure_recurrent_archs(tmp_path):
    arch = "mamba"
    kv = llama_kv(arch, 3, 64, 0, None, 0, None) + [
        (f"{arch}.ssm.conv_kernel", 4, VT.UINT32, None),
        (f"{arch}.ssm.inner_size", 128, VT.UINT32, None),
        (f"{arch}.ssm.state_size", 16, VT.UINT32, None),
        (f"{arch}.ssm.time_step_rank", 4, VT.UINT32, None),
    ]
    [path] = write_model(tmp_path / "m.gguf", arch, kv, [("token_embd.weight", (64, 32), QT.F32)])
    info = gguf_info(path)
    assert info["kv_layers"] == []
    assert info["recurrent"]["layers"] == [0, 1, 2]
    assert info["recurrent"]["state_bytes_per_layer"] == t_state_bytes_ssm(4, 128, 0, 16)

    arch = "rwkv6"
    kv = llama_kv(arch, 2, 64, 0, None, 0, None) + [(f"{arch}.wkv.head_size", 16, VT.UINT32, None)]
    [path] = write_model(tmp_path / "r.gguf", arch, kv, [("token_embd.weight", (64, 32), QT.F32)])
    info = gguf_info(path)
    # T n_embd_r = token_shift_count (default 2) * n_embd, n_embd_s = n_embd * wkv_head_size
    assert info["recurrent"]["state_bytes_per_layer"] == 4 * (2 * 64 + 64 * 16)
    assert info["kv_layers"] == []


# ---------------------------------------------------------------------------------------------
# the Qwen3.6-27B Q4_K_M MTP stand-in (16.8 GB sparse file)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("qwen") / "Qwen3.6-27B-Q4_K_M-mtp.gguf"
    return qwen.write_qwen36_27b_header(out)


def _proc_rchar() -> int | None:
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def test_qwen_fixture_is_a_big_sparse_file(qwen_file):
    st = os.stat(qwen_file["path"])
    assert st.st_size == qwen_file["size_bytes"] > 16 * 10**9
    assert st.st_blocks * 512 < 64 * 2**20  # a few MB on disk


def test_qwen_header_read_never_reads_tensor_data(qwen_file):
    """What "fast" stood for, counted rather than timed: the bytes this process read (/proc/self/io rchar) stay
    within the header plus one buffered chunk of a 16.8 GB file, whatever the machine's load."""
    before = _proc_rchar()
    assert before is not None, "/proc/self/io is needed to count the bytes read"
    h = read_gguf_header(qwen_file["path"])
    after = _proc_rchar()
    assert h.data_offset == qwen_file["data_offset"]
    assert h.header_bytes > 8 * 2**20  # the tokenizer arrays were read...
    # ...but at most one buffered chunk (1 MiB) past the tensor-info table
    assert after - before < h.data_offset + 2 * 2**20, (after - before, h.data_offset)


def test_qwen_tensor_table_matches_generator(qwen_file):
    h = read_gguf_header(qwen_file["path"])
    assert [(t.name, t.dims, t.ggml_type, t.n_bytes) for t in h.tensors] == [tuple(x) for x in qwen_file["tensors"]]
    assert h.data_offset + h.data_size == qwen_file["size_bytes"]
    types = {t.type_name for t in h.tensors}
    assert types == {"F32", "Q4_K", "Q6_K"}


def test_qwen_summary(qwen_file):
    before = _proc_rchar()
    info = gguf_info(qwen_file["path"])
    read = _proc_rchar() - before
    assert read < qwen_file["data_offset"] + 2 * 2**20, read  # the summary reads the header only
    hp = qwen.HPARAMS
    assert info["architecture"] == "qwen35"
    assert info["file_type_name"] == "MOSTLY_Q4_K_M"
    assert info["size_bytes"] == qwen_file["size_bytes"]
    assert (info["block_count"], info["nextn_predict_layers"], info["trunk_layers"]) == (65, 1, 64)
    assert info["mtp"] is True
    assert info["context_length"] == hp["n_ctx"]
    assert info["embedding_length"] == hp["n_embd"]
    assert info["feed_forward_length"] == hp["n_ff"]
    assert info["vocab_size"] == hp["n_vocab"]
    assert (info["head_count"], info["head_count_kv"]) == (24, 4)
    assert info["key_length"] == info["value_length"] == 256

    # T qwen35.cpp: full attention every 4th trunk layer, the MTP block (64) is not a trunk layer
    assert info["kv_layers"] == [il for il in range(64) if (il + 1) % 4 == 0]
    assert info["kv_layers"][:3] == [3, 7, 11] and info["kv_layers"][-1] == 63
    assert len(info["recurrent"]["layers"]) == 48
    assert set(info["recurrent"]["layers"]) | set(info["kv_layers"]) == set(range(64))
    # f16 KV per token: 16 layers x (K + V) x 4 KV heads x 256 x 2 bytes = 64 KiB (LLAMACPP.md section 7)
    assert kv_bytes_per_token(info) == 16 * 2 * 4 * 256 * 2 == 64 * 1024
    # the MTP context's own KV: one nextn layer, 4 KiB per token
    assert kv_bytes_per_token(info, layers=range(64, 65)) == 4 * 1024
    # T n_embd_r() + n_embd_s(): (4-1)*(6144 + 2*16*128) + 128*6144 floats
    assert info["recurrent"]["state_bytes_per_layer"] == t_state_bytes_ssm(4, 6144, 16, 128) == 3_268_608

    tb = info["tensor_bytes"]
    gen = qwen_file["tensors"]
    assert len(tb["per_layer"]) == 65
    assert tb["mtp"] == tb["per_layer"][64] == sum(nb for n, _, _, nb in gen if n.startswith("blk.64."))
    assert tb["output"] == next(nb for n, _, _, nb in gen if n == "output.weight")
    assert tb["token_embd"] == next(nb for n, _, _, nb in gen if n == "token_embd.weight")
    assert tb["other"] == 0
    total = sum(tb["per_layer"]) + tb["token_embd"] + tb["output"] + tb["output_norm"] + tb["other"]
    assert total == sum(nb for *_, nb in gen)
    # full-attention and delta-net layers differ in size, every delta-net layer is alike
    assert len({tb["per_layer"][i] for i in info["recurrent"]["layers"]}) <= 2  # ffn_down Q4_K or Q6_K
    assert 15.5 * 2**30 < total < 16 * 2**30  # Q4_K_M with MTP, about 15.7 GiB


def test_qwen_without_recurrent_layers_key_or_mtp(tmp_path):
    old = qwen.write_qwen36_27b_header(tmp_path / "old.gguf", recurrent_layers_key=False)
    a = gguf_info(old["path"])
    assert "qwen35.attention.recurrent_layers" not in read_gguf_header(old["path"]).metadata
    assert a["kv_layers"] == [il for il in range(64) if (il + 1) % 4 == 0]
    assert len(a["recurrent"]["layers"]) == 48

    trunk = qwen.write_qwen36_27b_header(tmp_path / "trunk.gguf", mtp=False)
    b = gguf_info(trunk["path"])
    assert (b["block_count"], b["nextn_predict_layers"], b["mtp"], b["trunk_layers"]) == (64, 0, False, 64)
    assert b["kv_layers"] == a["kv_layers"]
    assert b["tensor_bytes"]["mtp"] == 0
    assert a["size_bytes"] - b["size_bytes"] >= a["tensor_bytes"]["mtp"]


def test_qwen_generator_cli(tmp_path):
    out = tmp_path / "cli.gguf"
    assert qwen.main([str(out), "--no-mtp"]) == 0
    assert gguf_info(out)["block_count"] == 64


# ---------------------------------------------------------------------------------------------
# corrupt, truncated and non-GGUF files
# ---------------------------------------------------------------------------------------------


def raw_gguf(kvs=(), tensors=(), version=3, n_kv=None, n_tensors=None, data=b"", align=32) -> bytes:
    """Hand-built GGUF bytes (little endian) for malformed cases the gguf writer refuses to produce.

    kvs: (key, type id, payload bytes); tensors: (name, dims, ggml type, offset).
    """

    def s(x: str | bytes) -> bytes:
        b = x.encode() if isinstance(x, str) else x
        return struct.pack("<Q", len(b)) + b

    out = b"GGUF" + struct.pack("<I", version)
    out += struct.pack("<qq", len(tensors) if n_tensors is None else n_tensors, len(kvs) if n_kv is None else n_kv)
    for key, vtype, payload in kvs:
        out += s(key) + struct.pack("<i", vtype) + payload
    for name, dims, gtype, offset in tensors:
        out += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<q", d) for d in dims)
        out += struct.pack("<iQ", gtype, offset)
    if tensors:
        out += b"\0" * (-len(out) % align)
    return out + data


ARCH = ("general.architecture", 8, struct.pack("<Q", 5) + b"llama")


def _write(tmp_path: Path, data: bytes, name="bad.gguf") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", r"not a GGUF file: only 0 bytes"),
        (b'{"__metadata__": {}}', r"not a GGUF file: magic is '\{\"__'"),
        (b"\x7fELF\x02\x01\x01\0" * 4, r"not a GGUF file: magic is '\?ELF' \(7f454c46\)"),
        (b"GGUF", r"file is truncated: no version after the magic \(at byte offset 4\)"),
        (raw_gguf(version=1), r"GGUF version 1 is no longer supported"),
        (raw_gguf(version=4), r"GGUF version 4 is newer than the supported versions 2 and 3"),
        (raw_gguf(version=0), r"bad GGUF version 0"),
        (raw_gguf()[:12], r"file is truncated: tensor count needs 8 bytes but only 4 remain .*at byte offset 8"),
        (
            raw_gguf(n_kv=10**9),
            r"truncated or corrupt: metadata key/value count 1000000000 is impossible .*at byte offset 16",
        ),
        (raw_gguf(n_tensors=-1), r"tensor count -1 is impossible"),
        (raw_gguf(n_kv=1), r"file is truncated: key of metadata pair 0 length needs 8 bytes .*at byte offset 24"),
        (
            raw_gguf([("k", 4, b"\1\0")]),
            r"truncated or corrupt: value of key 'k' needs 4 bytes \(1 x UINT32\) but only 2 bytes remain",
        ),
        (raw_gguf([("k", 8, struct.pack("<Q", 2**29))]), r"value of key 'k' has length 536870912 but only 0"),
        (raw_gguf([("k", 8, struct.pack("<Q", 2**40))]), r"value of key 'k': string length 1099511627776 exceeds"),
        (raw_gguf([("k", 13, b"")]), r"key 'k' has invalid GGUF value type 13 \(at byte offset 33\)"),
        (raw_gguf([("k", 9, struct.pack("<iQ", 9, 1))]), r"key 'k' has invalid GGUF array element type 9"),
        (raw_gguf([("k", 9, struct.pack("<iQ", 4, 2**31))]), r"key 'k': array length 2147483648 exceeds the maximum"),
        (raw_gguf([("k", 9, struct.pack("<iQ", 4, 2**29))]), r"key 'k' needs 2147483648 bytes \(536870912 x UINT32\)"),
        (raw_gguf([("k", 9, struct.pack("<iQ", 8, 5))]), r"key 'k' has 5 strings but only 0 bytes remain"),
        (raw_gguf([("", 4, b"\0" * 4)]), r"metadata key 0 is empty \(at byte offset 24\)"),
        (raw_gguf([("k", 4, b"\0" * 4), ("k", 4, b"\0" * 4)]), r"duplicate metadata key 'k' \(at byte offset 41\)"),
        (raw_gguf([("general.alignment", 10, b"\0" * 8)]), r"'general.alignment' must be of type UINT32 but is UINT64"),
        (raw_gguf([("general.alignment", 4, struct.pack("<I", 48))]), r"general.alignment 48 is not a power of 2"),
        (raw_gguf([ARCH], [("w", (32,), 4, 0)], data=b"\0" * 64), r"tensor 'w' has invalid ggml type 4"),
        (raw_gguf([ARCH], [("w", (32,), 43, 0)], data=b"\0" * 64), r"tensor 'w' has invalid ggml type 43"),
        (raw_gguf([ARCH], [("w", (1, 1, 1, 1, 1), 0, 0)]), r"tensor 'w' has 5 dimensions, more than 4"),
        (raw_gguf([ARCH], [("w", (4, -1), 0, 0)]), r"tensor 'w' has a negative dimension \(4, -1\)"),
        (raw_gguf([ARCH], [("w", (2**62, 4), 0, 0)]), r"tensor 'w' shape .* overflows int64"),
        (raw_gguf([ARCH], [("w" * 64, (4,), 0, 0)]), r"name 'w{64}' is too long: 64 >= 64"),
        (
            raw_gguf([ARCH], [("w", (4,), 0, 0), ("w", (4,), 0, 32)], data=b"\0" * 64),
            r"duplicate tensor name 'w'",
        ),
        (
            raw_gguf([ARCH], [("w", (100,), int(QT.Q4_K), 0)], data=b"\0" * 256),
            r"tensor 'w' of type Q4_K has 100 elements per row, not a multiple of block size 256",
        ),
        (
            raw_gguf([ARCH], [("a", (4,), 0, 0), ("b", (4,), 0, 16)], data=b"\0" * 64),
            r"tensor 'b' has data offset 16, expected 32",
        ),
        (
            raw_gguf([ARCH], [("a", (8,), 0, 0), ("b", (16,), 0, 32)], data=b"\0" * 40),
            r"file is truncated: tensor data ends at byte \d+ \(tensor 'b'\)",
        ),
    ],
)
def test_corrupt_files(tmp_path, data, message):
    p = _write(tmp_path, data)
    with pytest.raises(GGUFError, match=message) as e:
        read_gguf_header(p)
    assert str(e.value).startswith(f"{p}: ")


def test_hand_built_file_is_valid(tmp_path):
    # the builder of the corrupt cases makes valid files when nothing is broken
    p = _write(tmp_path, raw_gguf([ARCH], [("a", (8,), 0, 0), ("b", (16,), 0, 32)], data=b"\0" * 96))
    assert_matches_reader(p)


def test_missing_and_unopenable_paths(tmp_path):
    with pytest.raises(GGUFError, match=r"nope\.gguf: no such file"):
        read_gguf_header(tmp_path / "nope.gguf")
    with pytest.raises(GGUFError, match=r"is a directory, not a GGUF file"):
        read_gguf_header(tmp_path)


def test_truncated_real_file_everywhere(tmp_path):
    vocab = [f"tok{i}" for i in range(300)]
    [path] = write_model(
        tmp_path / "m.gguf", "llama", llama_kv("llama", 2, 256, 4, 2, 512, vocab), llama_tensors(2, 256, 288, 128, 512)
    )
    whole = path.read_bytes()
    h = read_gguf_header(path)
    for cut in (10, 100, 2000, h.header_bytes - 3, h.data_offset + 1, len(whole) - 1):
        p = _write(tmp_path, whole[:cut], f"cut{cut}.gguf")
        with pytest.raises(GGUFError, match="truncated") as e:
            read_gguf_header(p)
        if cut < h.header_bytes:
            assert re.search(r"at byte offset \d+\)$", str(e.value))


def test_header_only_file_is_truncated(tmp_path):
    r = qwen.write_qwen36_27b_header(tmp_path / "headonly.gguf", sparse_data=False)
    with pytest.raises(
        GGUFError, match=r"file is truncated: tensor data ends at byte \d+ .*download or copy is incomplete"
    ):
        gguf_info(r["path"])


def test_summary_needs_architecture_and_block_count(tmp_path):
    p = _write(tmp_path, raw_gguf([("general.name", 8, struct.pack("<Q", 1) + b"x")]))
    with pytest.raises(GGUFError, match="'general.architecture' is missing"):
        gguf_info(p)
    p = _write(tmp_path, raw_gguf([ARCH]), "noblocks.gguf")
    with pytest.raises(GGUFError, match="required key 'llama.block_count' is missing"):
        gguf_info(p)


def test_head_count_kv_array_of_wrong_length_fails(tmp_path):
    [path] = write_model(
        tmp_path / "w.gguf", "llama", llama_kv("llama", 3, 64, 2, [1, 1], 96, None), [("x", (4,), QT.F32)]
    )
    with pytest.raises(GGUFError, match="head_count_kv has wrong array length; expected 3, got 2"):
        gguf_info(path)
