#!/usr/bin/env python3
"""Two llama-server instances busy at once: on separate cores, on one host's shared cores as the plan divides
them, and on shared cores as llama.cpp runs by itself (every instance takes every core). A measurement on the
sandbox fleet, not a test: it prints a table and asserts nothing.

Each configuration is deployed by site.yml on a copy of inventories/sandbox (the README's way), then one
closed-loop client per instance (scripts/fleet_load.py's clients, directly, not through the gateway) runs for
--seconds on both instances at the same time; the figure is their combined completion tokens/s.
  separate   one instance on each of two hosts, each host pinned to its own core (podman update --cpuset-cpus):
             the plan sees a confined host and gives its instance --threads 1
  planned    two instances on one host that sees both cores: the plan gives each its own core
             (CPUAffinity=, --threads 1)
  oversub    the same two with allow_oversubscribe: true: no affinity, llama.cpp's own thread count (all cores)
Afterwards the sandbox is put back (cores, instances).

  .venv/bin/python scripts/shared_cores.py [--seconds 20] [--model-embd 768 --model-layers 6]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleet_load as fl  # noqa: E402

REPO = fl.REPO


def inventory(model, path, two_on_h1, oversub, host1):
    inv = Path(tempfile.mkdtemp(prefix="shared-cores-")) / "sandbox"
    shutil.copytree(REPO / "inventories" / "sandbox", inv)
    gv_path = inv / "group_vars" / "llama_hosts.yml"
    gv = yaml.safe_load(gv_path.read_text())
    gv["llamafleet_models"].append({"name": model, "source": "controller", "controller_path": str(path)})
    main = dict(gv["llamafleet_instances"][0], model=model, context=2048)
    if oversub:
        main["allow_oversubscribe"] = True
    gv["llamafleet_instances"] = [main]
    gv_path.write_text("---\n" + yaml.safe_dump(gv, sort_keys=False))
    if two_on_h1:
        hv = inv / "host_vars" / host1
        hv.mkdir(parents=True, exist_ok=True)
        second = dict(main, name="second", port=8081)
        (hv / "two.yml").write_text("---\n" + yaml.safe_dump({"llamafleet_instances": [main, second]}))
    return inv


def together(urls, key, args):
    out = {}

    def one(u):
        out[u] = fl.run_level(u, key, 1, args, args.seed)

    threads = [threading.Thread(target=one, args=(u,)) for u in urls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--short-tokens", type=int, default=12)
    p.add_argument("--long-tokens", type=int, default=160)
    p.add_argument("--long-share", type=float, default=0.2)
    p.add_argument("--model-embd", type=int, default=768)
    p.add_argument("--model-layers", type=int, default=6)
    p.add_argument("--parallel", type=int, default=1)
    p.add_argument("--prefix-name", default="llama-sandbox")
    p.add_argument("--key-file", type=Path, default=fl.CACHE / "sandbox-api-key")
    args = p.parse_args()
    args.multi_turn, args.turns, args.prefix, args.stream, args.seed = 0.0, 1, "", True, 7
    key = args.key_file.read_text().split()[0]
    hosts, _gw = fl.sandbox_hosts(args.prefix_name)
    h1, h2 = hosts[:2]
    _inv, model = fl.bench_inventory(args)  # generates the model once
    path = fl.CACHE / "models" / "fleet-load" / f"{model}.gguf"
    rows, everything = [], f"0-{(os.cpu_count() or 2) - 1}"
    try:
        for name, two, oversub, pin in (
            ("separate", False, False, True),
            ("planned", True, False, False),
            ("oversub", True, True, False),
        ):
            for i, h in enumerate((h1, h2)):
                fl.podman("update", "--cpuset-cpus", str(i) if pin else everything, h)
            inv = inventory(model, path, two, oversub, h1)
            secs = fl.site(inv)
            urls = [f"http://{fl.ip(h1)}:8081"] if two else [f"http://{fl.ip(h2)}:8080"]
            urls.insert(0, f"http://{fl.ip(h1)}:8080")
            res = together(urls, key, args)
            total = sum(r["tok_s"] or 0 for r in res.values())
            failed = sum(r["failed"] for r in res.values())
            rows.append((name, total, [res[u]["tok_s"] for u in urls], failed, secs))
            print(f"{name}: {total:.1f} tokens/s combined {[res[u]['tok_s'] for u in urls]} ({failed} failed; "
                  f"site.yml {secs:.0f} s)", flush=True)  # fmt: skip
    finally:
        for h in (h1, h2):
            fl.podman("update", "--cpuset-cpus", everything, h, check=False)
        fl.site(REPO / "inventories" / "sandbox")
        print("sandbox: put back (cores, instances, model)")
    base = rows[0][1] or 1
    print(f"\n{'configuration':<14} {'tokens/s':>9} {'vs separate':>12}  per instance")
    for name, total, each, _failed, _secs in rows:
        print(f"{name:<14} {total:>9.1f} {total / base:>11.0%}  {each}")


if __name__ == "__main__":
    main()
