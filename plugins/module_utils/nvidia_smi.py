"""Read NVIDIA's ``nvidia-smi`` output and build the ``gpu_facts`` dict (docs/facts.md).

Pure logic, no Ansible imports: the ``gpu_facts`` module and the tests feed it text.

Command lines (exported so the module, the stand-in and the tests agree):

* ``nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv,noheader,nounits``: one CSV row per GPU.
  ``compute_cap`` is a query field only from driver R510 on; older drivers (470 and before)
  answer ``Field "compute_cap" is not a valid field to query.`` with exit code 2, and the
  query is then repeated with LEGACY_QUERY_FIELDS (compute capability becomes null).
* ``nvidia-smi topo -m``: link matrix, CPU affinity and NUMA affinity.
* ``nvidia-smi`` (no arguments): the table; only its header is used, for
  ``CUDA Version: X.Y`` (the highest CUDA the driver supports). No query field carries the
  driver's CUDA version, and the header has printed it since driver R410, so the table is the
  cheapest source (``nvidia-smi -q`` prints the same value but runs to hundreds of lines per GPU).

``nvidia-smi -L`` is parsed too (parse_list) for tools and tests; the module does not need it.

Assumptions (not settled by the captures in tests/fixtures/nvidia-smi, documented here):

* nvidia-smi prints per-GPU failures as ``Unable to determine the device handle for GPU
  0000:0B:00.0: Unknown Error`` (seen with ``GPU`` and ``gpu``, with and without the space after
  it) in place of that GPU's row, so such a line's position in the output is the GPU's index.
  With such a GPU, plain ``nvidia-smi`` and ``topo -m`` may print only that line: the facts
  then have no CUDA version and an empty topology with ``topology.error`` saying why.
* A field that NVML cannot read for a sick GPU is printed in brackets, e.g.
  ``[Unknown Error]`` or ``[GPU requires reset]`` (any letter case); other bracketed values
  (``[N/A]``, ``[Not Supported]``, ``[Insufficient Permissions]``) mean "not available" and
  become null, except in the fields the planner cannot do without (REQUIRED_FIELDS: memory
  total and free), where they make the GPU unusable (``healthy: false`` and the reason).
* Output is decoded as UTF-8 with replacement characters (decode_output), never passed on as
  raw bytes; ANSI escape sequences are removed with or without their ESC byte (pasted output
  loses it: ``[4mGPU0[0m``); CRLF line ends and spaces in place of tabs are accepted.
* Every error message is one line: it names the command and quotes at most QUOTE_LIMIT
  characters of its output.
* In ``topo -m`` the first two columns after the link columns are CPU Affinity and NUMA
  Affinity; real drivers print an extra empty column before ``GPU NUMA ID``, so later
  columns are not mapped by position. A NUMA affinity that is not a single integer
  (``N/A``, empty, a range) becomes null.
"""

from __future__ import annotations

import re

QUERY_FIELDS = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "memory.total",
    "memory.used",
    "memory.free",
    "compute_cap",
    "mig.mode.current",
    "driver_version",
)
LEGACY_QUERY_FIELDS = tuple(f for f in QUERY_FIELDS if f != "compute_cap")
QUERY_FORMAT = "csv,noheader,nounits"
QUERY_ARGS = ("--query-gpu=" + ",".join(QUERY_FIELDS), "--format=" + QUERY_FORMAT)
LEGACY_QUERY_ARGS = ("--query-gpu=" + ",".join(LEGACY_QUERY_FIELDS), "--format=" + QUERY_FORMAT)
TOPO_ARGS = ("topo", "-m")
TABLE_ARGS = ()
LIST_ARGS = ("-L",)

# Whole-tool failures: nvidia-smi cannot talk to NVML or the kernel driver.
FATAL_MARKERS = (
    "Failed to initialize NVML",
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver",
    "NVIDIA-SMI couldn't find libnvidia-ml.so",
    "Driver/library version mismatch",
)
NO_DEVICES_MARKER = "No devices were found"
# Words nvidia-smi uses for a sick GPU, in a field or in a device-handle line (any letter case).
GPU_ERROR_WORDS = ("Unknown Error", "GPU is lost", "GPU requires reset", "ERR!")
# Query fields without which a GPU cannot be planned on: "not available" there makes it unusable.
REQUIRED_FIELDS = ("memory.total", "memory.free")
QUOTE_LIMIT = 200  # most characters of nvidia-smi's output an error message quotes

# CSI sequences with their ESC byte (or its caret form ^[), and the SGR/erase forms that lose it
# in pasted output ("[4m", "[0;1m", "[2K"); bracketed values such as [N/A] have no digit+letter end.
_ANSI_RE = re.compile(
    r"(?:\x1b|\^\[)\[[0-9;?]*[ -/]*[@-~]|(?:\x1b|\^\[)[()][0-9A-Za-z]|\x1b[=>]|\[(?:\d{1,3};)*\d{1,3}[mKJ]|\x1b"
)
_BUS_ID = r"[0-9A-Fa-f]{3,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]"
_HANDLE_ERROR_RE = re.compile(
    r"Unable to determine the device handle for gpu\s*(" + _BUS_ID + r")?\s*:?\s*(.*\S)?", re.IGNORECASE
)
_WARNING_RE = re.compile(r"^\s*warning\s*:", re.IGNORECASE)
_UNSUPPORTED_FIELD_RE = re.compile(r'Field "([^"]+)" is not a valid field to query')
_FIELD_ALIASES = {
    "gpu_name": "name",
    "gpu_uuid": "uuid",
    "gpu_bus_id": "pci.bus_id",
    "compute_capability": "compute_cap",
}
_HEADER_CELL_RE = re.compile(r"^[a-z][a-z0-9_.]*(\s*\[[^\]]*\])?$")
_LINK_CODE_RE = re.compile(r"^(X|NV\d+|[A-Z][A-Z0-9]*(/[A-Z]+)?)$")
_TOPO_LABELS = (("CPU Affinity", "CPU_Affinity"), ("NUMA Affinity", "NUMA_Affinity"), ("GPU NUMA ID", "GPU_NUMA_ID"))


def one_line(text: str) -> str:
    """Whitespace runs (newlines included) become one space; the ends are stripped."""
    return " ".join(str(text).split())


def quote(text: str, limit: int = QUOTE_LIMIT) -> str:
    """nvidia-smi's output for a message: one line, in double quotes, at most ``limit`` characters."""
    flat = one_line(text)
    if len(flat) > limit:
        flat = flat[: limit - 3].rstrip() + "..."
    return '"' + flat.replace('"', "'") + '"'


def _sentence(message: str) -> str:
    """One line without a dangling ": " or doubled full stop at the end."""
    flat = one_line(message).rstrip(" :;,")
    while flat.endswith(".."):
        flat = flat[:-1]
    return flat


class NvidiaSmiError(Exception):
    """nvidia-smi reported a problem; ``str(e)`` is one line that names the command (once known,
    ``.command``) and quotes at most QUOTE_LIMIT characters of nvidia-smi's own words."""

    def __init__(self, message: str, output: str = "", command: str | None = None):
        super().__init__(message)
        self.message = message
        self.output = output
        self.command = command

    def __str__(self) -> str:
        msg = _sentence(self.message)
        if self.command and not msg.startswith("`"):
            msg = f"`{self.command}`: {msg}"
        return msg


class NvmlError(NvidiaSmiError):
    """nvidia-smi cannot reach NVML / the kernel driver (no GPU can be read)."""


class NoDevicesError(NvidiaSmiError):
    """nvidia-smi runs but says ``No devices were found``."""


class UnsupportedFieldError(NvidiaSmiError):
    """The driver's nvidia-smi does not know a --query-gpu field (``.field``)."""

    def __init__(self, message: str, output: str = "", field: str = "", command: str | None = None):
        super().__init__(message, output, command)
        self.field = field


class ParseError(NvidiaSmiError):
    """Output that does not have the expected shape; ``.text`` is the offending text."""

    def __init__(self, message: str, text: str, command: str | None = None):
        super().__init__(f"{message}; offending output: {quote(text)}", text, command)
        self.text = text


class GpuError(NvidiaSmiError):
    """One or more GPUs report an error; ``.facts`` holds what could be read (healthy=false)."""

    def __init__(self, message: str, facts: dict, output: str = "", command: str | None = None):
        super().__init__(message, output, command)
        self.facts = facts


def decode_output(data) -> str:
    """nvidia-smi's output as text: bytes are decoded as UTF-8 with U+FFFD for invalid bytes; a str
    that carries surrogate escapes (a non-UTF-8 byte decoded with ``surrogateescape``) is repaired the
    same way, so nothing that JSON cannot encode reaches Ansible. None becomes ""."""
    if data is None:
        return ""
    if isinstance(data, (bytes, bytearray)):
        return bytes(data).decode("utf-8", errors="replace")
    text = str(data)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="replace")
    return text


def strip_ansi(text: str) -> str:
    return _ANSI_RE.sub("", text)


def clean_text(data) -> str:
    """decode_output + ANSI escapes removed + CRLF/CR line ends made LF."""
    text = strip_ansi(decode_output(data))
    return text.replace("\r\n", "\n").replace("\r", "\n")


def raise_for_fatal(text: str) -> None:
    """Raise NvmlError / NoDevicesError when nvidia-smi says it cannot work at all."""
    clean = clean_text(text).strip()
    low = clean.lower()
    for marker in FATAL_MARKERS:
        if marker.lower() in low:
            raise NvmlError(
                f"nvidia-smi cannot talk to the NVIDIA driver: {quote(clean)}. Check that the kernel module and "
                "the user-space driver are installed and of the same version (reboot after a driver upgrade).",
                clean,
            )
    if NO_DEVICES_MARKER.lower() in low:
        raise NoDevicesError(f"nvidia-smi: {quote(clean)}", clean)
    m = _UNSUPPORTED_FIELD_RE.search(clean)
    if m:
        raise UnsupportedFieldError(f"nvidia-smi: {quote(clean)}", clean, field=m.group(1))


def normalize_bus_id(bus_id: str) -> str:
    """``0000:3B:00.0`` (device-handle messages) -> ``00000000:3B:00.0`` (pci.bus_id form)."""
    domain, rest = bus_id.split(":", 1)
    return domain.rjust(8, "0").upper() + ":" + rest.upper()


def _gpu_error_words(value: str) -> bool:
    low = value.lower()
    return any(w.lower() in low for w in GPU_ERROR_WORDS)


def _blank_gpu(index: int | None) -> dict:
    return {
        "index": index,
        "uuid": None,
        "name": None,
        "pci_bus_id": None,
        "memory_total_mib": None,
        "memory_used_mib": None,
        "memory_free_mib": None,
        "compute_capability": None,
        "mig_mode": None,
        "numa_node": None,
        "cpu_affinity": None,
        "healthy": True,
        "error": None,
    }


def _value(raw: str) -> str | None:
    """A query cell without decoration; None when nvidia-smi says it is not available or an error."""
    v = raw.strip()
    if v.lower() in ("", "n/a", "not supported") or (v.startswith("[") and v.endswith("]")) or _gpu_error_words(v):
        return None
    return v


def _mib(raw: str, field: str, line: str) -> int | None:
    v = _value(raw)
    if v is None:
        return None
    m = re.fullmatch(r"(\d+)(?:\s*MiB)?", v, re.IGNORECASE)
    if not m:
        raise ParseError(f"{field} is not a MiB count", line)
    return int(m.group(1))


def _header_name(cell: str) -> str:
    name = re.sub(r"\s*\[[^\]]*\]$", "", cell.strip())
    return _FIELD_ALIASES.get(name, name)


def _handle_error_entry(line: str, handle) -> dict:
    """A GPU entry for a device-handle error line (healthy: false, the line as the reason)."""
    gpu = _blank_gpu(None)
    if handle.group(1):
        gpu["pci_bus_id"] = normalize_bus_id(handle.group(1))
    gpu["healthy"] = False
    gpu["error"] = one_line(line)
    return gpu


def _query_header(cells: list[str], fields: tuple[str, ...]) -> list[str] | None:
    """The column names when a CSV line is a header (every cell a field name, one of them known), else None."""
    names = [_header_name(c) for c in cells]
    if all(_HEADER_CELL_RE.match(c) for c in cells) and set(names) & set(fields):
        return names
    return None


def _short_row_entry(line: str, cells: list[str], columns: list[str]) -> dict:
    """A row with fewer cells than columns: a GPU entry when it is only an error (e.g. "[GPU requires reset]"),
    else ParseError."""
    if not _gpu_error_words(line):
        raise ParseError(
            f"expected {len(columns)} comma-separated values ({','.join(columns)}) from "
            f"`nvidia-smi --query-gpu`, found {len(cells)}",
            line,
        )
    gpu = _blank_gpu(None)
    gpu["healthy"] = False
    gpu["error"] = one_line(line)
    return gpu


def _row_index(row: dict, errors: list[str], line: str) -> int | None:
    """The GPU index of a row; None (placed by position later) when absent, not available or an error value."""
    if "index" not in row:
        return None
    if row["index"].isdigit():
        return int(row["index"])
    if not (errors or _value(row["index"]) is None):
        raise ParseError("GPU index is not an integer", line)
    return None


def _row_compute_cap(row: dict, line: str) -> str | None:
    """The compute capability of a row (MAJOR.MINOR) or None; ParseError for any other value."""
    cc = _value(row.get("compute_cap", ""))
    if cc is not None and not re.fullmatch(r"\d+\.\d+", cc):
        raise ParseError("compute_cap is not MAJOR.MINOR", line)
    return cc


def _row_mig_mode(row: dict, line: str) -> str | None:
    """The current MIG mode of a row (Enabled / Disabled, any letter case) or None; ParseError for any other value."""
    mig = _value(row.get("mig.mode.current", ""))
    if mig is not None and mig.capitalize() not in ("Enabled", "Disabled"):
        raise ParseError("mig.mode.current is neither Enabled nor Disabled", line)
    return mig.capitalize() if mig else None


def _query_row_entry(row: dict, line: str) -> dict:
    """The GPU entry of one data row (cells by column name): its values, and healthy: false with the reasons when a
    field shows an error word or a REQUIRED_FIELDS field is not available."""
    gpu = _blank_gpu(None)
    errors = [f"{k}: {v}" for k, v in row.items() if _gpu_error_words(v)]
    gpu["index"] = _row_index(row, errors, line)
    gpu["uuid"] = _value(row.get("uuid", ""))
    gpu["name"] = _value(row.get("name", ""))
    bus = _value(row.get("pci.bus_id", ""))
    gpu["pci_bus_id"] = normalize_bus_id(bus) if bus and re.fullmatch(_BUS_ID, bus) else bus
    gpu["memory_total_mib"] = _mib(row.get("memory.total", ""), "memory.total", line)
    gpu["memory_used_mib"] = _mib(row.get("memory.used", ""), "memory.used", line)
    gpu["memory_free_mib"] = _mib(row.get("memory.free", ""), "memory.free", line)
    if not errors:
        # "not available" where the planner cannot do without it: unusable, say which field
        errors = [f"{k}: {row[k]}" for k in REQUIRED_FIELDS if k in row and _value(row[k]) is None]
    gpu["compute_capability"] = _row_compute_cap(row, line)
    gpu["mig_mode"] = _row_mig_mode(row, line)
    if errors:
        gpu["healthy"] = False
        gpu["error"] = "; ".join(errors)
    return gpu


def parse_query(text: str, fields: tuple[str, ...] = QUERY_FIELDS) -> dict:
    """Parse ``--query-gpu`` CSV (header or not, units or not) into ``{"gpus": [...], "driver_version": ...}``.

    With a header line the columns are taken from it (so captures with other field lists
    parse too); without one, ``fields`` names them. Extra trailing columns are ignored.
    GPUs that report an error (a device-handle line, an error word in any field, "not available"
    in a REQUIRED_FIELDS field, a row that is only an error) get ``healthy: false`` and ``error``
    with nvidia-smi's words; their unreadable values are null.
    """
    clean = clean_text(text)
    raise_for_fatal(clean)
    columns = list(fields)
    entries: list[dict] = []
    driver_versions: list[str] = []
    header_seen = False
    for line in clean.splitlines():
        if not line.strip() or _WARNING_RE.match(line):
            continue  # e.g. "WARNING: infoROM is corrupted at gpu 0000:3B:00.0": the GPU still works
        handle = _HANDLE_ERROR_RE.search(line)
        if handle:
            entries.append(_handle_error_entry(line, handle))
            continue
        cells = [c.strip() for c in line.split(",")]
        header = None if header_seen or entries else _query_header(cells, fields)
        if header is not None:
            columns = header
            header_seen = True
            continue
        if len(cells) < len(columns):
            entries.append(_short_row_entry(line, cells, columns))
            continue
        row = {name: cells[i] for i, name in enumerate(columns)}  # extra trailing cells are ignored
        entries.append(_query_row_entry(row, line))
        drv = _value(row.get("driver_version", ""))
        if drv:
            driver_versions.append(drv)
    # A device-handle line stands where that GPU's row would be: its position is its index.
    for position, gpu in enumerate(entries):
        if gpu["index"] is None:
            gpu["index"] = position
    return {"gpus": entries, "driver_version": driver_versions[0] if driver_versions else None}


def _topo_cells(line: str) -> list[str]:
    """Cells of a ``topo -m`` line: tab-separated (empty cells kept), or space-separated where the
    tabs became spaces (also inside a tab-separated line: a cell holding spaces is split up)."""
    for words, token in _TOPO_LABELS:
        line = re.sub(r"\s+".join(words.split()), token, line, flags=re.IGNORECASE)
    if "\t" not in line:
        return line.split()
    cells: list[str] = []
    for cell in line.split("\t"):
        parts = cell.split()
        cells.extend(parts if parts else [""])
    return cells


def parse_topology(text: str) -> dict:
    """Parse ``nvidia-smi topo -m``.

    Returns ``{"matrix": [[code]], "nvlink_groups": [[i]], "affinity": [{"cpu_affinity", "numa_node"}],
    "columns": [...]}`` with rows and columns indexed by GPU index. NIC rows/columns and the
    legend are skipped; tabs or runs of spaces, ANSI colour codes and trailing columns are accepted.
    """
    clean = clean_text(text)
    raise_for_fatal(clean)
    lines = clean.splitlines()
    start = next((i for i, ln in enumerate(lines) if re.match(r"^\s+GPU0(\s|$)", ln)), None)
    if start is None:
        raise ParseError("no GPU0 column header in `nvidia-smi topo -m` output", text)
    header = [c for c in _topo_cells(lines[start]) if c]
    labels = [label[1] for label in _TOPO_LABELS]
    n_links = next((i for i, c in enumerate(header) if c in labels), len(header))
    link_cols = header[:n_links]
    trailing = header[n_links:]
    gpu_cols = [c for c in link_cols if re.fullmatch(r"GPU\d+", c)]
    if gpu_cols != [f"GPU{i}" for i in range(len(gpu_cols))]:
        raise ParseError("GPU columns of `nvidia-smi topo -m` are not GPU0..GPUn in order", lines[start])
    rows: dict[int, tuple[list[str], list[str]]] = {}
    for line in lines[start + 1 :]:
        if not line.strip() or line.strip().startswith("Legend"):
            break
        cells = _topo_cells(line)
        label = cells[0] if cells else ""
        if not re.fullmatch(r"GPU\d+", label):
            continue  # NIC0.., mlx5_0 (older drivers): not ours
        links = cells[1 : 1 + n_links]
        if len(links) < n_links or any(not _LINK_CODE_RE.match(c) for c in links):
            raise ParseError(f"row {label} of `nvidia-smi topo -m` does not have {n_links} link codes", line)
        rows[int(label[3:])] = (links, cells[1 + n_links :])
    n = len(gpu_cols)
    if sorted(rows) != list(range(n)):
        raise ParseError(f"`nvidia-smi topo -m` has {n} GPU columns but GPU rows {sorted(rows)}", text)
    matrix = []
    affinity = []
    for i in range(n):
        links, rest = rows[i]
        row = [links[link_cols.index(f"GPU{j}")] for j in range(n)]
        if row[i] != "X":
            raise ParseError(f"GPU{i} is not 'X' to itself in `nvidia-smi topo -m`", " ".join(links))
        matrix.append(row)
        values = {name: rest[k] for k, name in enumerate(trailing) if k < len(rest)}
        cpu = values.get("CPU_Affinity")
        numa = values.get("NUMA_Affinity")
        affinity.append(
            {
                "cpu_affinity": cpu if cpu and cpu != "N/A" else None,
                "numa_node": int(numa) if numa and numa.isdigit() else None,
            }
        )
    return {"matrix": matrix, "nvlink_groups": nvlink_groups(matrix), "affinity": affinity, "columns": link_cols}


def nvlink_groups(matrix: list[list[str]]) -> list[list[int]]:
    """Connected components over NV# links; singletons omitted; sorted."""
    n = len(matrix)
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(n):
        for j in range(n):
            if i != j and re.fullmatch(r"NV\d+", matrix[i][j]):
                parent[find(i)] = find(j)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(i)
    return sorted(g for g in groups.values() if len(g) > 1)


_TABLE_MEMORY_RE = re.compile(r"(\d+)\s*MiB\s*/\s*(\d+)\s*MiB")


def _table_versions(clean: str, text: str) -> dict:
    """nvidia-smi, driver and CUDA versions from the table's header; ParseError without ``NVIDIA-SMI <version>``."""
    version = re.search(r"NVIDIA-SMI\s+(\d[\w.]*)", clean)
    if not version:
        raise ParseError("no 'NVIDIA-SMI <version>' header in the nvidia-smi table", text)
    driver = re.search(r"Driver Version:\s*(\d[\w.]*)", clean)
    cuda = re.search(r"CUDA Version:\s*(\d+\.\d+)", clean)
    return {
        "nvidia_smi_version": version.group(1),
        "driver_version": driver.group(1) if driver else None,
        "cuda_version": cuda.group(1) if cuda else None,
    }


def _table_section(s: str, section: str | None) -> str | None:
    """The section a table line opens: "gpu" (the first Bus-Id header), "mig" or "processes"; None when none."""
    if "Bus-Id" in s and section is None:
        return "gpu"
    if s.startswith("| MIG devices:"):
        return "mig"
    if s.startswith("| Processes:"):
        return "processes"
    return None


def _table_gpu_head(cells: list[str]) -> dict | None:
    """A GPU entry when a GPU-section line opens a GPU's block (index, name, persistence mode | bus id), else None."""
    first = re.match(r"^\s*(\d+)\s+(.+?)\s+(\S+)\s*$", cells[0])
    bus = re.search(_BUS_ID, cells[1])
    if not (first and bus):
        return None
    return {
        "index": int(first.group(1)),
        "name": first.group(2),
        "persistence_mode": first.group(3),
        "pci_bus_id": normalize_bus_id(bus.group(0)),
        "memory_used_mib": None,
        "memory_total_mib": None,
        "mig_mode": None,
        "healthy": True,
        "error": None,
    }


def _table_gpu_detail(gpu: dict, block_line: int, cells: list[str]) -> None:
    """What a later line of a GPU's block adds: memory used/total from the first, the MIG mode from the second."""
    if block_line == 1:
        mem = _TABLE_MEMORY_RE.search(cells[1])
        if mem:
            gpu["memory_used_mib"] = int(mem.group(1))
            gpu["memory_total_mib"] = int(mem.group(2))
    elif block_line == 2 and cells[2].split():
        mig = cells[2].split()[-1]
        gpu["mig_mode"] = mig if mig in ("Enabled", "Disabled") else None


def _table_gpu_error(gpu: dict, s: str) -> None:
    """Mark a GPU unhealthy when its block's line shows an error word: the bracketed words or ERR! as the reason."""
    if _gpu_error_words(s):
        words = re.search(r"\[[^\]]+\]|ERR!", s, re.IGNORECASE)
        gpu["healthy"] = False
        gpu["error"] = words.group(0) if words else one_line(s.strip("|"))


def _table_mig_device(cells: list[str]) -> dict | None:
    """A MIG device entry when a MIG-section line lists GPU, GI, CI, MIG device and memory; else None."""
    m = re.match(r"^\s*(\d+)\s+(\d+|N/A)\s+(\d+|N/A)\s+(\d+)\s*$", cells[0])
    mem = _TABLE_MEMORY_RE.search(cells[1])
    if not (m and mem):
        return None
    gi, ci = m.group(2), m.group(3)
    return {
        "gpu": int(m.group(1)),
        "gi": int(gi) if gi.isdigit() else None,
        "ci": int(ci) if ci.isdigit() else None,
        "mig_dev": int(m.group(4)),
        "memory_used_mib": int(mem.group(1)),
        "memory_total_mib": int(mem.group(2)),
    }


def _table_devices(clean: str) -> tuple[list[dict], list[dict]]:
    """The table's GPU entries and MIG devices, line by line through its sections; a ``+---`` border ends a
    GPU's block."""
    gpus: list[dict] = []
    mig_devices: list[dict] = []
    section = None
    current = None
    block_line = 0
    for line in clean.splitlines():
        s = line.strip()
        opened = _table_section(s, section)
        if opened is not None:
            section = opened
            if opened != "gpu":
                current = None
        if not s.startswith("|") or s.startswith(("|=", "|-")):
            if s.startswith("+"):
                current = None
            continue
        cells = s.strip("|").split("|")
        if section == "gpu" and len(cells) >= 3:
            head = _table_gpu_head(cells)
            if head is not None:
                current, block_line = head, 0
                gpus.append(current)
            elif current is not None:
                block_line += 1
                _table_gpu_detail(current, block_line, cells)
            if current is not None:
                _table_gpu_error(current, s)
        elif section == "mig" and len(cells) >= 2:
            device = _table_mig_device(cells)
            if device is not None:
                mig_devices.append(device)
    return gpus, mig_devices


def parse_table(text: str) -> dict:
    """Parse the plain ``nvidia-smi`` table: header versions, per-GPU lines and the MIG section.

    GPU names in the table may be truncated by nvidia-smi (``NVIDIA RTX 4000 Ada Gene...``).
    Returns ``{"nvidia_smi_version", "driver_version", "cuda_version", "gpus": [...], "mig_devices": [...]}``;
    each GPU has index, name, persistence_mode, pci_bus_id, memory_used_mib, memory_total_mib,
    mig_mode (null for tables without the MIG M. line), healthy and error (``ERR!`` in a field).
    """
    clean = clean_text(text)
    raise_for_fatal(clean)
    versions = _table_versions(clean, text)
    gpus, mig_devices = _table_devices(clean)
    return {**versions, "gpus": gpus, "mig_devices": mig_devices}


_LIST_GPU_RE = re.compile(r"^\s*GPU (\d+): (.+?) \(UUID: ([^)]+)\)\s*$")
_LIST_MIG_RE = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: ([^)]+)\)\s*$")


def parse_list(text: str) -> list[dict]:
    """Parse ``nvidia-smi -L``: ``GPU 0: NAME (UUID: GPU-...)`` lines and indented MIG device lines;
    device-handle error lines (any letter case) become entries with ``healthy: false``."""
    clean = clean_text(text)
    raise_for_fatal(clean)
    gpus: list[dict] = []
    for line in clean.splitlines():
        if not line.strip() or _WARNING_RE.match(line):
            continue
        gpu = _LIST_GPU_RE.match(line)
        mig = _LIST_MIG_RE.match(line)
        handle = _HANDLE_ERROR_RE.search(line)
        if gpu:
            gpus.append(
                {
                    "index": int(gpu.group(1)),
                    "name": gpu.group(2),
                    "uuid": gpu.group(3),
                    "mig_devices": [],
                    "healthy": True,
                    "error": None,
                }
            )
        elif mig and gpus:
            gpus[-1]["mig_devices"].append({"profile": mig.group(1), "device": int(mig.group(2)), "uuid": mig.group(3)})
        elif handle:
            gpus.append(
                {
                    "index": len(gpus),
                    "name": None,
                    "uuid": None,
                    "mig_devices": [],
                    "healthy": False,
                    "error": one_line(line),
                }
            )
        else:
            raise ParseError("not a `nvidia-smi -L` line", line)
    return gpus


def empty_facts() -> dict:
    """The facts of a host without nvidia-smi or without GPUs."""
    return {
        "count": 0,
        "driver_version": None,
        "cuda_driver_version": None,
        "source": "none",
        "gpus": [],
        "topology": {"matrix": [], "nvlink_groups": []},
    }


def build_facts(query: dict, topology: dict | None, table: dict | None) -> dict:
    """Merge parsed query rows, ``topo -m`` and the table header into the docs/facts.md shape."""
    gpus = sorted((dict(g) for g in query["gpus"]), key=lambda g: g["index"])
    if [g["index"] for g in gpus] != list(range(len(gpus))):
        raise ParseError("GPU indexes from `nvidia-smi --query-gpu` are not 0..n-1", repr([g["index"] for g in gpus]))
    matrix: list[list[str]] = []
    groups: list[list[int]] = []
    if topology is not None:
        if len(topology["matrix"]) != len(gpus):
            raise ParseError(
                f"`nvidia-smi topo -m` lists {len(topology['matrix'])} GPUs but `--query-gpu` lists {len(gpus)}",
                repr(topology["columns"]),
            )
        matrix, groups = topology["matrix"], topology["nvlink_groups"]
        for i, gpu in enumerate(gpus):
            gpu.update(topology["affinity"][i])
    table = table or {}
    return {
        "count": len(gpus),
        "driver_version": query.get("driver_version") or table.get("driver_version"),
        "cuda_driver_version": table.get("cuda_version"),
        "source": "nvidia-smi",
        "gpus": gpus,
        "topology": {"matrix": matrix, "nvlink_groups": groups},
    }


REQUIRE_HEALTHY = ("none", "any", "all")


def command_label(argv: list[str]) -> str:
    """The command line for messages, option values shortened: ``nvidia-smi --query-gpu=... --format=...``."""
    return " ".join(a.split("=", 1)[0] + "=..." if a.startswith("--") and "=" in a else a for a in argv)


def _run_text(run, argv: list[str]) -> tuple[int, str, str]:
    """Run argv; (rc, stdout text, stdout+stderr text), decoded with replacement and cleaned."""
    rc, out, err = run(argv)
    out_text = clean_text(out)
    return rc, out_text, out_text + clean_text(err)


def _parse(parser, text: str, argv: list[str], *args):
    try:
        return parser(text, *args)
    except NvidiaSmiError as e:
        e.command = e.command or command_label(argv)
        raise


def _health_error(facts: dict, require_healthy: str, command: str) -> GpuError | None:
    sick = [g for g in facts["gpus"] if not g["healthy"]]
    healthy = len(facts["gpus"]) - len(sick)
    if not sick or require_healthy == "none" or (require_healthy == "any" and healthy > 0):
        return None
    words = "; ".join(
        f"GPU {g['index']} ({g['pci_bus_id'] or 'bus id unknown'}): {_sentence(g['error'] or 'error')[:QUOTE_LIMIT]}"
        for g in sick
    )
    why = "all" if require_healthy == "all" else "any (no healthy GPU left)"
    return GpuError(f"nvidia-smi reports a GPU error: {words} (require_healthy={why})", facts, command=command)


def collect(run, nvidia_smi: str, require_healthy: str = "none") -> dict:
    """Run nvidia-smi through ``run(argv) -> (rc, stdout, stderr)`` and return the gpu_facts dict.

    stdout/stderr may be bytes or str; they are decoded with replacement (decode_output). GPUs that
    report an error are entries with ``healthy: false`` and ``error``; the other GPUs are read as
    usual. When the table or ``topo -m`` cannot be read because of such a GPU (nvidia-smi then prints
    only the device-handle line), the facts carry no CUDA version, or an empty topology with
    ``topology.error``. ``require_healthy``: ``none`` (default) returns the facts anyway; ``any``
    raises GpuError when no GPU is healthy; ``all`` when any GPU is not.

    Raises NoDevicesError (the caller decides whether no GPU is fine), NvmlError, GpuError
    (facts attached, unhealthy GPUs marked) or ParseError / NvidiaSmiError, each one line naming
    the command.
    """
    if require_healthy not in REQUIRE_HEALTHY:
        raise ValueError(f"require_healthy must be one of {', '.join(REQUIRE_HEALTHY)}, got {require_healthy!r}")
    fields, argv = QUERY_FIELDS, [nvidia_smi, *QUERY_ARGS]
    rc, _out, text = _run_text(run, argv)
    try:
        _parse(raise_for_fatal, text, argv)
    except UnsupportedFieldError as e:
        if e.field != "compute_cap":
            raise
        fields, argv = LEGACY_QUERY_FIELDS, [nvidia_smi, *LEGACY_QUERY_ARGS]
        rc, _out, text = _run_text(run, argv)
    query = _parse(parse_query, text, argv, fields)
    label = command_label(argv)
    sick = [g for g in query["gpus"] if not g["healthy"]]
    if rc != 0 and not sick:
        raise NvidiaSmiError(f"exited with code {rc}: {quote(text) if text.strip() else '(no output)'}", text, label)
    if not query["gpus"]:
        raise NoDevicesError("nvidia-smi --query-gpu listed no GPUs", text, label)

    notes = {}
    parsed = {}
    for key, args, parser in (("table", TABLE_ARGS, parse_table), ("topology", TOPO_ARGS, parse_topology)):
        sub = [nvidia_smi, *args]
        sub_rc, out, sub_text = _run_text(run, sub)
        try:
            _parse(raise_for_fatal, sub_text, sub)
            if sub_rc != 0:
                raise NvidiaSmiError(
                    f"exited with code {sub_rc}: {quote(sub_text) if sub_text.strip() else '(no output)'}",
                    sub_text,
                    command_label(sub),
                )
            parsed[key] = _parse(parser, out, sub)
        except (NvmlError, NoDevicesError):
            raise
        except NvidiaSmiError as e:
            if not sick:
                raise
            parsed[key] = None  # the sick GPU spoils this command's output: facts without it
            notes[key] = str(e)
    topology = parsed["topology"]
    if sick and topology is not None and len(topology["matrix"]) != len(query["gpus"]):
        notes["topology"] = (
            f"`{command_label([nvidia_smi, *TOPO_ARGS])}` lists {len(topology['matrix'])} GPUs but "
            f"`{label}` lists {len(query['gpus'])} (with unhealthy GPUs the indexes cannot be matched)"
        )
        topology = None
    facts = build_facts(query, topology, parsed["table"])
    if "topology" in notes:
        facts["topology"]["error"] = _sentence(notes["topology"])
    problem = _health_error(facts, require_healthy, label)
    if problem is not None:
        problem.output = text
        raise problem
    return facts
