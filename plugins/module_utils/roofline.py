"""Decode speed against the memory-bandwidth limit (the roofline), and the host's memory bandwidth.

A single-sequence decode step reads every weight it uses once (gguf_info's ``decode_bytes``), so
tokens/s x bytes per token <= memory bandwidth. This file holds:

* ``GPU_BANDWIDTH_SPEC``: vendor peak memory bandwidth per GPU model (docs/measurements.md cites the
  data sheets), looked up by the name gpu_facts reports (``nvidia-smi --query-gpu=name``);
* ``measure_cpu_bandwidth``: a short copy and read measurement on the host's CPUs (standard library only,
  runs inside the ``mem_bandwidth`` module on the managed host, Python 3.8+);
* ``roofline``: the efficiency of one benchmark row, MTP rows included.

Bandwidth is reported in bytes/s. The CPU measurement gives ``copy`` in the STREAM convention
(bytes read + bytes written per second, one ``memmove`` of a buffer far larger than the caches) and
``read`` (bytes scanned per second by ``memchr`` over such a buffer). Decode reads weights and writes
almost nothing, so the efficiency uses ``read`` where measured (the same quantity a GPU data sheet
quotes); ``copy`` is kept beside it for comparison with STREAM figures.
"""

from __future__ import annotations

import os
import re
import time

from ansible_collections.llamafleet.mtp.plugins.module_utils.cpu_cores import parse_cpu_list

# GB/s (10^9 bytes/s), vendor data-sheet peak; key: a regular expression over the nvidia-smi name
# (first match wins, so the more specific names come first).
GPU_BANDWIDTH_SPEC = (
    (r"H200", 4800),
    (r"H100.*(SXM|HBM3)", 3350),
    (r"H100.*NVL", 3900),
    (r"H100", 2000),  # H100 PCIe (HBM2e)
    (r"GH200", 4000),
    (r"B200", 8000),
    (r"A100.*80GB.*(SXM|HBM2e)|A100-SXM4-80GB", 2039),
    (r"A100.*80GB", 1935),  # A100 80GB PCIe
    (r"A100", 1555),  # A100 40GB
    (r"A800.*80GB", 2039),
    (r"A40\b", 696),
    (r"A30\b", 933),
    (r"A10\b", 600),
    (r"L40S", 864),
    (r"L40\b", 864),
    (r"L4\b", 300),
    (r"V100.*32GB|V100S", 900),
    (r"V100", 900),
    (r"T4\b", 320),
    (r"RTX 6000 Ada|RTX 6000 Ada Generation", 960),
    (r"RTX A6000", 768),
    (r"RTX 5090", 1792),
    (r"RTX 4090", 1008),
    (r"RTX 4080", 717),
    (r"RTX 3090 Ti", 1008),
    (r"RTX 3090", 936),
    (r"RTX 3080 Ti", 912),
    (r"RTX 3080", 760),
)
_GPU_SPEC_RE = [(re.compile(p, re.IGNORECASE), gbs) for p, gbs in GPU_BANDWIDTH_SPEC]


class RooflineError(ValueError):
    """Inputs the roofline cannot use."""


def gpu_bandwidth_spec(name: str) -> int | None:
    """Peak memory bandwidth (bytes/s) of a GPU model by its nvidia-smi name; None when not in the table."""
    for rx, gbs in _GPU_SPEC_RE:
        if rx.search(name or ""):
            return gbs * 10**9
    return None


def gpus_bandwidth(gpus: list, devices: list | None = None) -> dict:
    """Bandwidth of the GPUs an instance decodes on (gpu_facts ``gpus`` entries, ``devices`` indices).

    With layer split a token's step runs through the GPUs one after the other, each reading its own
    layers, so the step time is the sum of bytes_i / bw_i: for equal GPUs that is the bandwidth of one.
    The slowest GPU of the set is reported (exact for equal GPUs, a lower bound otherwise).
    """
    chosen = [g for g in gpus if devices is None or g.get("index") in devices]
    if not chosen:
        raise RooflineError(f"no GPU among {devices} in gpu_facts")
    figures = [(gpu_bandwidth_spec(g.get("name", "")), g.get("name")) for g in chosen]
    unknown = sorted({n for bw, n in figures if bw is None})
    if unknown:
        return {"bytes_per_s": None, "source": None, "unknown": unknown}
    bw, name = min(figures, key=lambda x: x[0])
    return {"bytes_per_s": bw, "source": f"spec ({name})", "unknown": []}


# ---------------------------------------------------------------------------------------------------------
# CPU measurement (runs on the managed host)
# ---------------------------------------------------------------------------------------------------------


def node_cpus(node: int | None, sysfs: str = "/sys/devices/system/node") -> list:
    """CPUs of NUMA node ``node`` that this process may run on (all allowed CPUs for None)."""
    allowed = sorted(os.sched_getaffinity(0))
    if node is None:
        return allowed
    path = os.path.join(sysfs, f"node{node}", "cpulist")
    try:
        with open(path) as f:
            cpus = parse_cpu_list(f.read())
    except OSError as e:
        raise RooflineError(f"NUMA node {node}: cannot read {path}: {e.strerror}") from None
    cpus = [c for c in cpus if c in allowed]
    if not cpus:
        raise RooflineError(f"NUMA node {node} has no CPU this process may run on")
    return cpus


def physical_cores(cpus: list, sysfs: str = "/sys/devices/system/cpu") -> int:
    """Distinct physical cores among ``cpus`` (SMT siblings counted once), from the topology files."""
    cores = set()
    for c in cpus:
        base = os.path.join(sysfs, f"cpu{c}", "topology")
        try:
            with open(os.path.join(base, "physical_package_id")) as f:
                pkg = f.read().strip()
            with open(os.path.join(base, "core_id")) as f:
                core = f.read().strip()
        except OSError:
            return len(cpus)
        cores.add((pkg, core))
    return len(cores) or len(cpus)


def last_level_cache_bytes(sysfs: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """Size of CPU 0's largest cache (bytes), 0 when the kernel does not say."""
    best = 0
    try:
        names = os.listdir(sysfs)
    except OSError:
        return 0
    for name in names:
        try:
            with open(os.path.join(sysfs, name, "size")) as f:
                text = f.read().strip().upper()
        except OSError:
            continue
        m = re.match(r"^(\d+)([KMG]?)", text)
        if m:
            best = max(best, int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)])
    return best


def buffer_mib(n_cpus: int, llc_bytes: int) -> int:
    """Per-process buffer: together at least 4x the last-level cache (so memory, not cache, is measured),
    at least 128 MiB and at most 1 GiB each."""
    need = -(-4 * llc_bytes // max(n_cpus, 1)) // 2**20
    return int(min(max(need, 128), 1024))


def _worker(cpu, size, iters, barrier, conn):  # pragma: no cover - runs in a child process
    try:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        src = bytearray(b"\x01") * size  # written: real pages, not the shared zero page
        dst = bytearray(b"\x00") * size
        msrc, mdst = memoryview(src), memoryview(dst)
        mdst[:] = msrc  # warm: page tables, TLB
        out = {}
        for kind in ("copy", "read"):
            barrier.wait()
            t0 = time.perf_counter()
            for _dummy in range(iters):
                if kind == "copy":
                    mdst[:] = msrc  # memmove
                elif src.find(b"\x02") != -1:  # memchr over the whole buffer
                    raise RuntimeError("unexpected byte")
            out[kind] = (t0, time.perf_counter())
        conn.send(out)
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        conn.send({"error": repr(e)})
    finally:
        conn.close()


def measure_cpu_bandwidth(cpus: list, size_mib: int = 128, iters: int = 3, rounds: int = 3) -> dict:
    """Copy and read bandwidth of the memory behind ``cpus``: one process pinned per CPU, all at once.

    Each process copies its own ``size_mib`` buffer into another (``copy``: read + written bytes
    counted, STREAM style) and scans it with memchr (``read``) ``iters`` times between barriers; the
    aggregate is all processes' bytes over the wall time from the first start to the last end. Best
    of ``rounds`` (as STREAM reports), and the spread over the rounds.
    """
    import multiprocessing

    if not cpus:
        raise RooflineError("no CPUs to measure on")
    ctx = multiprocessing.get_context("fork")
    size = size_mib * 2**20
    results = {"copy": [], "read": []}
    for _dummy in range(rounds):
        barrier = ctx.Barrier(len(cpus))
        procs, pipes = [], []
        for c in cpus:
            parent, child = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker, args=(c, size, iters, barrier, child))
            p.start()
            child.close()
            procs.append(p)
            pipes.append(parent)
        outs = [pp.recv() for pp in pipes]
        for p in procs:
            p.join()
        errors = [o["error"] for o in outs if "error" in o]
        if errors:
            raise RooflineError(f"bandwidth worker failed: {errors[0]}")
        for kind, factor in (("copy", 2), ("read", 1)):
            start = min(o[kind][0] for o in outs)
            end = max(o[kind][1] for o in outs)
            results[kind].append(factor * size * iters * len(cpus) / (end - start))
    return {
        "copy_bytes_per_s": int(max(results["copy"])),
        "read_bytes_per_s": int(max(results["read"])),
        "copy_spread": [int(min(results["copy"])), int(max(results["copy"]))],
        "read_spread": [int(min(results["read"])), int(max(results["read"]))],
        "cpus": list(cpus),
        "buffer_mib": size_mib,
    }


# ---------------------------------------------------------------------------------------------------------
# efficiency of a benchmark row
# ---------------------------------------------------------------------------------------------------------


def bytes_per_token(row: dict, decode_bytes: dict) -> float:
    """Weight bytes read per generated token in a bench row.

    Without MTP: decode_bytes['token']. With MTP each verify cycle reads the trunk once and emits one
    token plus the accepted drafts, and each drafted token cost one MTP head step:
    cycles = tokens - accepted, bytes = cycles * token + drafted * mtp_draft.
    """
    token = decode_bytes["token"]
    tokens = row.get("tokens") or 0
    drafted = row.get("draft_tokens") or 0
    accepted = row.get("draft_accepted") or 0
    if not row.get("mtp") or tokens <= 0 or drafted <= 0:
        return float(token)
    cycles = max(tokens - accepted, 1)
    return (cycles * token + drafted * decode_bytes.get("mtp_draft", 0)) / tokens


def roofline(row: dict, decode_bytes: dict, bandwidth: int | None) -> dict:
    """The roofline columns of one row: bytes per token and per step, the limit, the efficiency (%).

    ``efficiency_pct`` = tokens/s x weight bytes read per token / bandwidth: the share of the memory
    bandwidth the decode turns into weight reads (KV cache reads and activations are not counted).
    ``roofline_tok_s`` is bandwidth / decode_bytes['token'], the most a plain decode can reach; an
    MTP row may beat it (that is the point of MTP) while its own efficiency stays <= 100 %.
    """
    if not decode_bytes or not decode_bytes.get("token"):
        raise RooflineError("decode_bytes.token missing: read the model with gguf_info first")
    bpt = bytes_per_token(row, decode_bytes)
    out = {
        "step_bytes": decode_bytes["token"] + (decode_bytes.get("mtp_draft", 0) if row.get("mtp") else 0),
        "bytes_per_token": int(bpt),
        "bandwidth_bytes_per_s": bandwidth,
        "roofline_tok_s": None,
        "efficiency_pct": None,
    }
    if bandwidth:
        out["roofline_tok_s"] = round(bandwidth / decode_bytes["token"], 2)
        out["efficiency_pct"] = round(100.0 * row["tok_s_median"] * bpt / bandwidth, 1)
    return out


def add_roofline(result: dict, decode_bytes: dict, bandwidth: int | None, bandwidth_source: str | None) -> dict:
    """llama_bench.compare()'s result with the roofline columns on every row."""
    out = dict(result)
    out["rows"] = [dict(r, **roofline(r, decode_bytes, bandwidth)) for r in result["rows"]]
    out["decode_bytes"] = dict(decode_bytes)
    out["bandwidth_bytes_per_s"] = bandwidth
    out["bandwidth_source"] = bandwidth_source
    base = [r for r in out["rows"] if not r["mtp"]]
    out["efficiency_pct"] = base[0]["efficiency_pct"] if base else None
    return out
