#!/usr/bin/env python3
"""Fleet-scale benchmark of the converge on the sandbox (a script that measures and prints; not a test).

For each N (default 2 6 12) it starts N fresh sandbox hosts (podman, prefix llama-scale by default), runs
site.yml on them (the first converge: the llama.cpp artifact comes from the controller cache, no compile),
then site.yml again (the no-op re-run), and for the first N also the first converge of one host joining the
converged fleet. Each run goes through ansible-runner's Python API; per run it prints the wall time, the
controller CPU (user+sys of ansible-playbook and everything it ran: podman exec, ssh), and the tasks per
host from the run's stats (ok includes changed; skipped apart), then the per-added-host slope of the no-op.

    .venv/bin/python scripts/fleet-bench.py [--sizes 2 6 12] [--prefix llama-scale] [--repo PATH] [--keep]
    .venv/bin/python scripts/fleet-bench.py --sizes 6 --strategy free     # compare an accelerator
    .venv/bin/python scripts/fleet-bench.py --sizes 6 --noop-only          # hosts already up and converged
    .venv/bin/python scripts/fleet-bench.py --sizes 2 --logs /tmp/fb       # keep each run's output (task times)
    .venv/bin/python scripts/fleet-bench.py --sizes 2 12 --repeat 5        # median of 5 no-op runs per N
    .venv/bin/python scripts/fleet-bench.py --sizes 2 6 --status --no-join # and playbooks/status.yml per N

Needs what scripts/run-sandbox.sh sets up (images, the llama.cpp mirror, the sandbox model, the artifact
in the controller cache). The hosts share this machine's CPUs with the controller: the load average before
each run is printed, so numbers taken on a busy machine can be told apart.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def inventory(repo, tmp, prefix, n, extra_vars):
    inv = Path(tmp) / f"inventory-{n}" / "sandbox"
    if inv.exists():
        shutil.rmtree(inv)
    shutil.copytree(repo / "inventories" / "sandbox", inv)
    hosts = "".join(f"        {prefix}-{i}:\n" for i in range(1, n + 1))
    extra = "".join(f"        {k}: {json.dumps(v)}\n" for k, v in extra_vars.items())
    (inv / "hosts.yml").write_text(
        "---\nall:\n  children:\n    llama_hosts:\n      hosts:\n"
        + hosts
        + "      vars:\n"
        + "".join(
            f"        {k}: {v}\n"
            for k, v in {
                "ansible_connection": "podman",
                "ansible_python_interpreter": "/usr/bin/python3",
            }.items()
            if k not in extra_vars
        )
        + extra
    )
    return inv


def run(repo, inv, tmp, env, log=None, playbook="site.yml"):
    import ansible_runner

    data = tempfile.mkdtemp(dir=tmp, prefix="runner-")
    load = os.getloadavg()[0]
    cpu0, t0 = children_cpu(), time.monotonic()
    r = ansible_runner.run(
        private_data_dir=data,
        project_dir=str(repo),
        playbook=str(repo / playbook),
        inventory=str(inv),
        envvars={
            "ANSIBLE_CONFIG": str(repo / "ansible.cfg"),
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            **env,
        },
        quiet=True,
        rotate_artifacts=1,
    )
    wall, cpu = time.monotonic() - t0, children_cpu() - cpu0
    stats = r.stats or {}
    hosts = sorted(set().union(*(set(stats.get(k) or {}) for k in ("ok", "skipped", "failures", "dark"))))
    per_host = {
        h: {k: int((stats.get(k) or {}).get(h, 0)) for k in ("ok", "changed", "skipped", "failures")} for h in hosts
    }
    if log:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(r.stdout.read())  # profile_tasks' slowest tasks at the end
    if r.status != "successful":
        print(f"  run failed: {r.status} rc={r.rc}; artifacts in {data}", file=sys.stderr)
    return {"status": r.status, "wall_s": wall, "cpu_s": cpu, "load_before": load, "hosts": per_host}


def tasks_summary(res):
    rows = list(res["hosts"].values())
    if not rows:
        return "-"
    ok = sorted({r["ok"] for r in rows})
    sk = sorted({r["skipped"] for r in rows})
    ch = sum(r["changed"] for r in rows)
    return f"ok {'/'.join(map(str, ok))}, skipped {'/'.join(map(str, sk))}, changed {ch} (all hosts)"


def line(n, what, res, tail=""):
    return (
        f"N={n:<3} {what:<16} {res['wall_s']:7.1f} s wall {res['cpu_s']:7.1f} s CPU "
        f"(load {res['load_before']:.1f})  {tail or tasks_summary(res)}"
    )


def joined(values, key):
    return "/".join(str(v) for v in sorted({h[key] for h in values}))


def sandbox(repo, prefix, *args):
    env = {**os.environ, "SANDBOX_PREFIX": prefix, "SANDBOX_GATEWAY": "0"}  # the benchmark has no gateway group
    subprocess.run(["bash", str(repo / "scripts" / "sandbox.sh"), *args], check=True, env=env, capture_output=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[2, 6, 12])
    ap.add_argument("--prefix", default="llama-scale")
    ap.add_argument("--repo", type=Path, default=HERE, help="checkout to benchmark (default: this one)")
    ap.add_argument("--strategy", default=None, help="ANSIBLE_STRATEGY for every run (e.g. free)")
    ap.add_argument("--env", action="append", default=[], help="more NAME=VALUE for ansible-playbook's environment")
    ap.add_argument(
        "--host-var", action="append", default=[], help="NAME=VALUE for every host (ansible_connection=...)"
    )
    ap.add_argument("--noop-only", action="store_true", help="hosts are up and converged: only the no-op re-run")
    ap.add_argument("--repeat", type=int, default=1, help="run the no-op K times and report the median (by wall)")
    ap.add_argument("--no-join", action="store_true", help="skip the joining-host measurement")
    ap.add_argument("--keep", action="store_true", help="leave the hosts up at the end")
    ap.add_argument("--status", action="store_true", help="also time playbooks/status.yml after the no-op")
    ap.add_argument("--json", type=Path, help="write the results here too")
    ap.add_argument("--logs", type=Path, help="keep each run's output here (N-first.txt, N-noop.txt, N-join.txt)")
    a = ap.parse_args()
    repo = a.repo.resolve()
    env = dict(e.split("=", 1) for e in a.env)
    host_vars = dict(v.split("=", 1) for v in a.host_var)
    if a.strategy:
        env["ANSIBLE_STRATEGY"] = a.strategy
    tmp = tempfile.mkdtemp(prefix="fleet-bench-")
    results = []
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(
        f"repo {repo} ({head.stdout.strip()}), {os.cpu_count()} CPUs, env {env or '{}'}, host vars {host_vars or '{}'}"
    )
    try:
        for i, n in enumerate(sorted(a.sizes)):
            if not a.noop_only:
                sandbox(repo, a.prefix, "down")
            sandbox(repo, a.prefix, "up", str(n), "12")
            inv = inventory(repo, tmp, a.prefix, n, host_vars)
            row = {"n": n}
            if not a.noop_only:
                row["first"] = run(repo, inv, tmp, env, a.logs and a.logs / f"{n}-first.txt")
                print(line(n, "first converge", row["first"]), flush=True)
            noops = [
                run(repo, inv, tmp, env, a.logs and a.logs / f"{n}-noop{'' if k == 0 else f'-{k + 1}'}.txt")
                for k in range(a.repeat)
            ]
            # The median run by wall time: on a shared 2-core machine one run can be off by 20%.
            row["noop"] = sorted(noops, key=lambda r: r["wall_s"])[len(noops) // 2]
            row["noop_walls"] = [r["wall_s"] for r in noops]
            per_host = f"{row['noop']['cpu_s'] / n:.2f} s CPU per host; {tasks_summary(row['noop'])}"
            what = "no-op re-run" if a.repeat == 1 else f"no-op median/{a.repeat}"
            print(line(n, what, row["noop"], per_host), flush=True)
            if a.repeat > 1:
                print(f"      no-op walls: {', '.join(f'{w:.1f}' for w in row['noop_walls'])} s", flush=True)
            if a.status:
                row["status"] = run(repo, inv, tmp, env, a.logs and a.logs / f"{n}-status.txt", "playbooks/status.yml")
                print(line(n, "status.yml", row["status"], tasks_summary(row["status"])), flush=True)
            if i == 0 and not a.no_join and not a.noop_only:
                sandbox(repo, a.prefix, "up", str(n + 1), "12")
                inv_join = inventory(repo, tmp, a.prefix, n + 1, host_vars)
                row["join"] = run(repo, inv_join, tmp, env, a.logs and a.logs / f"{n}-join.txt")
                new = row["join"]["hosts"].get(f"{a.prefix}-{n + 1}", {})
                tail = f"joining host: ok {new.get('ok')}, changed {new.get('changed')}"
                print(line(n, "+1 joining host", row["join"], tail), flush=True)
            results.append(row)
    finally:
        if not a.keep:
            sandbox(repo, a.prefix, "down")
        shutil.rmtree(tmp, ignore_errors=True)

    print("\n| hosts | first converge wall / CPU | no-op wall / CPU | no-op CPU per host | no-op tasks per host |")
    print("|---|---|---|---|---|")
    for r in results:
        first = f"{r['first']['wall_s']:.0f} s / {r['first']['cpu_s']:.0f} s" if "first" in r else "-"
        hs = list(r["noop"]["hosts"].values())
        tasks = f"ok {joined(hs, 'ok')}, skipped {joined(hs, 'skipped')}"
        print(
            f"| {r['n']} | {first} | {r['noop']['wall_s']:.1f} s / {r['noop']['cpu_s']:.1f} s | "
            f"{r['noop']['cpu_s'] / r['n']:.2f} s | {tasks} |"
        )
    if len(results) > 1:
        a0, b0 = results[0], results[-1]
        dn = b0["n"] - a0["n"]
        print(
            f"\nper added host (no-op, N={a0['n']} -> {b0['n']}): "
            f"{(b0['noop']['wall_s'] - a0['noop']['wall_s']) / dn:.2f} s wall, "
            f"{(b0['noop']['cpu_s'] - a0['noop']['cpu_s']) / dn:.2f} s CPU; "
            f"no-op wall N={b0['n']} / N={a0['n']}: {b0['noop']['wall_s'] / a0['noop']['wall_s']:.2f}x"
        )
    for r in results:
        if "status" in r:
            print(f"status.yml on {r['n']} hosts: {r['status']['wall_s']:.1f} s wall, {r['status']['cpu_s']:.1f} s CPU")
    for r in results:
        if "join" in r:
            print(f"first converge of a host joining the converged {r['n']}-host fleet: {r['join']['wall_s']:.0f} s")
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    return 0 if all(v["status"] == "successful" for r in results for v in r.values() if isinstance(v, dict)) else 1


if __name__ == "__main__":
    sys.exit(main())
