"""GPU check: the tensor_split planner against what llama.cpp allocates on a real GPU.

Loads the Qwen3.6-27B Q4_K_M MTP header stand-in (tests/harness/gguf/qwen36_27b_header.py: the
real qwen35 tensor table, sparse zero data, 16.8 GB) with the planner's arguments on this host's
GPU 0 and compares, per configuration, the plan's per-device MiB with llama.cpp's own buffer
sizes (from its load log) and nvidia-smi's used memory once /health is 200.
Usage: plan_vs_gpu.py LLAMA_SERVER WORKDIR OUTDIR
"""

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ansible_collections.llamafleet.mtp.plugins.module_utils import gguf_header, nvidia_smi, tensor_plan

from tests.harness.gguf.qwen36_27b_header import write_qwen36_27b_header

CONFIGS = [
    {"context": 32768, "cache_type_k": "f16", "cache_type_v": "f16", "draft_n_max": 3},
    {"context": 262144, "cache_type_k": "q4_0", "cache_type_v": "q4_0", "draft_n_max": 2},
]
BUF_RE = re.compile(r"(CUDA0|CPU|CUDA_Host)[ _](?:model|KV|RS|compute|output)?.*?buffer size\s*=\s*([0-9.]+) MiB")


def run(argv):
    p = subprocess.run(argv, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def used_mib():
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"], capture_output=True, text=True
    ).stdout
    return int(out.split()[0])


def main(server, work, out):
    work, out = Path(work), Path(out)
    model = work / "Qwen3.6-27B-Q4_K_M-mtp.gguf"
    if not model.exists():
        write_qwen36_27b_header(model)
    info = gguf_header.gguf_info(str(model))
    facts = nvidia_smi.collect(run, "nvidia-smi")
    idle = used_mib()
    results = []
    for i, cfg in enumerate(CONFIGS):
        p = tensor_plan.plan(facts, info, parallel=1, mtp=True, **cfg)
        inst = p["instances"][0]
        port = 18180 + i
        args = [
            server,
            "-m",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-webui",
            "-fit",
            "off",
            "--no-warmup",
            "--spec-type",
            "draft-mtp",
            *inst["llama_args"],
        ]
        log = out / f"plan_vs_gpu-{i}.log"
        with open(log, "w") as f:
            proc = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT)
        status, used = "timeout", None
        try:
            for _ in range(900):
                if proc.poll() is not None:
                    status = f"exited {proc.returncode}"
                    break
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                        if r.status == 200:
                            status, used = "healthy", used_mib() - idle
                            break
                except OSError:
                    pass
                time.sleep(0.2)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        bufs = {}
        for line in log.read_text(errors="replace").splitlines():
            m = BUF_RE.search(line)
            if m:
                key = line.split("buffer size")[0].split(":")[-1].strip()
                bufs[key] = bufs.get(key, 0) + float(m.group(2))
        dev = inst["per_device"][0]
        row = {
            "config": cfg,
            "llama_args": inst["llama_args"],
            "status": status,
            "plan_total_mib": dev["total_mib"],
            "plan_without_reserve_mib": dev["total_mib"] - dev["reserve_mib"],
            "plan_by_category": {k: v for k, v in dev.items() if k.endswith("_mib")},
            "nvidia_smi_used_mib": used,
            "llama_buffers_mib": bufs,
        }
        results.append(row)
        print(json.dumps({k: row[k] for k in ("config", "status", "plan_without_reserve_mib", "nvidia_smi_used_mib")}))
        print("  llama.cpp buffers:", bufs)
        if status != "healthy":
            print("  log tail:", log.read_text(errors="replace")[-1500:])
    (out / "plan_vs_gpu.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
