#!/usr/bin/env python3
"""Benchmark (measures and prints; not a test): MTP at model scale against the memory-bandwidth roofline.

For each generated model (agree: the MTP head always agrees; partial: it agrees on ~70 % of the text
tokens) a real llama-server runs without MTP and with --spec-type draft-mtp --spec-draft-n-max 1..4,
the same prompt, greedy; the rows go through llamafleet.mtp's own logic: llama_bench (median tok/s,
acceptance, speed-up, the draft length autotune keeps) and roofline (bytes per token from the GGUF
header, efficiency against the bandwidth). --sweep also measures the flags bench.yml --tags sweep
measures (CPU: threads x threads-batch; GPU: flash attention, ubatch) against the default.

  python3 tests/bench/mtp_at_scale.py --server BIN --models DIR [--gen n_embd,n_layer,n_vocab] \
      [--ngl 99 --bandwidth-gbs 4800] [--threads N] [--sweep] [--out OUT.json]

Models are generated into --models (not the repository) with tests/harness/gguf/make_models.py when
missing (F16). Without --bandwidth-gbs the CPU bandwidth is measured (roofline.measure_cpu_bandwidth).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ansible_collections.llamafleet.mtp.plugins.module_utils import llama_bench as lb
from ansible_collections.llamafleet.mtp.plugins.module_utils import roofline as rl
from ansible_collections.llamafleet.mtp.plugins.module_utils.gguf_header import gguf_info
from ansible_collections.llamafleet.mtp.plugins.module_utils.metrics_text import parse_metrics

from tests.harness.gguf import make_models as mm

PROMPT = "Hello world"


def post(port, path, body, timeout=1800):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        return parse_metrics(r.read().decode())


FLAGS = {
    "threads": "--threads",
    "threads_batch": "--threads-batch",
    "flash_attn": "--flash-attn",
    "ubatch_size": "--ubatch-size",
    "batch_size": "--batch-size",
    "split_mode": "--split-mode",
}


def serve_and_measure(a, model, label, n_max, port, settings=None):
    """llama-server with these instance settings (bench sweep fields), one warm-up, a.runs counted requests."""
    settings = dict(settings or {})
    args = [a.server, "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "2048", "-np", "1"]
    args += ["--no-webui", "--metrics", "-ngl", str(a.ngl)]
    if a.ngl and "flash_attn" not in settings:
        settings["flash_attn"] = "on"
    if a.threads and "threads" not in settings:
        settings["threads"] = a.threads
    for key, value in settings.items():
        args += [FLAGS[key], str(value)]
    if n_max is not None:
        args += ["--spec-type", "draft-mtp", "--spec-draft-n-max", str(n_max)]
    log = Path(a.logs) / f"{Path(model).stem}-{label.replace('/', '-')}.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 900
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(f"{label}: server exited {proc.returncode}, see {log}") from None
                if time.time() > deadline:
                    raise RuntimeError(f"{label}: not healthy after 900 s, see {log}") from None
            time.sleep(0.5)
        body = {"prompt": PROMPT, "n_predict": a.n_predict, "temperature": 0, "top_k": 1, "cache_prompt": False}
        post(port, "/completion", dict(body, n_predict=8))  # warm-up
        load0 = os.getloadavg()[0]
        before = metrics(port)
        samples = [lb.completion_sample(post(port, "/completion", body)) for _ in range(a.runs)]
        row = lb.summarize(label, n_max, samples, lb.metrics_delta(before, metrics(port)))
        row["loadavg"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
        row["settings"] = settings
        return row
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def ensure_model(a, kind):
    """The generated model of this kind (written when missing): --gen n_embd,n_layer,n_vocab[,n_ff,n_head,n_head_kv]."""
    keys = ("n_embd", "n_layer", "n_vocab", "n_ff", "n_head", "n_head_kv")
    shape = dict(zip(keys, (int(x) for x in a.gen.split(",")), strict=False))
    name = f"scale-{kind}-" + "-".join(str(v) for v in shape.values())
    path = Path(a.models) / f"{name}.gguf"
    if not path.is_file():
        extra = {"agree_fraction": 0.7} if kind == "partial" else {}
        t0 = time.time()
        mm.build_model(kind, a.models, name=name, dtype="F16", **shape, **extra)
        print(f"   generated {path} in {time.time() - t0:.0f} s", flush=True)
    return path


def fmt_bw(b):
    return "-" if not b else f"{b / 1e9:.1f} GB/s"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", required=True)
    p.add_argument("--models", required=True, help="directory of the generated models (created, not in the repo)")
    p.add_argument(
        "--gen", default="2048,28,32000", help="n_embd,n_layer,n_vocab[,n_ff,n_head,n_head_kv] of the models"
    )
    p.add_argument("--kinds", default="agree,partial")
    p.add_argument("--ngl", type=int, default=0, help="GPU layers (0: CPU)")
    p.add_argument("--bandwidth-gbs", type=float, help="bandwidth figure (GB/s) instead of a CPU measurement")
    p.add_argument("--threads", type=int, help="--threads for the MTP rows (default: llama.cpp's)")
    p.add_argument(
        "--sweep",
        action="store_true",
        help="also sweep the flags (llama_bench.sweep_configs) at no-MTP and the best draft length",
    )
    p.add_argument("--gpus", type=int, default=1, help="GPUs the server uses (sweep: split modes when > 1)")
    p.add_argument("--draft", default="1,2,3,4")
    p.add_argument("--n-predict", type=int, default=48)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--port", type=int, default=18390)
    p.add_argument("--logs", default="/tmp")
    p.add_argument("--out")
    a = p.parse_args(argv)
    Path(a.models).mkdir(parents=True, exist_ok=True)

    if a.bandwidth_gbs:
        bw, src, cpu = int(a.bandwidth_gbs * 1e9), f"given {a.bandwidth_gbs} GB/s", None
    else:
        cpus = rl.node_cpus(None)
        cpu = rl.measure_cpu_bandwidth(cpus, size_mib=rl.buffer_mib(len(cpus), rl.last_level_cache_bytes()))
        bw, src = cpu["read_bytes_per_s"], f"measured read, CPUs {cpus}"
        print(
            f"CPU bandwidth: read {fmt_bw(cpu['read_bytes_per_s'])} (spread {[fmt_bw(x) for x in cpu['read_spread']]}),"
            f" copy {fmt_bw(cpu['copy_bytes_per_s'])}",
            flush=True,
        )
    report = {"bandwidth_bytes_per_s": bw, "bandwidth_source": src, "cpu": cpu, "models": {}}
    for kind in a.kinds.split(","):
        path = ensure_model(a, kind)
        info = gguf_info(path)
        db = info["decode_bytes"]
        print(
            f"== {kind}: {path} ({info['size_bytes'] / 1e9:.2f} GB), decode step {db['token'] / 1e9:.3f} GB, "
            f"MTP draft step {db['mtp_draft'] / 1e9:.3f} GB, roofline {bw / db['token']:.2f} tok/s",
            flush=True,
        )
        rows = []
        for i, n in enumerate([None] + [int(x) for x in a.draft.split(",")]):
            label = "no-mtp" if n is None else f"mtp-n{n}"
            rows.append(serve_and_measure(a, path, label, n, a.port + i))
            r = rows[-1]
            print(
                f"   {label}: {r['tok_s_median']} tok/s ({r['tok_s_min']}-{r['tok_s_max']}), acceptance "
                f"{r['acceptance']}, load {r['loadavg']}",
                flush=True,
            )
        res = rl.add_roofline(lb.compare(rows), db, bw, src)
        res["autotune_draft_n_max"] = res["best_draft_n_max"]
        sweep = []
        if a.sweep:
            kind_hw = "gpu" if a.ngl else "cpu"
            cpus = rl.node_cpus(None)
            configs = lb.sweep_configs(kind_hw, rl.physical_cores(cpus), len(cpus), a.gpus)
            for n in (None, res["best_draft_n_max"]) if res["best_draft_n_max"] else (None,):
                mode = "no-mtp" if n is None else f"mtp-n{n}"
                rows_n = []
                for c in configs:
                    r = serve_and_measure(a, path, f"{c['label']}/{mode}", n, a.port + 10, c["settings"])
                    r["label"] = c["label"]
                    rows_n.append(r)
                    print(
                        f"   sweep {c['label']}/{mode}: {r['tok_s_median']} tok/s ({r['tok_s_min']}-{r['tok_s_max']}), "
                        f"load {r['loadavg']}",
                        flush=True,
                    )
                gap = lb.sweep_gap(rows_n, "default", configs)
                gap["mode"] = mode
                sweep.append(gap)
                print(
                    f"   sweep {mode}: default {gap['default']['tok_s']} tok/s, best {gap['best']['label']} "
                    f"{gap['best']['tok_s']} tok/s, gap {gap['gap_pct']} %",
                    flush=True,
                )
        res["sweep"] = sweep
        res["model"] = {"kind": kind, "path": str(path), "size_bytes": info["size_bytes"], "gen": a.gen, "dtype": "F16"}
        report["models"][kind] = res
        print("\n".join(lb.table(res)))
        for r in res["rows"]:
            print(
                f"   {r['label']:<10} bytes/token {r['bytes_per_token'] / 1e9:.3f} GB  "
                f"efficiency {r['efficiency_pct']} %"
            )
        print(f"autotune keeps draft-n-max {res['best_draft_n_max']} (speed-up {res['best_speedup']}x)", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
