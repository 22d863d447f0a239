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
  0000:0B:00.0: Unknown Error`` (seen with and without the space after ``GPU``) in place of
  that GPU's row, so such a line's position in the output is the GPU's index.
* A field that NVML cannot read for a sick GPU is printed in brackets, e.g.
  ``[Unknown Error]`` or ``[GPU requires reset]``; other bracketed values (``[N/A]``,
  ``[Not Supported]``, ``[Insufficient Permissions]``) mean "not available" and become null.
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
# Words nvidia-smi uses for a sick GPU, in a field or in a device-handle line.
GPU_ERROR_WORDS = ("Unknown Error", "GPU is lost", "GPU requires reset", "ERR!")

_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_BUS_ID = r"[0-9A-Fa-f]{3,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]"
_HANDLE_ERROR_RE = re.compile(r"Unable to determine the device handle for GPU\s*(" + _BUS_ID + r")\s*:\s*(.*\S)")
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


class NvidiaSmiError(Exception):
    """nvidia-smi reported a problem; ``str(e)`` quotes nvidia-smi's own words."""

    def __init__(self, message: str, output: str = ""):
        super().__init__(message)
        self.output = output


class NvmlError(NvidiaSmiError):
    """nvidia-smi cannot reach NVML / the kernel driver (no GPU can be read)."""


class NoDevicesError(NvidiaSmiError):
    """nvidia-smi runs but says ``No devices were found``."""


class UnsupportedFieldError(NvidiaSmiError):
    """The driver's nvidia-smi does not know a --query-gpu field (``.field``)."""

    def __init__(self, message: str, output: str = "", field: str = ""):
        super().__init__(message, output)
        self.field = field


class ParseError(NvidiaSmiError):
    """Output that does not have the expected shape; ``.text`` is the offending text."""

    def __init__(self, message: str, text: str):
        shown = text if len(text) <= 600 else text[:600] + "..."
        super().__init__(f"{message}; offending output: {shown!r}", text)
        self.text = text


class GpuError(NvidiaSmiError):
    """One or more GPUs report an error; ``.facts`` holds what could be read (healthy=false)."""

    def __init__(self, message: str, facts: dict, output: str = ""):
        super().__init__(message, output)
        self.facts = facts


def strip_ansi(text: str) -> str:
    return _ANSI_RE.sub("", text)


def raise_for_fatal(text: str) -> None:
    """Raise NvmlError / NoDevicesError when nvidia-smi says it cannot work at all."""
    clean = strip_ansi(text).strip()
    for marker in FATAL_MARKERS:
        if marker in clean:
            raise NvmlError(
                f"nvidia-smi cannot talk to the NVIDIA driver: {clean}. Check that the kernel module and the "
                "user-space driver are installed and of the same version (reboot after a driver upgrade).",
                text,
            )
    if NO_DEVICES_MARKER in clean:
        raise NoDevicesError(f"nvidia-smi: {clean}", text)
    m = _UNSUPPORTED_FIELD_RE.search(clean)
    if m:
        raise UnsupportedFieldError(f"nvidia-smi: {clean}", text, field=m.group(1))


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
    if v in ("", "N/A", "Not Supported") or (v.startswith("[") and v.endswith("]")) or _gpu_error_words(v):
        return None
    return v


def _mib(raw: str, field: str, line: str) -> int | None:
    v = _value(raw)
    if v is None:
        return None
    m = re.fullmatch(r"(\d+)(?:\s*MiB)?", v)
    if not m:
        raise ParseError(f"{field} is not a MiB count", line)
    return int(m.group(1))


def _header_name(cell: str) -> str:
    name = re.sub(r"\s*\[[^\]]*\]$", "", cell.strip())
    return _FIELD_ALIASES.get(name, name)


def parse_query(text: str, fields: tuple[str, ...] = QUERY_FIELDS) -> dict:
    """Parse ``--query-gpu`` CSV (header or not, units or not) into ``{"gpus": [...], "driver_version": ...}``.

    With a header line the columns are taken from it (so captures with other field lists
    parse too); without one, ``fields`` names them. Extra trailing columns are ignored.
    GPUs that report an error get ``healthy: false`` and ``error`` with nvidia-smi's words.
    """
    clean = strip_ansi(text)
    raise_for_fatal(clean)
    columns = list(fields)
    entries: list[dict] = []
    driver_versions: list[str] = []
    header_seen = False
    for line in clean.splitlines():
        if not line.strip() or line.startswith("WARNING:"):
            continue  # e.g. "WARNING: infoROM is corrupted at gpu 0000:3B:00.0": the GPU still works
        handle = _HANDLE_ERROR_RE.search(line)
        if handle:
            gpu = _blank_gpu(None)
            gpu["pci_bus_id"] = normalize_bus_id(handle.group(1))
            gpu["healthy"] = False
            gpu["error"] = line.strip()
            entries.append(gpu)
            continue
        cells = [c.strip() for c in line.split(",")]
        names = [_header_name(c) for c in cells]
        if (
            not header_seen
            and not entries
            and all(_HEADER_CELL_RE.match(c) for c in cells)
            and set(names) & set(fields)
        ):
            columns = names
            header_seen = True
            continue
        if len(cells) < len(columns):
            raise ParseError(
                f"expected {len(columns)} comma-separated values ({','.join(columns)}) from "
                f"`nvidia-smi --query-gpu`, found {len(cells)}",
                line,
            )
        row = dict(zip(columns, cells))  # extra trailing cells are ignored
        gpu = _blank_gpu(None)
        if "index" in row:
            if not row["index"].isdigit():
                raise ParseError("GPU index is not an integer", line)
            gpu["index"] = int(row["index"])
        gpu["uuid"] = _value(row.get("uuid", ""))
        gpu["name"] = _value(row.get("name", ""))
        bus = _value(row.get("pci.bus_id", ""))
        gpu["pci_bus_id"] = normalize_bus_id(bus) if bus and re.fullmatch(_BUS_ID, bus) else bus
        gpu["memory_total_mib"] = _mib(row.get("memory.total", ""), "memory.total", line)
        gpu["memory_used_mib"] = _mib(row.get("memory.used", ""), "memory.used", line)
        gpu["memory_free_mib"] = _mib(row.get("memory.free", ""), "memory.free", line)
        errors = [f"{k}: {v}" for k, v in row.items() if _gpu_error_words(v)]
        cc = _value(row.get("compute_cap", ""))
        if cc is not None and not re.fullmatch(r"\d+\.\d+", cc):
            raise ParseError("compute_cap is not MAJOR.MINOR", line)
        gpu["compute_capability"] = cc
        mig = _value(row.get("mig.mode.current", ""))
        if mig is not None and mig not in ("Enabled", "Disabled"):
            raise ParseError("mig.mode.current is neither Enabled nor Disabled", line)
        gpu["mig_mode"] = mig
        if errors:
            gpu["healthy"] = False
            gpu["error"] = "; ".join(errors)
        drv = _value(row.get("driver_version", ""))
        if drv:
            driver_versions.append(drv)
        entries.append(gpu)
    # A device-handle line stands where that GPU's row would be: its position is its index.
    for position, gpu in enumerate(entries):
        if gpu["index"] is None:
            gpu["index"] = position
    return {"gpus": entries, "driver_version": driver_versions[0] if driver_versions else None}


def _topo_cells(line: str) -> list[str]:
    for words, token in _TOPO_LABELS:
        line = line.replace(words, token)
    if "\t" in line:
        return [c.strip() for c in line.split("\t")]
    return line.split()


def parse_topology(text: str) -> dict:
    """Parse ``nvidia-smi topo -m``.

    Returns ``{"matrix": [[code]], "nvlink_groups": [[i]], "affinity": [{"cpu_affinity", "numa_node"}],
    "columns": [...]}`` with rows and columns indexed by GPU index. NIC rows/columns and the
    legend are skipped; tabs or runs of spaces, ANSI colour codes and trailing columns are accepted.
    """
    clean = strip_ansi(text)
    raise_for_fatal(clean)
    lines = clean.splitlines()
    start = next((i for i, ln in enumerate(lines) if re.match(r"^\s+GPU0(\s|$)", ln)), None)
    if start is None:
        raise ParseError("no GPU0 column header in `nvidia-smi topo -m` output", text)
    header = [c for c in _topo_cells(lines[start]) if c]
    labels = [token for _dummy, token in _TOPO_LABELS]
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
        label = cells[0]
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
        values = dict(zip(trailing, rest))
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


def parse_table(text: str) -> dict:
    """Parse the plain ``nvidia-smi`` table: header versions, per-GPU lines and the MIG section.

    GPU names in the table may be truncated by nvidia-smi (``NVIDIA RTX 4000 Ada Gene...``).
    Returns ``{"nvidia_smi_version", "driver_version", "cuda_version", "gpus": [...], "mig_devices": [...]}``;
    each GPU has index, name, persistence_mode, pci_bus_id, memory_used_mib, memory_total_mib,
    mig_mode (null for tables without the MIG M. line), healthy and error (``ERR!`` in a field).
    """
    clean = strip_ansi(text)
    raise_for_fatal(clean)
    version = re.search(r"NVIDIA-SMI\s+(\d[\w.]*)", clean)
    if not version:
        raise ParseError("no 'NVIDIA-SMI <version>' header in the nvidia-smi table", text)
    driver = re.search(r"Driver Version:\s*(\d[\w.]*)", clean)
    cuda = re.search(r"CUDA Version:\s*(\d+\.\d+)", clean)
    gpus: list[dict] = []
    mig_devices: list[dict] = []
    section = None
    current = None
    block_line = 0
    for line in clean.splitlines():
        s = line.strip()
        if "Bus-Id" in s and section is None:
            section = "gpu"
        elif s.startswith("| MIG devices:"):
            section, current = "mig", None
        elif s.startswith("| Processes:"):
            section, current = "processes", None
        if not s.startswith("|") or s.startswith(("|=", "|-")):
            if s.startswith("+"):
                current = None
            continue
        cells = s.strip("|").split("|")
        if section == "gpu" and len(cells) >= 3:
            first = re.match(r"^\s*(\d+)\s+(.+?)\s+(\S+)\s*$", cells[0])
            bus = re.search(_BUS_ID, cells[1])
            if first and bus:
                current = {
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
                gpus.append(current)
                block_line = 0
            elif current is not None:
                block_line += 1
                if block_line == 1:
                    mem = re.search(r"(\d+)\s*MiB\s*/\s*(\d+)\s*MiB", cells[1])
                    if mem:
                        current["memory_used_mib"] = int(mem.group(1))
                        current["memory_total_mib"] = int(mem.group(2))
                elif block_line == 2 and cells[2].split():
                    mig = cells[2].split()[-1]
                    current["mig_mode"] = mig if mig in ("Enabled", "Disabled") else None
            if current is not None and "ERR!" in s:
                current["healthy"] = False
                current["error"] = "ERR!"
        elif section == "mig" and len(cells) >= 2:
            m = re.match(r"^\s*(\d+)\s+(\d+|N/A)\s+(\d+|N/A)\s+(\d+)\s*$", cells[0])
            mem = re.search(r"(\d+)\s*MiB\s*/\s*(\d+)\s*MiB", cells[1])
            if m and mem:
                gi, ci = m.group(2), m.group(3)
                mig_devices.append(
                    {
                        "gpu": int(m.group(1)),
                        "gi": int(gi) if gi.isdigit() else None,
                        "ci": int(ci) if ci.isdigit() else None,
                        "mig_dev": int(m.group(4)),
                        "memory_used_mib": int(mem.group(1)),
                        "memory_total_mib": int(mem.group(2)),
                    }
                )
    return {
        "nvidia_smi_version": version.group(1),
        "driver_version": driver.group(1) if driver else None,
        "cuda_version": cuda.group(1) if cuda else None,
        "gpus": gpus,
        "mig_devices": mig_devices,
    }


_LIST_GPU_RE = re.compile(r"^GPU (\d+): (.+?) \(UUID: ([^)]+)\)\s*$")
_LIST_MIG_RE = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: ([^)]+)\)\s*$")


def parse_list(text: str) -> list[dict]:
    """Parse ``nvidia-smi -L``: ``GPU 0: NAME (UUID: GPU-...)`` lines and indented MIG device lines."""
    clean = strip_ansi(text)
    raise_for_fatal(clean)
    gpus: list[dict] = []
    for line in clean.splitlines():
        if not line.strip():
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
                    "error": line.strip(),
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
        for gpu, aff in zip(gpus, topology["affinity"]):  # same length: checked above, one affinity per matrix row
            gpu.update(aff)
    table = table or {}
    return {
        "count": len(gpus),
        "driver_version": query.get("driver_version") or table.get("driver_version"),
        "cuda_driver_version": table.get("cuda_version"),
        "source": "nvidia-smi",
        "gpus": gpus,
        "topology": {"matrix": matrix, "nvlink_groups": groups},
    }


def _run_checked(run, argv: list[str]) -> str:
    rc, out, err = run(argv)
    text = (out or "") + (err or "")
    raise_for_fatal(text)
    if rc != 0:
        raise NvidiaSmiError(f"`{' '.join(argv)}` exited with code {rc}: {text.strip() or '(no output)'}", text)
    return out or ""


def collect(run, nvidia_smi: str) -> dict:
    """Run nvidia-smi through ``run(argv) -> (rc, stdout, stderr)`` and return the gpu_facts dict.

    Raises NoDevicesError (the caller decides whether no GPU is fine), NvmlError, GpuError
    (facts attached, unhealthy GPUs marked) or ParseError / NvidiaSmiError.
    """
    fields, args = QUERY_FIELDS, QUERY_ARGS
    rc, out, err = run([nvidia_smi, *args])
    text = (out or "") + (err or "")
    try:
        raise_for_fatal(text)
    except UnsupportedFieldError as e:
        if e.field != "compute_cap":
            raise
        fields, args = LEGACY_QUERY_FIELDS, LEGACY_QUERY_ARGS
        rc, out, err = run([nvidia_smi, *args])
        text = (out or "") + (err or "")
    query = parse_query(text, fields)
    sick = [g for g in query["gpus"] if not g["healthy"]]
    if sick:
        words = "; ".join(f"GPU {g['index']} ({g['pci_bus_id'] or 'bus id unknown'}): {g['error']}" for g in sick)
        raise GpuError(f"nvidia-smi reports a GPU error: {words}", build_facts(query, None, None), text)
    if rc != 0:
        raise NvidiaSmiError(f"`{' '.join([nvidia_smi, *args])}` exited with code {rc}: {text.strip()}", text)
    if not query["gpus"]:
        raise NoDevicesError("nvidia-smi --query-gpu listed no GPUs", text)
    table = parse_table(_run_checked(run, [nvidia_smi, *TABLE_ARGS]))
    topology = parse_topology(_run_checked(run, [nvidia_smi, *TOPO_ARGS]))
    return build_facts(query, topology, table)
