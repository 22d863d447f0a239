#!/usr/bin/env python3
"""Latency the gateway (role llama_gateway) adds, measured side by side in one run on the sandbox fleet.

Interleaves N short completions (the real openai client, max_tokens 1, temperature 0) sent directly to
the instances (alternating over the hosts, as the gateway's leastconn does) and through the gateway, and
N GET /health both ways (no model work: the proxy's own cost). Prints p50/p90 per path and the p50
difference. A measurement, not a test: it asserts nothing.

  SANDBOX_PREFIX=llama-sandbox python scripts/gateway_latency.py [N]
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))
from gateway_clients import base_url, chat, client, container_ip  # noqa: E402


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    prefix = os.environ.get("SANDBOX_PREFIX", "llama-sandbox")
    hosts = [f"{prefix}-1", f"{prefix}-2"]
    gw = client(base_url(f"{prefix}-gateway"))
    direct = [client(f"http://{container_ip(h)}:8080/v1") for h in hosts]
    health = {
        "gateway": f"http://{container_ip(prefix + '-gateway')}:8000/health",
        "direct": [f"http://{container_ip(h)}:8080/health" for h in hosts],
    }
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    times = {"completion gateway": [], "completion direct": [], "health gateway": [], "health direct": []}
    for c in [gw, *direct]:  # warm up connections and the prompt cache
        for _ in range(3):
            chat(c, max_tokens=1)
    for i in range(n):
        order = [("gateway", gw), ("direct", direct[i % len(direct)])]
        if i % 2:
            order.reverse()
        for label, c in order:
            t = time.perf_counter()
            ok = chat(c, max_tokens=1)
            times[f"completion {label}"].append((time.perf_counter() - t) * 1000)
            assert ok, label
            url = health["gateway"] if label == "gateway" else health["direct"][i % len(direct)]
            t = time.perf_counter()
            opener.open(url, timeout=10).read()
            times[f"health {label}"].append((time.perf_counter() - t) * 1000)
    print(f"{n} requests per path, interleaved (controller -> podman bridge)")
    for k, xs in times.items():
        print(f"  {k:20s} p50 {statistics.median(xs):7.2f} ms   p90 {pct(xs, 90):7.2f} ms")
    for what in ("completion", "health"):
        d = statistics.median(times[f"{what} gateway"]) - statistics.median(times[f"{what} direct"])
        print(f"p50 added by the gateway ({what}): {d:+.2f} ms")


if __name__ == "__main__":
    main()
