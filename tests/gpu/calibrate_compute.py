#!/usr/bin/env python3
"""Calibrate the tensor_split planner's compute-buffer estimate on llama.cpp's own numbers.

Runs a real llama-server on the Qwen3.6-27B Q4_K_M MTP header stand-in
(tests/harness/gguf/qwen36_27b_header.py: the real qwen35 tensor table, sparse zero data) at
several points (context, KV cache type, MTP draft-n-max, parallel slots), reads llama.cpp's own
load-log lines for each context it creates (the target context first, then the MTP draft context):

    llama_context: n_ctx = ...                      (starts a context)
    llama_kv_cache: <buf> KV buffer size = X MiB
    llama_memory_recurrent: <buf> RS buffer size = X MiB
    llama_context: <buf> compute buffer size = X MiB    (<buf>: CPU, CUDA0, CUDA1, CUDA_Host, ...)

and sets them against the planner's terms for the same settings
(plugins/module_utils/tensor_plan.estimate_compute_terms). On a CUDA host it also reads each GPU's
used memory (nvidia-smi) once /health answers, to measure the CUDA context per process.

    calibrate_compute.py LLAMA_SERVER WORKDIR OUTDIR [--backend cpu|cuda] [--threads N]
                         [--points all|cpu-small|NAME,NAME] [--gpus N]

--backend cpu   -ngl 0 (a CPU build, or a CUDA build with nothing offloaded): the backend-independent
                part of the graph (activations, the KQ mask once, logits) - what this repository
                could measure without a GPU (docs/measurements.md).
--backend cuda  everything offloaded (-ngl 99); one GPU (-sm none) for the single-GPU points and
                --gpus 2 adds layer-split points over GPUs 0,1 (pipeline parallelism: the scheduler's
                4 copies of each split input, ggml/src/ggml-backend.cpp:1379-1387, 1563-1590).

Writes OUTDIR/calibration.json (one record per point: settings, the parsed buffers per context,
the planner's terms, nvidia-smi used memory on CUDA) and OUTDIR/calibration.md (the table for
docs/measurements.md). Each server is stopped as soon as both contexts have logged their compute
buffers (or /health answers), so a point costs the load time only (--no-warmup: nothing is run).
Exit status 0 when every point produced its numbers, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "collections"), str(REPO)]

from ansible_collections.llamafleet.mtp.plugins.module_utils import gguf_header, tensor_plan  # noqa: E402

from tests.harness.gguf.qwen36_27b_header import write_qwen36_27b_header  # noqa: E402

MIB = 1024 * 1024
# name, context, cache type (K = V), draft-n-max, parallel, gpus (cuda only)
POINTS = [
    ("c32k-f16-d2-np1", 32768, "f16", 2, 1, 1),
    ("c32k-q8-d3-np1", 32768, "q8_0", 3, 1, 1),
    ("c32k-q4-d4-np2", 32768, "q4_0", 4, 2, 1),
    ("c64k-f16-d3-np1", 65536, "f16", 3, 1, 1),
    ("c128k-q4-d2-np1", 131072, "q4_0", 2, 1, 1),
    ("c128k-q8-d2-np2", 131072, "q8_0", 2, 2, 1),
    ("c256k-q4-d2-np1", 262144, "q4_0", 2, 1, 1),
    ("c256k-f16-d2-np1", 262144, "f16", 2, 1, 1),
    ("c256k-q8-d3-np2", 262144, "q8_0", 3, 2, 1),
    # layer split over two GPUs (cuda with --gpus 2): the pipeline copies
    ("c32k-f16-d2-np1-2gpu", 32768, "f16", 2, 1, 2),
    ("c128k-q8-d2-np1-2gpu", 131072, "q8_0", 2, 1, 2),
    ("c256k-q4-d2-np1-2gpu", 262144, "q4_0", 2, 1, 2),
]
# What a 2-core, 24 GB machine without a GPU can afford (KV and state live in host RAM there).
CPU_SMALL = ["c32k-f16-d2-np1", "c32k-q8-d3-np1", "c32k-q4-d4-np2", "c64k-f16-d3-np1", "c128k-q4-d2-np1",
             "c128k-q8-d2-np2", "c256k-q4-d2-np1"]  # fmt: skip

CTX_RE = re.compile(r"llama_context:\s+n_ctx\s+=\s+(\d+)")
BUF_RE = re.compile(r"(\S+)\s+(compute|KV|RS|output) buffer size\s*=\s*([0-9.]+) MiB")


def parse_log(text: str) -> list[dict]:
    """Per llama_context in log order: n_ctx and {"compute": {buf: MiB}, "KV": {...}, "RS": {...}, "output": ...}.

    A buffer line belongs to the context whose ``n_ctx`` line came last before it; when a buffer's size
    is printed again (the graph reserved again), the last value counts.
    """
    contexts: list[dict] = []
    for line in text.splitlines():
        m = CTX_RE.search(line)
        if m:
            contexts.append({"n_ctx": int(m.group(1)), "compute": {}, "KV": {}, "RS": {}, "output": {}})
            continue
        b = BUF_RE.search(line)
        if b and contexts:
            # a context may reserve its graph more than once (sched_reserve): the last size is the buffer's
            contexts[-1][b.group(2)][b.group(1)] = float(b.group(3))
    return contexts


def nvidia_smi_used() -> list[int]:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return [int(x) for x in out.split()]


def planner_terms(info: dict, ctx: int, ctype: str, draft: int, np_: int, backend: str, gpus: int) -> dict:
    """The planner's compute terms (MiB) for this point: per device of a layer split, or one device."""
    model = tensor_plan.ModelSpec(info)
    s = tensor_plan.Settings(model, ctx, cache_type_k=ctype, cache_type_v=ctype, parallel=np_, mtp=True,
                             draft_n_max=draft)  # fmt: skip
    if gpus == 1:
        devices = [{"has_kv": True, "has_output": True, "has_mtp": True, "receives_hidden": False, "pipeline": False}]
    else:
        devices = [
            {"has_kv": True, "has_output": False, "has_mtp": False, "receives_hidden": False, "pipeline": True},
            {"has_kv": True, "has_output": True, "has_mtp": True, "receives_hidden": True, "pipeline": True},
        ]
    out = []
    for flags in devices:
        terms = tensor_plan.estimate_compute_terms(model, s, backend=backend, **flags)
        out.append({k: round(v / MIB, 2) for k, v in terms.items()})
    return {"devices": out}


def run_point(server, model_path, point, backend, threads, outdir, port) -> dict:
    name, ctx, ctype, draft, np_, gpus = point
    args = [server, "-m", str(model_path), "--host", "127.0.0.1", "--port", str(port), "--no-webui",
            "-c", str(ctx), "-np", str(np_), "-ctk", ctype, "-ctv", ctype, "--spec-type", "draft-mtp",
            "--spec-draft-n-max", str(draft), "-fit", "off", "--no-warmup", "-lv", "4",
            "--threads", str(threads)]  # fmt: skip
    if backend == "cpu":
        args += ["-ngl", "0", "--no-repack"]
    elif gpus == 1:
        args += ["-ngl", "99", "-sm", "none", "-mg", "0"]
    else:
        args += ["-ngl", "99", "-sm", "layer", "-ts", "1,1"]
    env = None
    if backend == "cuda":
        import os

        env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=",".join(map(str, range(gpus))))
    log = outdir / f"{name}.log"
    idle = nvidia_smi_used() if backend == "cuda" else None
    status, used = "timeout", None
    with open(log, "w") as fh:
        proc = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, env=env)
        try:
            for _ in range(3000):
                if proc.poll() is not None:
                    status = f"exited {proc.returncode}"
                    break
                contexts = parse_log(log.read_text(errors="replace"))
                if len(contexts) >= 2 and contexts[1]["compute"]:
                    status = "loaded"
                    break
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                        if r.status == 200:
                            status = "healthy"
                            break
                except OSError:
                    pass
                time.sleep(0.2)
            if backend == "cuda" and status in ("loaded", "healthy"):
                time.sleep(1.0)
                used = [u - i for u, i in zip(nvidia_smi_used(), idle, strict=False)]
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    contexts = parse_log(log.read_text(errors="replace"))
    return {
        "point": name,
        "settings": {"context": ctx, "cache_type": ctype, "draft_n_max": draft, "parallel": np_, "gpus": gpus},
        "backend": backend,
        "status": status,
        "contexts": contexts,
        "nvidia_smi_used_mib": used,
        "args": args[1:],
    }


def table(records: list[dict]) -> str:
    rows = [
        "| point | target compute (measured / planned) | MTP compute (measured / planned) | KV | RS | MTP KV |",
        "|---|---|---|---|---|---|",
    ]
    for r in records:
        c = r["contexts"]
        if len(c) < 2:
            rows.append(f"| {r['point']} | {r['status']} | | | | |")
            continue
        dev = r["planner"]["devices"][-1]
        planned_t = sum(v for k, v in dev.items() if not k.startswith("mtp_"))
        planned_m = sum(v for k, v in dev.items() if k.startswith("mtp_"))
        meas_t = " + ".join(f"{v:.2f}" for v in c[0]["compute"].values())
        meas_m = " + ".join(f"{v:.2f}" for v in c[1]["compute"].values())
        kv = sum(c[0]["KV"].values())
        rs = sum(c[0]["RS"].values())
        mkv = sum(c[1]["KV"].values())
        rows.append(
            f"| {r['point']} | {meas_t} / {planned_t:.0f} | {meas_m} / {planned_m:.0f} "
            f"| {kv:.0f} | {rs:.2f} | {mkv:.0f} |"
        )
    return "\n".join(rows) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("server")
    ap.add_argument("workdir", type=Path)
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--backend", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--points", default="all")
    ap.add_argument("--gpus", type=int, default=1, help="cuda: GPUs to use (2 adds the layer-split points)")
    a = ap.parse_args(argv)
    a.workdir.mkdir(parents=True, exist_ok=True)
    a.outdir.mkdir(parents=True, exist_ok=True)
    model = a.workdir / "Qwen3.6-27B-Q4_K_M-mtp.gguf"
    if not model.exists():
        write_qwen36_27b_header(model)
    info = gguf_header.gguf_info(str(model))
    if a.points == "all":
        wanted = [p for p in POINTS if p[5] <= (a.gpus if a.backend == "cuda" else 1)]
    elif a.points == "cpu-small":
        wanted = [p for p in POINTS if p[0] in CPU_SMALL]
    else:
        names = a.points.split(",")
        wanted = [p for p in POINTS if p[0] in names]
    records = []
    for i, point in enumerate(wanted):
        rec = run_point(a.server, model, point, a.backend, a.threads, a.outdir, 18300 + i)
        rec["planner"] = planner_terms(info, point[1], point[2], point[3], point[4], a.backend, point[5])
        records.append(rec)
        print(json.dumps({"point": rec["point"], "status": rec["status"], "contexts": rec["contexts"],
                          "used": rec["nvidia_smi_used_mib"]}), flush=True)  # fmt: skip
        (a.outdir / "calibration.json").write_text(json.dumps(records, indent=1))
    (a.outdir / "calibration.md").write_text(table(records))
    print(table(records))
    return 0 if all(len(r["contexts"]) >= 2 and r["contexts"][1]["compute"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
