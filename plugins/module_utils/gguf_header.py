"""Header-only GGUF reader and model summary (pure Python, standard library only).

Reads what llama.cpp's ``gguf_init_from_file`` reads before the tensor data: the magic,
the version (2 or 3), every metadata key/value (all GGUF value types, arrays included)
and the tensor-info table (name, dims, ggml type, offset). Tensor data is never read:
the file is read front to back in buffered chunks (1 MiB, so the last read may run up to
1 MiB past the tensor-info table) and the data section is checked only against the file size.

Ground truth is llama.cpp commit 0c1e570 ("T"):

- file layout and validation: ggml/src/gguf.cpp (gguf_init_from_reader);
- ggml type block/type sizes: ggml/src/ggml.c type_traits, gguf-py/gguf/constants.py
  GGML_QUANT_SIZES;
- file type names: include/llama.h enum llama_ftype;
- split files: src/llama.cpp llama_split_path/llama_split_prefix and
  src/llama-model-loader.cpp (``split.count``, ``split.no``, ``<prefix>-00001-of-0000N.gguf``);
- which layers hold KV cache or recurrent state: src/llama-model.cpp create_memory,
  src/models/<arch>.cpp load_arch_hparams, src/llama-hparams.cpp n_embd_r()/n_embd_s().

No Ansible imports here: the module ``llamafleet.mtp.gguf_info`` is a thin wrapper.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "GGML_TYPES",
    "GGUFError",
    "GGUFHeader",
    "GGUFValueType",
    "LLAMA_FTYPES",
    "TensorInfo",
    "decode_step_bytes",
    "find_split_paths",
    "gguf_info",
    "kv_bytes_per_token",
    "read_gguf_header",
    "read_gguf_parts",
    "summarize",
    "tensor_nbytes",
]

GGUF_MAGIC = b"GGUF"
GGUF_DEFAULT_ALIGNMENT = 32
GGUF_MAX_STRING_LENGTH = 1024 * 1024 * 1024  # gguf.cpp GGUF_MAX_STRING_LENGTH
GGUF_MAX_ARRAY_ELEMENTS = 1024 * 1024 * 1024  # gguf.cpp GGUF_MAX_ARRAY_ELEMENTS
GGML_MAX_DIMS = 4
GGML_MAX_NAME = 64
LLAMA_MAX_LAYERS = 512  # src/llama-hparams.h

_CHUNK = 1 << 20  # first read; later reads grow with what is still needed


class GGUFError(Exception):
    """A file that is not a readable GGUF (or a split set with a missing/inconsistent part)."""


class GGUFValueType:
    """GGUF metadata value types (ggml/include/gguf.h enum gguf_type)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


GGUF_TYPE_NAMES = {
    0: "UINT8",
    1: "INT8",
    2: "UINT16",
    3: "INT16",
    4: "UINT32",
    5: "INT32",
    6: "FLOAT32",
    7: "BOOL",
    8: "STRING",
    9: "ARRAY",
    10: "UINT64",
    11: "INT64",
    12: "FLOAT64",
}

# struct format character and size of each fixed-size GGUF value type
_SCALAR_FMT = {
    0: ("B", 1),
    1: ("b", 1),
    2: ("H", 2),
    3: ("h", 2),
    4: ("I", 4),
    5: ("i", 4),
    6: ("f", 4),
    7: ("b", 1),  # bool: int8, != 0 is true (gguf.cpp gguf_reader::read(bool&))
    10: ("Q", 8),
    11: ("q", 8),
    12: ("d", 8),
}

_QK_K = 256
# ggml type id -> (name, block size in elements, bytes per block).
# T ggml/src/ggml.c type_traits and gguf-py/gguf/constants.py GGML_QUANT_SIZES
# (ids 4, 5, 31-33, 36-38 were removed from ggml and are invalid in a GGUF).
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 2 + 16),
    3: ("Q4_1", 32, 2 + 2 + 16),
    6: ("Q5_0", 32, 2 + 4 + 16),
    7: ("Q5_1", 32, 2 + 2 + 4 + 16),
    8: ("Q8_0", 32, 2 + 32),
    9: ("Q8_1", 32, 2 + 2 + 32),
    10: ("Q2_K", 256, 2 + 2 + _QK_K // 16 + _QK_K // 4),
    11: ("Q3_K", 256, 2 + _QK_K // 4 + _QK_K // 8 + 12),
    12: ("Q4_K", 256, 2 + 2 + _QK_K // 2 + 12),
    13: ("Q5_K", 256, 2 + 2 + _QK_K // 2 + _QK_K // 8 + 12),
    14: ("Q6_K", 256, 2 + _QK_K // 2 + _QK_K // 4 + _QK_K // 16),
    15: ("Q8_K", 256, 4 + _QK_K + _QK_K // 8),
    16: ("IQ2_XXS", 256, 2 + _QK_K // 4),
    17: ("IQ2_XS", 256, 2 + _QK_K // 4 + _QK_K // 32),
    18: ("IQ3_XXS", 256, 2 + _QK_K // 4 + _QK_K // 8),
    19: ("IQ1_S", 256, 2 + _QK_K // 8 + _QK_K // 16),
    20: ("IQ4_NL", 32, 2 + 16),
    21: ("IQ3_S", 256, 2 + _QK_K // 4 + _QK_K // 8 + _QK_K // 32 + 4),
    22: ("IQ2_S", 256, 2 + _QK_K // 4 + _QK_K // 16),
    23: ("IQ4_XS", 256, 2 + 2 + _QK_K // 2 + _QK_K // 64),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, _QK_K // 8 + _QK_K // 16 + _QK_K // 32),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 2 + 4 * 13),
    35: ("TQ2_0", 256, 2 + 64),
    39: ("MXFP4", 32, 1 + 16),
    40: ("NVFP4", 64, 4 + 32),
    41: ("Q1_0", 128, 2 + 16),
    42: ("Q2_0", 64, 2 + 16),
}
GGML_TYPE_COUNT = 43

# T include/llama.h enum llama_ftype, without the LLAMA_FTYPE_ prefix
LLAMA_FTYPES: dict[int, str] = {
    0: "ALL_F32",
    1: "MOSTLY_F16",
    2: "MOSTLY_Q4_0",
    3: "MOSTLY_Q4_1",
    7: "MOSTLY_Q8_0",
    8: "MOSTLY_Q5_0",
    9: "MOSTLY_Q5_1",
    10: "MOSTLY_Q2_K",
    11: "MOSTLY_Q3_K_S",
    12: "MOSTLY_Q3_K_M",
    13: "MOSTLY_Q3_K_L",
    14: "MOSTLY_Q4_K_S",
    15: "MOSTLY_Q4_K_M",
    16: "MOSTLY_Q5_K_S",
    17: "MOSTLY_Q5_K_M",
    18: "MOSTLY_Q6_K",
    19: "MOSTLY_IQ2_XXS",
    20: "MOSTLY_IQ2_XS",
    21: "MOSTLY_Q2_K_S",
    22: "MOSTLY_IQ3_XS",
    23: "MOSTLY_IQ3_XXS",
    24: "MOSTLY_IQ1_S",
    25: "MOSTLY_IQ4_NL",
    26: "MOSTLY_IQ3_S",
    27: "MOSTLY_IQ3_M",
    28: "MOSTLY_IQ2_S",
    29: "MOSTLY_IQ2_M",
    30: "MOSTLY_IQ4_XS",
    31: "MOSTLY_IQ1_M",
    32: "MOSTLY_BF16",
    36: "MOSTLY_TQ1_0",
    37: "MOSTLY_TQ2_0",
    38: "MOSTLY_MXFP4_MOE",
    39: "MOSTLY_NVFP4",
    40: "MOSTLY_Q1_0",
    41: "MOSTLY_Q2_0",
    1024: "GUESSED",
}


def tensor_nbytes(ggml_type: int, dims: tuple[int, ...] | list[int]) -> int:
    """Bytes of a contiguous tensor of this ggml type and dims (ne order), as ggml_nbytes."""
    try:
        _name, blck, size = GGML_TYPES[ggml_type]
    except KeyError:
        raise GGUFError(f"unknown ggml type {ggml_type}") from None
    n = 1
    for d in dims:
        n *= d
    if dims and dims[0] % blck:
        raise GGUFError(f"{dims[0]} elements per row is not a multiple of block size {blck} of {_name}")
    return n // blck * size


@dataclass
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # ne order: dims[0] is the row length (innermost)
    ggml_type: int
    offset: int  # relative to the start of the data section
    n_bytes: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type][0]

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n


@dataclass
class GGUFHeader:
    path: str
    version: int
    byte_order: str  # "little" or "big"
    metadata: dict[str, Any]
    value_types: dict[str, tuple[int, int | None]]  # key -> (gguf type, array element type or None)
    tensors: list[TensorInfo]
    alignment: int
    data_offset: int  # absolute file offset of the data section
    data_size: int  # bytes of the data section (padded tensor sizes)
    file_size: int
    header_bytes: int = field(default=0)  # bytes read up to the end of the tensor-info table


class _Reader:
    """Buffered forward reader over a file; tracks absolute offsets for error messages."""

    def __init__(self, fh, path: str, file_size: int, endian: str):
        self.fh = fh
        self.path = path
        self.file_size = file_size
        self.buf = b""
        self.base = 0  # absolute file offset of buf[0]
        self.pos = 0  # index into buf
        self.e = endian
        self.u64 = struct.Struct(endian + "Q")
        self.u32 = struct.Struct(endian + "I")
        self.i32 = struct.Struct(endian + "i")
        self.i64 = struct.Struct(endian + "q")

    def tell(self) -> int:
        return self.base + self.pos

    def fail(self, what: str, offset: int | None = None) -> GGUFError:
        off = self.tell() if offset is None else offset
        return GGUFError(f"{self.path}: {what} (at byte offset {off})")

    def fill(self, n: int, what: str) -> None:
        """Make at least n bytes available from pos, or fail with a truncation error."""
        have = len(self.buf) - self.pos
        if have >= n:
            return
        if self.tell() + n > self.file_size:
            raise self.fail(
                f"file is truncated: {what} needs {n} bytes but only {self.file_size - self.tell()} remain "
                f"(file size {self.file_size})"
            )
        want = max(n - have, _CHUNK, len(self.buf) // 2)
        chunk = self.fh.read(want)
        self.base += self.pos
        self.buf = self.buf[self.pos :] + chunk
        self.pos = 0
        if len(self.buf) < n:
            raise self.fail(f"file is truncated: {what} needs {n} bytes, read returned fewer")

    def unpack(self, st: struct.Struct, what: str):
        if len(self.buf) - self.pos < st.size:
            self.fill(st.size, what)
        v = st.unpack_from(self.buf, self.pos)[0]
        self.pos += st.size
        return v

    def string(self, what: str) -> str:
        start = self.tell()
        n = self.unpack(self.u64, what + " length")
        if n > GGUF_MAX_STRING_LENGTH:
            raise self.fail(f"{what}: string length {n} exceeds the maximum {GGUF_MAX_STRING_LENGTH}", start)
        if self.tell() + n > self.file_size:
            raise self.fail(
                f"file is truncated or corrupt: {what} has length {n} but only "
                f"{self.file_size - self.tell()} bytes remain",
                start,
            )
        if len(self.buf) - self.pos < n:
            self.fill(n, what)
        s = self.buf[self.pos : self.pos + n].decode("utf-8", "replace")
        self.pos += n
        return s

    def strings(self, count: int, what: str) -> list[str]:
        """count length-prefixed strings; the tight loop of tokenizer arrays (hundreds of thousands)."""
        out: list[str] = []
        append = out.append
        unpack = self.u64.unpack_from
        buf, pos = self.buf, self.pos
        end = len(buf)
        for i in range(count):
            if pos + 8 > end:
                self.pos = pos
                self.fill(8, f"{what}[{i}] length")
                buf, pos, end = self.buf, self.pos, len(self.buf)
            n = unpack(buf, pos)[0]
            if pos + 8 + n > end:
                self.pos = pos
                if n > GGUF_MAX_STRING_LENGTH or self.tell() + 8 + n > self.file_size:
                    raise self.fail(
                        f"file is truncated or corrupt: {what}[{i}] has length {n} but only "
                        f"{self.file_size - self.tell() - 8} bytes remain"
                    )
                self.fill(8 + n, f"{what}[{i}]")
                buf, pos, end = self.buf, self.pos, len(self.buf)
            append(buf[pos + 8 : pos + 8 + n].decode("utf-8", "replace"))
            pos += 8 + n
        self.pos = pos
        return out

    def scalars(self, vtype: int, count: int, what: str) -> list:
        ch, size = _SCALAR_FMT[vtype]
        nbytes = size * count
        if self.tell() + nbytes > self.file_size:
            raise self.fail(
                f"file is truncated or corrupt: {what} needs {nbytes} bytes ({count} x {GGUF_TYPE_NAMES[vtype]}) "
                f"but only {self.file_size - self.tell()} bytes remain"
            )
        if len(self.buf) - self.pos < nbytes:
            self.fill(nbytes, what)
        vals = list(struct.unpack_from(f"{self.e}{count}{ch}", self.buf, self.pos))
        self.pos += nbytes
        if vtype == GGUFValueType.BOOL:
            vals = [v != 0 for v in vals]
        return vals


def _read_value(r: _Reader, vtype: int, key: str):
    if vtype == GGUFValueType.STRING:
        return r.string(f"value of key '{key}'")
    if vtype in _SCALAR_FMT:
        return r.scalars(vtype, 1, f"value of key '{key}'")[0]
    raise r.fail(f"key '{key}' has invalid GGUF value type {vtype}")


def read_gguf_header(path: str | os.PathLike) -> GGUFHeader:
    """Read one GGUF file's header: metadata and tensor infos. Never reads tensor data.

    Validates as T's gguf_init_from_reader does (magic, version, counts, duplicate keys and
    tensor names, alignment, dims, ggml types, row sizes, contiguous offsets) and also that the
    data section fits in the file (a truncated download fails here). Raises GGUFError.
    """
    path = os.fspath(path)
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed in finally
    except FileNotFoundError:
        raise GGUFError(f"{path}: no such file; check the path (or fetch the model first)") from None
    except IsADirectoryError:
        raise GGUFError(f"{path}: is a directory, not a GGUF file") from None
    except OSError as e:
        raise GGUFError(f"{path}: cannot open: {e.strerror or e}") from None
    try:
        file_size = os.fstat(fh.fileno()).st_size
        return _parse(fh, path, file_size)
    finally:
        fh.close()


def _read_version(fh, path: str, file_size: int) -> tuple[int, str]:
    """Check the 'GGUF' magic and decide the version and byte order ('<' or '>') from the first 8 bytes."""
    head = fh.read(8)
    if len(head) < 4:
        raise GGUFError(
            f"{path}: not a GGUF file: only {file_size} bytes, too short for the 'GGUF' magic (at byte offset 0)"
        )
    if head[:4] != GGUF_MAGIC:
        shown = "".join(chr(c) if 32 <= c < 127 else "?" for c in head[:4])
        raise GGUFError(
            f"{path}: not a GGUF file: magic is '{shown}' ({head[:4].hex()}), expected 'GGUF' (at byte offset 0)"
        )
    if len(head) < 8:
        raise GGUFError(f"{path}: file is truncated: no version after the magic (at byte offset 4)")
    version = struct.unpack("<I", head[4:8])[0]
    endian = "<"
    if version & 0x0000FFFF == 0 and version != 0:
        swapped = struct.unpack(">I", head[4:8])[0]
        if swapped in (2, 3):
            version, endian = swapped, ">"
    if version == 0 or version & 0x0000FFFF == 0:
        raise GGUFError(f"{path}: bad GGUF version {version} (at byte offset 4)")
    if version == 1:
        raise GGUFError(
            f"{path}: GGUF version 1 is no longer supported by llama.cpp; re-convert the model (at byte offset 4)"
        )
    if version > 3:
        raise GGUFError(
            f"{path}: GGUF version {version} is newer than the supported versions 2 and 3 (at byte offset 4)"
        )
    return version, endian


def _read_counts(r: _Reader) -> tuple[int, int]:
    """Read the tensor and metadata key/value counts, rejecting counts the file size makes impossible."""
    file_size = r.file_size
    off = r.tell()
    n_tensors = r.unpack(r.i64, "tensor count")
    if n_tensors < 0 or n_tensors * 24 > file_size:  # each tensor info takes at least 24 bytes
        raise r.fail(
            f"file is truncated or corrupt: tensor count {n_tensors} is impossible for a {file_size}-byte file", off
        )
    off = r.tell()
    n_kv = r.unpack(r.i64, "metadata key/value count")
    if n_kv < 0 or n_kv * 13 > file_size:  # each KV takes at least 13 bytes
        raise r.fail(
            f"file is truncated or corrupt: metadata key/value count {n_kv} is impossible for a {file_size}-byte file",
            off,
        )
    return n_tensors, n_kv


def _read_array(r: _Reader, key: str, toff: int) -> tuple[list, int]:
    """Read the ARRAY value of `key` (after its type) as its element type says; returns (values, element type)."""
    etype = r.unpack(r.i32, f"array element type of key '{key}'")
    count = r.unpack(r.u64, f"array length of key '{key}'")
    if count > GGUF_MAX_ARRAY_ELEMENTS:
        raise r.fail(f"key '{key}': array length {count} exceeds the maximum {GGUF_MAX_ARRAY_ELEMENTS}")
    if etype == GGUFValueType.STRING:
        if r.tell() + 8 * count > r.file_size:
            raise r.fail(
                f"file is truncated or corrupt: key '{key}' has {count} strings but only "
                f"{r.file_size - r.tell()} bytes remain"
            )
        return r.strings(count, f"key '{key}'"), etype
    if etype in _SCALAR_FMT:
        return r.scalars(etype, count, f"key '{key}'"), etype
    raise r.fail(f"key '{key}' has invalid GGUF array element type {etype}", toff)


def _read_metadata(r: _Reader, n_kv: int) -> tuple[dict[str, Any], dict[str, tuple[int, int | None]]]:
    """Read the n_kv metadata pairs, rejecting empty or duplicate keys and invalid value types."""
    metadata: dict[str, Any] = {}
    value_types: dict[str, tuple[int, int | None]] = {}
    for i in range(n_kv):
        off = r.tell()
        key = r.string(f"key of metadata pair {i}")
        if not key:
            raise r.fail(f"metadata key {i} is empty", off)
        if key in metadata:
            raise r.fail(f"duplicate metadata key '{key}'", off)
        toff = r.tell()
        vtype = r.unpack(r.i32, f"type of key '{key}'")
        if vtype == GGUFValueType.ARRAY:
            value, etype = _read_array(r, key, toff)
            value_types[key] = (GGUFValueType.ARRAY, etype)
        else:
            if vtype not in GGUF_TYPE_NAMES:
                raise r.fail(f"key '{key}' has invalid GGUF value type {vtype}", toff)
            value = _read_value(r, vtype, key)
            value_types[key] = (vtype, None)
        metadata[key] = value
    return metadata, value_types


def _alignment(path: str, metadata: dict[str, Any], value_types: dict[str, tuple[int, int | None]]) -> int:
    """The data alignment: general.alignment (must be a UINT32 power of 2) or the default 32."""
    alignment = GGUF_DEFAULT_ALIGNMENT
    if "general.alignment" in metadata:
        if value_types["general.alignment"] != (GGUFValueType.UINT32, None):
            t = value_types["general.alignment"]
            raise GGUFError(f"{path}: key 'general.alignment' must be of type UINT32 but is {GGUF_TYPE_NAMES[t[0]]}")
        alignment = metadata["general.alignment"]
        if alignment == 0 or alignment & (alignment - 1):
            raise GGUFError(f"{path}: general.alignment {alignment} is not a power of 2")
    return alignment


def _read_tensor_info(r: _Reader, i: int, seen: set[str]) -> TensorInfo:
    """Read tensor info i, rejecting bad names, dims, ggml types and rows that are not whole blocks."""
    off = r.tell()
    name = r.string(f"name of tensor {i}")
    if len(name.encode("utf-8")) >= GGML_MAX_NAME:
        raise r.fail(f"tensor {i} name '{name}' is too long: {len(name)} >= {GGML_MAX_NAME}", off)
    if name in seen:
        raise r.fail(f"duplicate tensor name '{name}'", off)
    seen.add(name)
    doff = r.tell()
    n_dims = r.unpack(r.u32, f"dimension count of tensor '{name}'")
    if n_dims > GGML_MAX_DIMS:
        raise r.fail(f"tensor '{name}' has {n_dims} dimensions, more than {GGML_MAX_DIMS}", doff)
    dims = tuple(r.unpack(r.i64, f"dims of tensor '{name}'") for _dummy in range(n_dims))
    if any(d < 0 for d in dims):
        raise r.fail(f"tensor '{name}' has a negative dimension {dims}", doff)
    n_el = 1
    for d in dims:
        n_el *= d
    if n_el >= 2**63:
        raise r.fail(f"tensor '{name}' shape {dims} overflows int64", doff)
    toff = r.tell()
    gtype = r.unpack(r.i32, f"ggml type of tensor '{name}'")
    if gtype not in GGML_TYPES:
        raise r.fail(
            f"tensor '{name}' has invalid ggml type {gtype} (not a ggml type in 0..{GGML_TYPE_COUNT - 1})",
            toff,
        )
    tname, blck, tsize = GGML_TYPES[gtype]
    row = dims[0] if dims else 1
    if row % blck:
        raise r.fail(
            f"tensor '{name}' of type {tname} has {row} elements per row, not a multiple of block size {blck}", toff
        )
    offset = r.unpack(r.u64, f"data offset of tensor '{name}'")
    return TensorInfo(name, dims, gtype, offset, n_el // blck * tsize)


def _data_section(path: str, tensors: list[TensorInfo], header_end: int, alignment: int, file_size: int):
    """Decide (data_offset, data_size): offsets must be contiguous and aligned, and the data must fit in the file."""
    data_offset = header_end
    if tensors:
        data_offset = (header_end + alignment - 1) // alignment * alignment
    data_size = 0
    for t in tensors:
        if t.offset != data_size:
            raise GGUFError(
                f"{path}: tensor '{t.name}' has data offset {t.offset}, expected {data_size} "
                f"(tensor data must be contiguous and {alignment}-aligned)"
            )
        data_size += (t.n_bytes + alignment - 1) // alignment * alignment
    if tensors:
        last = tensors[-1]
        data_end = data_offset + last.offset + last.n_bytes
        if data_end > file_size:
            raise GGUFError(
                f"{path}: file is truncated: tensor data ends at byte {data_end} (tensor '{last.name}') but the "
                f"file has {file_size} bytes; the download or copy is incomplete"
            )
    return data_offset, data_size


def _parse(fh, path: str, file_size: int) -> GGUFHeader:
    version, endian = _read_version(fh, path, file_size)

    r = _Reader(fh, path, file_size, endian)
    r.base = 8
    n_tensors, n_kv = _read_counts(r)
    metadata, value_types = _read_metadata(r, n_kv)
    alignment = _alignment(path, metadata, value_types)

    seen: set[str] = set()
    tensors = [_read_tensor_info(r, i, seen) for i in range(n_tensors)]

    header_end = r.tell()
    data_offset, data_size = _data_section(path, tensors, header_end, alignment, file_size)
    return GGUFHeader(
        path=path,
        version=version,
        byte_order="little" if endian == "<" else "big",
        metadata=metadata,
        value_types=value_types,
        tensors=tensors,
        alignment=alignment,
        data_offset=data_offset,
        data_size=data_size,
        file_size=file_size,
        header_bytes=header_end,
    )


# ---------------------------------------------------------------------------------------------
# split sets
# ---------------------------------------------------------------------------------------------

_SPLIT_RE = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def _split_path(prefix: str, idx: int, count: int) -> str:
    # T src/llama.cpp llama_split_path: "%s-%05d-of-%05d.gguf", split_no + 1
    return f"{prefix}-{idx + 1:05d}-of-{count:05d}.gguf"


def find_split_paths(header: GGUFHeader) -> list[str]:
    """All part paths of the split set `header` belongs to ([its own path] when not split)."""
    count = header.metadata.get("split.count", 1)
    if not isinstance(count, int) or count <= 1:
        return [header.path]
    no = header.metadata.get("split.no")
    if not isinstance(no, int) or not 0 <= no < count:
        raise GGUFError(f"{header.path}: split.count is {count} but split.no is {no!r} (expected 0..{count - 1})")
    postfix = f"-{no + 1:05d}-of-{count:05d}.gguf"
    if not header.path.endswith(postfix) or len(header.path) <= len(postfix):
        raise GGUFError(
            f"{header.path}: invalid split file name: part {no + 1} of {count} must be named "
            f"'<prefix>{postfix}' (llama.cpp finds the other parts by this name)"
        )
    prefix = header.path[: -len(postfix)]
    return [_split_path(prefix, i, count) for i in range(count)]


def read_gguf_parts(path: str | os.PathLike) -> list[GGUFHeader]:
    """Headers of a GGUF file, or of every part of its split set (given any part), in order."""
    first = read_gguf_header(path)
    paths = find_split_paths(first)
    if len(paths) == 1:
        return [first]
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        raise GGUFError(
            f"{first.path}: split set of {len(paths)} parts is incomplete, missing: {', '.join(missing)}; "
            "download every part into the same directory"
        )
    count = len(paths)
    headers = []
    for idx, p in enumerate(paths):
        h = first if os.path.abspath(p) == os.path.abspath(first.path) else read_gguf_header(p)
        if h.metadata.get("split.no") != idx:
            raise GGUFError(f"{p}: invalid split file: split.no is {h.metadata.get('split.no')!r}, expected {idx}")
        if h.metadata.get("split.count") != count:
            raise GGUFError(
                f"{p}: invalid split file: split.count is {h.metadata.get('split.count')!r}, expected {count}"
            )
        headers.append(h)
    seen: dict[str, str] = {}
    for h in headers:
        for t in h.tensors:
            if t.name in seen:
                raise GGUFError(f"{h.path}: tensor '{t.name}' is duplicated (also in {seen[t.name]})")
            seen[t.name] = h.path
    expected = headers[0].metadata.get("split.tensors.count")
    if isinstance(expected, int) and expected != len(seen):
        raise GGUFError(
            f"{headers[0].path}: split.tensors.count is {expected} but the {count} parts hold {len(seen)} tensors"
        )
    return headers


# ---------------------------------------------------------------------------------------------
# summary (docs/facts.md, gguf_info)
# ---------------------------------------------------------------------------------------------

# T src/llama-arch.cpp llm_arch_is_recurrent / llm_arch_is_hybrid (architecture name strings)
RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
HYBRID_ARCHS = frozenset(
    {
        "jamba",
        "falcon-h1",
        "plamo2",
        "granitehybrid",
        "lfm2",
        "lfm2moe",
        "nemotron_h",
        "nemotron_h_moe",
        "qwen3next",
        "kimi-linear",
        "bailingmoe3",
        "kimi-k3",
        "glm5-next",
        "qwen35",
        "qwen35moe",
        "qwen4exp",
        "deepseek4",
        "minimax-01",
    }
)
# hybrids whose recurrent layers come from {arch}.attention.recurrent_layers or, failing that,
# {arch}.full_attention_interval (default 4): src/models/{qwen3next,qwen35,qwen35moe,qwen4exp,minimax-01}.cpp
_INTERVAL_HYBRIDS = frozenset({"qwen3next", "qwen35", "qwen35moe", "qwen4exp", "minimax-01"})
_NEMOTRON_H = frozenset({"nemotron_h", "nemotron_h_moe"})

_BLK_RE = re.compile(r"^blk\.(\d+)\.")


def _per_layer(md: dict, key: str, n_layer_all: int, default, path: str) -> list:
    """T get_key_or_arr: an array of exactly n_layer_all values, or one value repeated."""
    v = md.get(key, default)
    if isinstance(v, list):
        if len(v) != n_layer_all:
            raise GGUFError(f"{path}: key {key} has wrong array length; expected {n_layer_all}, got {len(v)}")
        return [int(x) for x in v]
    return [v] * n_layer_all


def _req_int(md: dict, key: str, path: str) -> int:
    v = md.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise GGUFError(f"{path}: required key '{key}' is {'missing' if v is None else f'not an integer ({v!r})'}")
    return v


def _opt_int(md: dict, key: str, default: int | None = None) -> int | None:
    v = md.get(key, default)
    if isinstance(v, bool):
        return int(v)
    return v if isinstance(v, int) or v is None else default


def _recurrent_state_elems(arch: str, md: dict, n_embd: int, n_head0: int, key_length: int) -> int:
    """T llama_hparams::n_embd_r() + n_embd_s(): F32 elements of one layer's state for one sequence row."""
    a = arch + "."
    d_conv = _opt_int(md, a + "ssm.conv_kernel", 0) or 0
    d_inner = _opt_int(md, a + "ssm.inner_size", 0) or 0
    d_state = _opt_int(md, a + "ssm.state_size", 0) or 0
    n_group = _opt_int(md, a + "ssm.group_count", 0) or 0
    wkv = _opt_int(md, a + "wkv.head_size", 0) or 0
    l_cache = _opt_int(md, a + "shortconv.l_cache", 0) or 0
    kda = _opt_int(md, a + "kda.head_dim", 0) or 0
    la = key_length if arch == "minimax-01" else 0  # minimax-01.cpp: n_embd_head_la = n_embd_head_k_full

    if wkv:  # RWKV
        r = (_opt_int(md, a + "token_shift_count", 2) or 0) * n_embd
    elif l_cache:  # LFM2 short convolution
        r = n_embd * (l_cache - 1)
    elif kda:  # Kimi delta attention
        r = 3 * (d_conv - 1 if d_conv > 0 else 3) * (n_head0 * kda)
    else:  # Mamba / gated delta net convolution state
        r = (d_conv - 1 if d_conv > 0 else 0) * (d_inner + 2 * n_group * d_state)

    if wkv:
        s = n_embd * wkv
    elif kda:
        s = kda * kda * n_head0
    elif la:
        s = la * la * n_head0
    else:
        s = d_state * d_inner
    return r + s


def _architecture(md: dict, path: str) -> str:
    """general.architecture, which every model GGUF must name."""
    arch = md.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise GGUFError(f"{path}: key 'general.architecture' is missing; this GGUF does not describe a model")
    return arch


def _layer_counts(md: dict, a: str, path: str) -> tuple[int, int]:
    """(block_count, nextn_predict_layers): all blocks (1..LLAMA_MAX_LAYERS) and how many of them are MTP heads."""
    n_layer_all = _req_int(md, a + "block_count", path)
    if not 0 < n_layer_all <= LLAMA_MAX_LAYERS:
        raise GGUFError(f"{path}: {a}block_count is {n_layer_all}, expected 1..{LLAMA_MAX_LAYERS}")
    nextn = _opt_int(md, a + "nextn_predict_layers", 0) or 0
    if nextn > n_layer_all:
        raise GGUFError(f"{path}: {a}nextn_predict_layers ({nextn}) exceeds {a}block_count ({n_layer_all})")
    return n_layer_all, nextn


def _per_layer_shape(md: dict, a: str, n_layer_all: int, path: str) -> tuple[list, list, list]:
    """Per-layer (head_count, head_count_kv, feed_forward_length) ints; head_count_kv defaults to head_count."""
    n_head = [int(x or 0) for x in _per_layer(md, a + "attention.head_count", n_layer_all, 0, path)]
    if md.get(a + "attention.head_count_kv") is None:
        n_head_kv = list(n_head)  # T: n_head_kv defaults to n_head
    else:
        n_head_kv = [int(x or 0) for x in _per_layer(md, a + "attention.head_count_kv", n_layer_all, 0, path)]
    n_ff = [int(x or 0) for x in _per_layer(md, a + "feed_forward_length", n_layer_all, 0, path)]
    return n_head, n_head_kv, n_ff


def _recurrent_mask(
    arch: str, md: dict, n_layer: int, n_layer_all: int, n_head_kv: list, n_ff: list, path: str
) -> list[bool]:
    """Which layers are recurrent (T hparams.is_recr_impl), per architecture."""
    a = arch + "."
    if arch in _INTERVAL_HYBRIDS:
        rl = md.get(a + "attention.recurrent_layers")
        if isinstance(rl, list):
            if len(rl) != n_layer_all:
                raise GGUFError(
                    f"{path}: key {a}attention.recurrent_layers has wrong array length; "
                    f"expected {n_layer_all}, got {len(rl)}"
                )
            return [bool(x) for x in rl]
        interval = _opt_int(md, a + "full_attention_interval", 4) or 4
        return [i < n_layer and (i + 1) % interval != 0 for i in range(n_layer_all)]
    if arch == "falcon-h1":
        return [True] * n_layer_all
    if arch in _NEMOTRON_H:
        return [i < n_layer and n_head_kv[i] == 0 and n_ff[i] == 0 for i in range(n_layer_all)]
    if arch in HYBRID_ARCHS:
        # jamba, granitehybrid, plamo2, lfm2, lfm2moe, kimi-linear, kimi-k3, glm5-next, bailingmoe3
        # (and deepseek4, whose head_count_kv is never 0): recurrent iff head_count_kv(il) == 0
        return [n_head_kv[i] == 0 for i in range(n_layer_all)]
    return [arch in RECURRENT_ARCHS] * n_layer_all


def _has_kv(arch: str, il: int, n_head_kv: list, n_ff: list, is_recr: list) -> bool:
    """Whether layer il holds attention KV cache (T create_memory layer filters)."""
    if arch in RECURRENT_ARCHS or n_head_kv[il] == 0:
        return False
    if arch == "falcon-h1":
        return True
    if arch in _NEMOTRON_H:
        return not is_recr[il] and n_ff[il] == 0
    return not is_recr[il]


def _recurrent_summary(arch: str, md: dict, recr_layers: list, n_embd, n_head0: int, key_length) -> dict | None:
    """The `recurrent` entry of the summary: the recurrent trunk layers and their state size; None without any."""
    if not recr_layers:
        return None
    a = arch + "."
    elems = _recurrent_state_elems(arch, md, n_embd or 0, n_head0, key_length or 0)
    return {
        "layers": recr_layers,
        "conv_kernel": _opt_int(md, a + "ssm.conv_kernel"),
        "state_size": _opt_int(md, a + "ssm.state_size"),
        "group_count": _opt_int(md, a + "ssm.group_count"),
        "inner_size": _opt_int(md, a + "ssm.inner_size"),
        "time_step_rank": _opt_int(md, a + "ssm.time_step_rank"),
        "full_attention_interval": _opt_int(md, a + "full_attention_interval"),
        "state_bytes_per_layer": 4 * elems,
    }


def _tensor_bytes_by_role(headers: list[GGUFHeader], n_layer_all: int, n_layer: int) -> tuple[dict, Any, int]:
    """Sort every tensor's bytes into its role (block N, token_embd, output, output_norm, other).

    Returns (the summary's `tensor_bytes` dict, token_embd's dims or None, the tensor count).
    """
    per_layer = [0] * n_layer_all
    token_embd = output = output_norm = other = 0
    token_embd_dims = None
    n_tensors = 0
    for h in headers:
        for t in h.tensors:
            n_tensors += 1
            m = _BLK_RE.match(t.name)
            if m and int(m.group(1)) < n_layer_all:
                per_layer[int(m.group(1))] += t.n_bytes
            elif t.name == "token_embd.weight":
                token_embd += t.n_bytes
                token_embd_dims = t.dims
            elif t.name == "output.weight":
                output += t.n_bytes
            elif t.name == "output_norm.weight":
                output_norm += t.n_bytes
            else:
                other += t.n_bytes
    tensor_bytes = {
        "per_layer": per_layer,
        "token_embd": token_embd,
        "output": output,
        "output_norm": output_norm,
        "mtp": sum(per_layer[n_layer:]),
        "other": other,
    }
    return tensor_bytes, token_embd_dims, n_tensors


def _vocab_size(md: dict, a: str, token_embd_dims):
    """Vocabulary size: the tokenizer's token list, else token_embd's ne[1], else {arch}.vocab_size."""
    tokens = md.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list):
        return len(tokens)
    if token_embd_dims is not None and len(token_embd_dims) >= 2:
        return token_embd_dims[1]
    return _opt_int(md, a + "vocab_size")


def summarize(headers: list[GGUFHeader]) -> dict:
    """The docs/facts.md `gguf_info` dict for a model given the headers of all its parts."""
    first = headers[0]
    md = first.metadata
    path = first.path
    arch = _architecture(md, path)
    a = arch + "."
    n_layer_all, nextn = _layer_counts(md, a, path)
    n_layer = n_layer_all - nextn

    n_embd = _opt_int(md, a + "embedding_length")
    head_count_raw = md.get(a + "attention.head_count")
    hkv_raw = md.get(a + "attention.head_count_kv")
    n_head, n_head_kv, n_ff = _per_layer_shape(md, a, n_layer_all, path)
    n_head0 = n_head[0] if n_head else 0
    default_head = n_embd // n_head0 if n_embd and n_head0 else 0
    key_length = _opt_int(md, a + "attention.key_length", default_head)
    value_length = _opt_int(md, a + "attention.value_length", default_head)

    is_recr = _recurrent_mask(arch, md, n_layer, n_layer_all, n_head_kv, n_ff, path)
    kv_layers = [il for il in range(n_layer) if _has_kv(arch, il, n_head_kv, n_ff, is_recr)]
    recr_layers = [il for il in range(n_layer) if is_recr[il]]
    recurrent = _recurrent_summary(arch, md, recr_layers, n_embd, n_head0, key_length)

    tensor_bytes, token_embd_dims, n_tensors = _tensor_bytes_by_role(headers, n_layer_all, n_layer)
    decode_bytes = decode_step_bytes(
        [t for h in headers for t in h.tensors],
        n_layer,
        n_layer_all,
        _opt_int(md, a + "expert_count", 0) or 0,
        _opt_int(md, a + "expert_used_count", 0) or 0,
    )

    file_type = _opt_int(md, "general.file_type")
    return {
        "path": path,
        "architecture": arch,
        "name": md.get("general.name"),
        "file_type": file_type,
        "file_type_name": LLAMA_FTYPES.get(file_type) if file_type is not None else None,
        "size_bytes": sum(h.file_size for h in headers),
        "split": {"count": len(headers), "paths": [h.path for h in headers]},
        "tensor_count": n_tensors,
        "block_count": n_layer_all,
        "nextn_predict_layers": nextn,
        "mtp": nextn > 0,
        "trunk_layers": n_layer,
        "context_length": _opt_int(md, a + "context_length"),
        "embedding_length": n_embd,
        "feed_forward_length": _compact(md.get(a + "feed_forward_length")),
        "vocab_size": _vocab_size(md, a, token_embd_dims),
        "head_count": _compact(head_count_raw),
        "head_count_kv": _compact(hkv_raw) if hkv_raw is not None else _compact(head_count_raw),
        "key_length": key_length,
        "value_length": value_length,
        "kv_layers": kv_layers,
        "recurrent": recurrent,
        "tensor_bytes": tensor_bytes,
        "decode_bytes": decode_bytes,
    }


_EXPERTS_RE = re.compile(r"\.ffn_(gate|up|down|gate_up)_exps\.")
_ROW_READ = ("token_embd.weight", ".nextn.embed_tokens.weight")


def _one_row(t: TensorInfo) -> int:
    """Bytes of one row (ne[1] index) of a 2-D embedding table: what a lookup of one token reads."""
    rows = t.dims[1] if len(t.dims) >= 2 and t.dims[1] else 1
    return t.n_bytes // rows


def decode_step_bytes(tensors, n_layer: int, n_layer_all: int, n_expert: int = 0, n_expert_used: int = 0) -> dict:
    """Bytes of weights one single-token decode step reads, and one MTP draft step, from the tensor table.

    ``token``: every trunk block tensor (blk.N.*, N < n_layer), the output norm and head (the whole
    token_embd when the head is tied to it, i.e. there is no output.weight) and any other non-block
    tensor, plus one row of token_embd (the lookup of the token). Routed-expert tensors
    (``ffn_{gate,up,down,gate_up}_exps``) count n_expert_used / n_expert of their bytes: a token reads
    only the experts the router picks (shared experts and the router are read whole).
    ``mtp_draft``: one draft token of the MTP head: the nextn blocks (blk.N.*, N >= n_layer, experts
    scaled the same way; their own ``nextn.embed_tokens`` one row) plus, when a block has no
    ``nextn.shared_head_head``, the main output head it then predicts with, and one token_embd row.
    0 without nextn blocks. Lower bounds for a batch (MTP verification of several tokens may pick
    more experts); exact for dense models. KV cache reads are not weights and not counted.
    """
    frac = (n_expert_used / n_expert) if n_expert and n_expert_used else 1.0
    token = mtp = 0
    head = embd_row = embd_all = 0
    tied = True
    mtp_own_head = False
    for t in tensors:
        m = _BLK_RE.match(t.name)
        nbytes = t.n_bytes
        if m and int(m.group(1)) < n_layer_all:
            if _EXPERTS_RE.search(t.name):
                nbytes = int(round(nbytes * frac))
            if t.name.endswith(_ROW_READ[1]):
                nbytes = _one_row(t)
            if int(m.group(1)) < n_layer:
                token += nbytes
            else:
                mtp += nbytes
                mtp_own_head = mtp_own_head or t.name.endswith(".nextn.shared_head_head.weight")
        elif t.name == "token_embd.weight":
            embd_row = _one_row(t)
            embd_all = t.n_bytes
        elif t.name == "output.weight":
            tied = False
            head += t.n_bytes
        else:  # output_norm, rope factors, ...
            token += nbytes
    if tied:
        head = embd_all
    token += head + embd_row
    if n_layer_all > n_layer:
        mtp += embd_row + (0 if mtp_own_head else head)
    return {
        "token": token,
        "mtp_draft": mtp,
        "expert_fraction": round(frac, 6),
    }


def _compact(v):
    """Per-layer arrays stay lists of ints; scalars stay scalars (None when absent)."""
    if isinstance(v, list):
        return [int(x) for x in v]
    return v


def kv_bytes_per_token(info: dict, bytes_per_element: float = 2, layers=None) -> float:
    """KV cache bytes per token over `layers` (default: the trunk's kv_layers) of a summary dict.

    K and V per layer are head_count_kv(il) * key_length and head_count_kv(il) * value_length elements
    (T llama_hparams::n_embd_k_gqa/n_embd_v_gqa); bytes_per_element 2 is f16 (the llama-server default).
    For the MTP context pass layers=range(trunk_layers, block_count).
    """
    hkv = info["head_count_kv"]
    total = 0
    for il in info["kv_layers"] if layers is None else layers:
        h = hkv[il] if isinstance(hkv, list) else hkv
        total += h * (info["key_length"] + info["value_length"])
    return total * bytes_per_element


def gguf_info(path: str | os.PathLike) -> dict:
    """Read a GGUF file (or every part of its split set) and return the facts.md summary."""
    return summarize(read_gguf_parts(path))
