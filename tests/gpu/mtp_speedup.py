"""GPU check: MTP speed-up on a real GPU with generated models (agree: acceptance 1.0; partial).

For each model: llama-server fully offloaded (-ngl 99), without MTP and with --spec-type draft-mtp
--spec-draft-n-max 1..4; the same prompt, n_predict 256, 3 counted runs each; the numbers go
through llamafleet.mtp's llama_bench logic (median tok/s, acceptance from /metrics, speed-up).
Usage: mtp_speedup.py LLAMA_SERVER WORKDIR OUTDIR
"""

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ansible_collections.llamafleet.mtp.plugins.module_utils import llama_bench as lb
from ansible_collections.llamafleet.mtp.plugins.module_utils.metrics_text import parse_metrics

from tests.harness.gguf import make_models as mm

PROMPT = "Hello world"


def post(port, path, body):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return parse_metrics(r.read().decode())


def measure(server, model, label, n_max, port, out):
    args = [
        server,
        "-m",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-ngl",
        "99",
        "-c",
        "4096",
        "-np",
        "1",
        "--no-webui",
        "--metrics",
        "-fa",
        "on",
    ]
    if n_max is not None:
        args += ["--spec-type", "draft-mtp", "--spec-draft-n-max", str(n_max)]
    with open(out / f"speed-{label}.log", "w") as f:
        proc = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(f"{label}: server exited {proc.returncode}") from None
            time.sleep(0.1)
        body = {"prompt": PROMPT, "n_predict": 256, "temperature": 0, "top_k": 1, "cache_prompt": False}
        post(port, "/completion", body)  # warm-up
        before = metrics(port)
        samples = [lb.completion_sample(post(port, "/completion", body)) for _ in range(3)]
        return lb.summarize(label, n_max, samples, lb.metrics_delta(before, metrics(port)))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main(server, work, out):
    work, out = Path(work), Path(out)
    report = {}
    for kind, extra in (("agree", {}), ("partial", {"agree_fraction": 0.7})):
        mf = mm.build_model(kind, work, name=f"gpu-{kind}", n_embd=2048, n_layer=12, dtype="F16", **extra)
        rows = [measure(server, mf.paths[0], "no-mtp", None, 18280, out)]
        for n in (1, 2, 3, 4):
            rows.append(measure(server, mf.paths[0], f"mtp-n{n}", n, 18281 + n, out))
        res = lb.compare(rows)
        res["model"] = {"kind": kind, "size_bytes": mf.size_bytes, "n_embd": 2048, "n_layer": 12, "dtype": "F16"}
        report[kind] = res
        print(f"== {kind} model ({mf.size_bytes / 1e9:.2f} GB)")
        print("\n".join(lb.table(res)))
    (out / "mtp_speedup.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
