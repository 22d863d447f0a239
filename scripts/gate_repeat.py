#!/usr/bin/env python3
"""The speed gate, repeated: how often it lets a speed-neutral change through and how often it stops a build that
is about 20 % slower, at the production margin, with its noise measured. A measurement on the sandbox fleet, not
a test: it prints a table and a summary and asserts nothing.

Each round makes two changes through the fleet's own playbooks on a copy of inventories/sandbox
(ansible-runner, the gate's verdicts read from the job events):
  neutral  site.yml with a new alias for the instance: every instance restarts, nothing about its speed changes;
           the gate must let it through (a refusal is a false alarm)
  slower   upgrade.yml -e llamafleet_upgrade_ref=b9182: STAND-IN for a slower release, each model computation
           followed by a sleep of a quarter of its time (the local mirror's tag, tests/harness/llamacpp/mirror.sh;
           on the sandbox's tiny model the sleep's overhead makes it about 2x slower, not 20 %); the gate must
           stop it on the canary (rolled back, no release written)
The sandbox hosts share this machine's cores: by default each host is pinned to its own core first (podman update
--cpuset-cpus; the plan then gives its instance --threads 1), as a fleet of separate machines would be, and this
is said in the output; --no-pin measures on the shared cores. Afterwards the sandbox is put back.

--model-embd 768 serves a generated model (fleet_load.py's) whose computations last milliseconds, where b9182 is
about 20 % slower; the default measures the sandbox's tiny model.

  .venv/bin/python scripts/gate_repeat.py [--rounds 5] [--margin 0.1] [--runs 6] [--n-predict 64]
                                          [--model-embd 768 --model-layers 6]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleet_load as fl  # noqa: E402

REPO = fl.REPO
MEASURE_TASK = "Measure decode speed and MTP acceptance of each instance"
VERDICT_TASK = "Compare with the baseline"


def inventory(args):
    if args.model_embd:
        args.parallel = 1
        inv, _name = fl.bench_inventory(args)
    else:
        inv = Path(tempfile.mkdtemp(prefix="gate-repeat-")) / "sandbox"
        shutil.copytree(REPO / "inventories" / "sandbox", inv)
    gv_path = inv / "group_vars" / "llama_hosts.yml"
    gv = yaml.safe_load(gv_path.read_text())
    gv["llamafleet_speed_gate"] = {**gv.get("llamafleet_speed_gate", {}), "margin": args.margin, "runs": args.runs,
                                   "n_predict": args.n_predict}  # fmt: skip
    gv_path.write_text("---\n" + yaml.safe_dump(gv, sort_keys=False))
    return inv


def set_alias(inv, alias):
    gv_path = inv / "group_vars" / "llama_hosts.yml"
    gv = yaml.safe_load(gv_path.read_text())
    gv["llamafleet_instances"][0]["alias"] = alias
    gv_path.write_text("---\n" + yaml.safe_dump(gv, sort_keys=False))


def play(playbook, inv, extravars=None):
    import ansible_runner

    data = Path(tempfile.mkdtemp(prefix="gate-repeat-run-"))
    # ansible-runner runs ansible-playbook from PATH: the one beside this interpreter (the venv's), activated or not
    env = {"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # fmt: skip
    run = ansible_runner.run(private_data_dir=str(data), project_dir=str(REPO), playbook=str(REPO / playbook),
                             inventory=str(inv), extravars=extravars or {}, envvars=env, quiet=True,
                             rotate_artifacts=1)  # fmt: skip
    events = list(run.events)
    if run.status != "successful" and not any(e.get("event") == "playbook_on_task_start" for e in events):
        sys.stderr.write("".join(e.get("stdout") or "" for e in events)[-2000:] + "\n")
        raise SystemExit(f"{playbook} did not run (ansible-runner: {run.status})")
    shutil.rmtree(data, ignore_errors=True)
    return run.status, events


def verdicts(events):
    """host -> (the gate's verdict for instance 'main', seconds the gate measured on that host)."""
    out, secs = {}, {}
    for e in events:
        d = e.get("event_data") or {}
        if e.get("event") != "runner_on_ok" or not d.get("host"):
            continue
        if d.get("task") == MEASURE_TASK:
            secs[d["host"]] = secs.get(d["host"], 0.0) + float(d.get("duration") or 0.0)
        if d.get("task") == VERDICT_TASK:
            speed = (d["res"].get("ansible_facts") or {}).get("llamafleet_speed") or {}
            out[d["host"]] = (speed.get("instances") or {}).get("main")
    return {h: (v, secs.get(h)) for h, v in out.items()}


def row(rnd, kind, status, found, host):
    v, secs = found.get(host, (None, None))
    if not v:
        return {"round": rnd, "kind": kind, "host": host, "status": status, "measured": False}
    return {"round": rnd, "kind": kind, "host": host, "status": status, "measured": True,
            "before": v.get("tok_s_before"), "after": v.get("tok_s"), "change": v.get("change"),
            "p": v.get("p_value"), "noise": max(v.get("noise") or 0, v.get("noise_before") or 0),
            "slower": bool(v.get("slower")), "gate_s": secs,
            "twice": v.get("measurements") == 2}  # fmt: skip


def show(r):
    head = f"{r['round']:>5} {r['kind']:<8} {r['host']:<18}"
    if not r["measured"]:
        return f"{head} {'(not measured: the rollout stopped before this host)':<60} {r['status']}"
    p = "-" if r["p"] is None else f"{r['p']:.4f}"
    verdict = ("STOPPED" if r["slower"] else "passed") + ("*" if r.get("twice") else "")
    return (f"{head} {r['before']:>9.1f} {r['after']:>9.1f} {r['change']:>+8.1%} {p:>7} {r['noise']:>7.1%} "
            f"{verdict:>8} {r['gate_s'] or 0:>7.1f} {r['status']}")  # fmt: skip


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--margin", type=float, default=0.1, help="the gate's margin (production's default: 0.1)")
    p.add_argument("--runs", type=int, default=6, help="llama_bench runs per measurement")
    p.add_argument("--n-predict", type=int, default=64)
    p.add_argument("--slower-ref", default="b9182")
    p.add_argument("--no-pin", action="store_true", help="leave the hosts on the shared cores")
    p.add_argument("--prefix-name", default="llama-sandbox")
    p.add_argument(
        "--model-embd",
        type=int,
        default=0,
        help="serve a generated model this wide, so a computation lasts milliseconds (0: the sandbox's)",
    )
    p.add_argument("--model-layers", type=int, default=6, help="with --model-embd")
    args = p.parse_args()
    hosts, _gw = fl.sandbox_hosts(args.prefix_name)
    everything = f"0-{(os.cpu_count() or 2) - 1}"
    inv = inventory(args)
    rows = []
    print(f"sandbox hosts {hosts}: {'shared cores' if args.no_pin else 'each host pinned to its own core'}; "
          f"gate margin {args.margin:.0%}, {args.runs} runs of {args.n_predict} tokens; model: "
          f"{f'generated, {args.model_embd} wide, {args.model_layers} layers' if args.model_embd else 'the sandbox'}",
          flush=True)  # fmt: skip
    try:
        if not args.no_pin:
            for i, h in enumerate(hosts):
                fl.podman("update", "--cpuset-cpus", str(i % (os.cpu_count() or 2)), h)
        # the starting point (the pinned plan: --threads 1), not measured: before it the instances run the threads of
        # the unpinned plan on one core, which is what this converge changes
        fl.site(inv, "-e", '{"llamafleet_speed_gate": {"enabled": false}}')
        for rnd in range(1, args.rounds + 1):
            set_alias(inv, f"gate-repeat-{rnd}")
            status, events = play("site.yml", inv)
            found = verdicts(events)
            for h in hosts:
                rows.append(row(rnd, "neutral", status, found, h))
                print(show(rows[-1]), flush=True)
            status, events = play("playbooks/upgrade.yml", inv, {"llamafleet_upgrade_ref": args.slower_ref})
            found = verdicts(events)
            for h in hosts:
                rows.append(row(rnd, "slower", status, found, h))
                print(show(rows[-1]), flush=True)
    finally:
        for h in hosts:
            fl.podman("update", "--cpuset-cpus", everything, h, check=False)
        fl.site(REPO / "inventories" / "sandbox")
        print("sandbox: put back (cores, alias, build)", flush=True)
    print(f"\n{'round':>5} {'change':<8} {'host':<18} {'before':>9} {'after':>9} {'change':>8} {'p':>7} {'noise':>7} "
          f"{'verdict':>8} {'gate s':>7} run")  # fmt: skip
    for r in rows:
        print(show(r))
    print("  (*: the first figure after the restart was beyond the margin and measured once more; the faster counts)")
    neutral = [r for r in rows if r["kind"] == "neutral" and r["measured"]]
    canary = hosts[0]
    slower = [r for r in rows if r["kind"] == "slower" and r["host"] == canary and r["measured"]]
    alarms = sum(r["slower"] for r in neutral)
    caught = sum(r["slower"] for r in slower)
    print(f"\nneutral changes: {alarms} false alarm(s) in {len(neutral)} measured restarts "
          f"({sum(r['status'] == 'successful' for r in rows if r['kind'] == 'neutral') // max(len(hosts), 1)} of "
          f"{args.rounds} runs successful); {sum(bool(r.get('twice')) for r in neutral)} of them measured twice "
          f"(the first figure beyond the margin)")  # fmt: skip
    if neutral:
        ch = [r["change"] for r in neutral]
        print(f"  change: median {statistics.median(ch):+.1%}, range {min(ch):+.1%} .. {max(ch):+.1%}; "
              f"noise (the gate's own figure) up to {max(r['noise'] for r in neutral):.1%}")  # fmt: skip
    print(f"slower build ({args.slower_ref}): stopped on the canary in {caught} of {len(slower)} runs")
    if slower:
        ch = [r["change"] for r in slower]
        print(f"  change: median {statistics.median(ch):+.1%}, range {min(ch):+.1%} .. {max(ch):+.1%}")
    gate = [r["gate_s"] for r in rows if r["measured"] and r["gate_s"]]
    if gate:
        print(f"gate time per host (both measurements): median {statistics.median(gate):.1f} s, max {max(gate):.1f} s")


if __name__ == "__main__":
    main()
