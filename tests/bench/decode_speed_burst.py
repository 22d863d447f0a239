#!/usr/bin/env python3
"""Benchmark (measures and prints; not a test): one burst of completions straight to each sandbox instance, then
what the fleet's Prometheus says of one request's decode speed, against the responses' own timings (tokens over
generation milliseconds, summed over the burst). Prints the collection's rule
(llamafleet:instance_request_tokens_per_second:ratio_rate5m, from llama-server's counters) and, for comparison, an
average of llama-server's predicted_tokens_seconds gauge over the same 5 minutes (the rule before issue 48).

Needs the sandbox of README command 1 (scripts/run-sandbox.sh: two hosts, the gateway host with Prometheus), its
instances idle for the 5 minutes before (the rule averages every request in its window, earlier ones included).

  .venv/bin/python tests/bench/decode_speed_burst.py [--requests 6] [--n-predict 48] [--wait 40]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

CACHE = os.environ.get("LLAMA_MTP_CACHE", "/var/cache/llama-mtp-fleet")
PREFIX = os.environ.get("SANDBOX_PREFIX", "llama-sandbox")
NEW = "llamafleet:instance_request_tokens_per_second:ratio_rate5m"
OLD = 'avg by (host, llama_instance) (avg_over_time(llamacpp:predicted_tokens_seconds{job="llama"}[5m]))'


def ip(container):
    fmt = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
    return subprocess.run(["podman", "inspect", "-f", fmt, container], capture_output=True, text=True).stdout.strip()


def burst(host, key, requests, n_predict):
    """(tokens, generation ms) summed over the burst, and each response's own tokens/s."""
    n = ms = 0.0
    each = []
    for i in range(requests):
        body = json.dumps({"prompt": f"The lighthouse keeper {i}", "n_predict": n_predict, "temperature": 0})
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        req = urllib.request.Request(f"http://{ip(host)}:8080/completion", data=body.encode(), headers=headers)
        timings = json.loads(urllib.request.urlopen(req, timeout=120).read())["timings"]
        n, ms = n + timings["predicted_n"], ms + timings["predicted_ms"]
        each.append(timings["predicted_per_second"])
    return n, ms, each


def prom(gateway_ip, query):
    url = f"http://{gateway_ip}:9090/api/v1/query?query={urllib.parse.quote(query)}"
    result = json.loads(urllib.request.urlopen(url, timeout=30).read())["data"]["result"]
    return {r["metric"].get("host"): float(r["value"][1]) for r in result}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=6, help="completions per instance")
    p.add_argument("--n-predict", type=int, default=48)
    p.add_argument("--wait", type=float, default=40.0, help="seconds for a scrape and a rule evaluation")
    args = p.parse_args()
    key = Path(f"{CACHE}/sandbox-api-key").read_text().strip()
    hosts = [f"{PREFIX}-1", f"{PREFIX}-2"]
    speed = {}
    for h in hosts:
        n, ms, each = burst(h, key, args.requests, args.n_predict)
        speed[h] = n / ms * 1000
        print(f"{h}: the responses: {n:.0f} tokens in {ms:.0f} ms = {speed[h]:.1f} tokens/s "
              f"(each {min(each):.0f}-{max(each):.0f})")  # fmt: skip
    time.sleep(args.wait)
    gateway = ip(f"{PREFIX}-gateway")
    new, old = prom(gateway, NEW), prom(gateway, OLD)
    for h in hosts:
        figures = []
        for name, got in (("the rule (counters)", new.get(h)), ("the gauge average", old.get(h))):
            figures.append(f"{name} {got:.1f} ({got / speed[h]:.3f}x)" if got is not None else f"{name}: no sample")
        print(f"{h}, {args.wait:.0f} s later: " + "; ".join(figures))


if __name__ == "__main__":
    main()
