#!/usr/bin/env python3
"""Benchmark (measures and prints; not a test): two llama-server configurations side by side, requests
alternating A, B, A, B, ..., so that both see the same background load; the ratio B/A per pair and
its median. For hosts whose other load moves more than the difference measured (a shared machine).

  python3 tests/bench/ab_pairs.py --server BIN --model GGUF --a "" --b "--spec-type draft-mtp --spec-draft-n-max 4" \
      [--pairs 5] [--n-predict 32]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time
import urllib.request

from ansible_collections.llamafleet.mtp.plugins.module_utils import llama_bench as lb

from tests.bench.mtp_at_scale import post


def start(server, model, port, extra, log):
    args = [server, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-c", "2048", "-np", "1", "--no-webui"]
    with open(log, "w") as f:
        proc = subprocess.Popen(args + shlex.split(extra), stdout=f, stderr=subprocess.STDOUT)
    deadline = time.time() + 900
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return proc
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"server {extra!r} did not come up, see {log}") from None
        time.sleep(0.5)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--a", default="", help="extra llama-server arguments of A")
    p.add_argument("--b", required=True, help="extra llama-server arguments of B")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--n-predict", type=int, default=32)
    p.add_argument("--port", type=int, default=18420)
    p.add_argument("--logs", default="/tmp")
    a = p.parse_args(argv)
    procs = []
    try:
        for i, extra in enumerate((a.a, a.b)):
            procs.append(start(a.server, a.model, a.port + i, extra, f"{a.logs}/ab-{i}.log"))
        body = {"prompt": "Hello world", "n_predict": a.n_predict, "temperature": 0, "top_k": 1, "cache_prompt": False}
        for i in range(2):
            post(a.port + i, "/completion", dict(body, n_predict=8))  # warm-up
        tok = {0: [], 1: []}
        acc = []
        for _ in range(a.pairs):
            for i in range(2):
                s = lb.completion_sample(post(a.port + i, "/completion", body))
                tok[i].append(s["tok_s"])
                if i == 1 and s["draft_n"]:
                    acc.append(s["draft_accepted"] / s["draft_n"])
            print(
                f"pair: A {tok[0][-1]:.2f}  B {tok[1][-1]:.2f} tok/s  B/A {tok[1][-1] / tok[0][-1]:.2f}  "
                f"load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
        ratios = [b / x for x, b in zip(tok[0], tok[1], strict=True)]
        print(f"A [{a.a}]: median {statistics.median(tok[0]):.2f} tok/s ({min(tok[0]):.2f}-{max(tok[0]):.2f})")
        print(
            f"B [{a.b}]: median {statistics.median(tok[1]):.2f} tok/s ({min(tok[1]):.2f}-{max(tok[1]):.2f})"
            + (f", acceptance {statistics.mean(acc):.2f}" if acc else "")
        )
        print(f"B/A per pair: median {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
