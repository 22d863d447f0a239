#!/usr/bin/env python3
"""Model delivery benchmark: controller copies against fan-out, on N sandbox hosts with capped links
(a script that measures and prints; not a test).

For each N (default 2 6 12) it starts N hosts from the sandbox image with OpenSSH (debian-systemd:12-ssh) on a
network of their own, reached over ssh as root (so the controller's copies cross the network, as in a real
fleet; the podman harness would copy through `podman cp`). Every machine's upload is capped with tc (tbf): each
host's eth0 inside its network namespace, and the controller's side of the network (the bridge), at --mbit.
Then for each delivery (--deliveries: controller; fanout, whole files in doubling rounds; pieces, fan-out in
pieces: one piece per host from the controller, then each host gathers the others' pieces) it delivers a
generated GGUF of --mib MiB (tests/harness/gguf/make_models.py, padded with random bytes) with
tests/integration/model_fanout.yml through ansible-runner and
prints the wall time, the bytes the controller sent (the bridge's qdisc counter) and the bytes each host sent
(its eth0 counter), and the controller's bytes per the role's report. The model directory is emptied between
runs. Last, it extrapolates on paper to 50 and 200 hosts with a 16.5 GB model at 1 and 10 Gbit/s, from the
round structure (controller: N copies through one link; fan-out: 1 + ceil(log2 N) copy times; in pieces: one
copy time to send the pieces and (N - 1) / N to gather them) and the overhead measured here.

    .venv/bin/python scripts/fanout-bench.py [--sizes 2 6 12] [--mib 256] [--mbit 200] [--keep]
        [--deliveries controller fanout pieces]

Needs the sandbox images (scripts/sandbox.sh images) and root (tc, nsenter). The hosts share this machine's
CPUs with the controller; the load average before each run is printed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
NETWORK = "llamafleet-bench"
PREFIX = "llama-fob"


def sh(*cmd, check=True):
    return subprocess.run(cmd, capture_output=True, text=True, check=check).stdout


def pid_of(host):
    return sh("podman", "inspect", "-f", "{{.State.Pid}}", host).strip()


def ip_of(host):
    return sh("podman", "inspect", host, "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}").strip()


def bridge():
    return json.loads(sh("podman", "network", "inspect", NETWORK))[0]["network_interface"]


def tx_bytes(host):
    link = json.loads(sh("nsenter", "-t", pid_of(host), "-n", "ip", "-s", "-j", "link", "show", "eth0"))[0]
    return int(link["stats64"]["tx"]["bytes"])


def bridge_bytes():
    q = json.loads(sh("tc", "-s", "-j", "qdisc", "show", "dev", bridge()))
    return sum(int(x.get("bytes", 0)) for x in q if x.get("kind") == "tbf")


def cap(prefix, dev, mbit):
    """A token bucket (tc tbf) on a device's egress: rate mbit, a burst of about 1 ms at that rate; `prefix` reaches
    the device's network namespace ([] for this machine's)."""
    burst = max(32 * 1024, mbit * 1000 // 8)
    subprocess.run([*prefix, "tc", "qdisc", "del", "dev", dev, "root"], capture_output=True, check=False)
    subprocess.run([*prefix, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{mbit}mbit", "burst",
                    str(burst), "latency", "100ms"], check=True, capture_output=True)  # fmt: skip


def start_hosts(n, key_pub):
    env = dict(os.environ, SANDBOX_PREFIX=PREFIX, SANDBOX_GATEWAY="0", SANDBOX_NETWORK=NETWORK)
    subprocess.run(["bash", str(HERE / "scripts/sandbox.sh"), "up", str(n), "12-ssh"], check=True, env=env,
                   capture_output=True)  # fmt: skip
    hosts = [f"{PREFIX}-{i}" for i in range(1, n + 1)]
    for h in hosts:
        sh("podman", "exec", h, "sh", "-c", f"install -d -m 700 /root/.ssh && printf '%s\\n' '{key_pub}' > "
           "/root/.ssh/authorized_keys && chmod 600 /root/.ssh/authorized_keys")  # fmt: skip
        # rsync and python3-apt before the caps: the role installs rsync when missing (through ansible.builtin.apt,
        # which installs python3-apt first where it is missing: site.yml's earlier roles already did); installing
        # them is not what is measured
        sh("podman", "exec", h, "sh", "-c", "command -v rsync >/dev/null && test -d /usr/lib/python3/dist-packages/apt"
           " || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rsync python3-apt"
           " >/dev/null)")  # fmt: skip
    return hosts


def make_model(tmp, mib):
    out = Path(tmp) / "model"
    subprocess.run([sys.executable, str(HERE / "tests/harness/gguf/make_models.py"), "--kind", "agree",
                    "--out", str(out), "--name", "bench"], check=True, capture_output=True)  # fmt: skip
    path = out / "bench.gguf"
    with path.open("ab") as f:
        left = mib * 1024 * 1024 - path.stat().st_size
        while left > 0:
            chunk = min(left, 16 * 1024 * 1024)
            f.write(os.urandom(chunk))
            left -= chunk
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


DELIVERIES = {  # name -> extravars of tests/integration/model_fanout.yml (pieces from 2 hosts here, 3 by default)
    "controller": {"fanout_delivery": "controller"},
    "fanout": {"fanout_delivery": "fanout", "model_fetch_fanout_pieces_min": 0},
    "pieces": {"fanout_delivery": "fanout", "model_fetch_fanout_pieces_min": 2},
}


def run(tmp, hosts, key, model, delivery):
    import ansible_runner

    data = Path(tempfile.mkdtemp(dir=tmp))
    conn = {"ansible_connection": "ssh", "ansible_user": "root", "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_ssh_private_key_file": str(key),
            "ansible_ssh_common_args": "-o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no"}  # fmt: skip
    inv = {"all": {"children": {"fanout_hosts": {"hosts": {h: {"ansible_host": ip_of(h)} for h in hosts}}},
                   "vars": conn}}  # fmt: skip
    (data / "hosts.json").write_text(json.dumps(inv))
    path, sha = model
    ev = {"fanout_models": [{"name": "bench", "source": "controller", "controller_path": str(path), "sha256": sha}],
          **DELIVERIES[delivery], "model_fetch_controller_cache": str(Path(tmp) / "cache")}  # fmt: skip
    before = {h: tx_bytes(h) for h in hosts}
    ctl0 = bridge_bytes()
    t0 = time.monotonic()
    r = ansible_runner.run(
        private_data_dir=str(data), playbook=str(HERE / "tests/integration/model_fanout.yml"),
        inventory=str(data / "hosts.json"), extravars=ev, quiet=True,
        envvars={"ANSIBLE_CONFIG": str(HERE / "ansible.cfg"), "ANSIBLE_FORKS": str(max(10, len(hosts))),
                 "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )  # fmt: skip
    wall = time.monotonic() - t0
    events = list(r.events)
    report = {e["event_data"]["host"]: e["event_data"]["res"]["msg"] for e in events
              if e.get("event") == "runner_on_ok"
              and e["event_data"].get("task") == "Say where each host's files came from"}  # fmt: skip
    rounds = sum(1 for e in events if e.get("event") == "playbook_on_task_start"
                 and (e["event_data"].get("task") or "").startswith("Fetch from a peer, round"))  # fmt: skip
    return {
        "status": r.status,
        "wall": wall,
        "controller_bytes": bridge_bytes() - ctl0,
        "reported_controller": sum(int(v["controller_sent"]) for v in report.values()),
        "host_bytes": {h: tx_bytes(h) - before[h] for h in hosts},
        "origins": {h: [o["from"] for o in v["origins"]] for h, v in report.items()},
        "rounds": rounds,
        "tasks": task_spans(events),
    }


def task_spans(events):
    """Each task's wall time: from its start to the next task's start (or the play's end), slowest first."""
    from datetime import datetime

    marks = [(e["event_data"].get("task") or e["event"], datetime.fromisoformat(e["created"]))
             for e in events if e.get("event") in ("playbook_on_task_start", "playbook_on_stats")]  # fmt: skip
    spans = {}
    for (name, t), (_, nxt) in zip(marks, marks[1:], strict=False):
        spans[name] = spans.get(name, 0.0) + (nxt - t).total_seconds()
    return sorted(spans.items(), key=lambda kv: -kv[1])


def empty(hosts):
    for h in hosts:
        sh("podman", "exec", h, "rm", "-rf", "/var/lib/llama-models/bench")


def extrapolate(overhead_s, pieces_overhead_s):
    """The paper table; an overhead of None (that delivery was not run) leaves its column out."""
    size_gbit = 16.5 * 8
    fan_how = "not run" if overhead_s is None else f"1 + ceil(log2 N) copy times + {overhead_s:.0f} s per round"
    pieces_how = (
        "not run" if pieces_overhead_s is None else f"1 + (N-1)/N copy times + {pieces_overhead_s:.0f} s per run"
    )
    print("\nOn paper: a 16.5 GB model, every machine's link at the rate given (controller: N copies through its")
    print(f"link; fan-out: {fan_how}; in pieces: {pieces_how}; overheads measured above)")
    print(f"{'hosts':>6} {'link':>8} {'controller':>12} {'fan-out':>10} {'pieces':>10} {'speed-up':>9} "
          f"{'controller bytes':>18}")  # fmt: skip
    for n in (50, 200):
        for gbit in (1, 10):
            t = size_gbit / gbit
            ctl = n * t
            fan = None if overhead_s is None else (1 + math.ceil(math.log2(n))) * (t + overhead_s)
            pieces = None if pieces_overhead_s is None else t * (1 + (n - 1) / n) + pieces_overhead_s
            cols = [f"{x / 60:>7.1f} min" if x else f"{'-':>11}" for x in (fan, pieces)]
            ups = "/".join(f"{ctl / x:.1f}" if x else "-" for x in (fan, pieces))
            print(f"{n:>6} {gbit:>5} Gb {ctl / 60:>9.1f} min {cols[0]} {cols[1]} {ups + 'x':>9} "
                  f"{n * 16.5:>8.0f} -> 16.5 GB")  # fmt: skip


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[2, 6, 12])
    ap.add_argument("--mib", type=int, default=256, help="model size in MiB")
    ap.add_argument("--mbit", type=int, default=200, help="every machine's upload cap in Mbit/s")
    ap.add_argument("--keep", action="store_true", help="leave the hosts running")
    ap.add_argument("--tasks", type=int, default=0, metavar="K", help="print each run's K slowest tasks")
    ap.add_argument("--deliveries", nargs="+", default=list(DELIVERIES), choices=list(DELIVERIES))
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (tc, nsenter)")
    tmp = tempfile.mkdtemp(prefix="fanout-bench-")
    key = Path(tmp) / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    model = make_model(tmp, args.mib)
    size = model[0].stat().st_size
    copy_s = size * 8 / (args.mbit * 1e6)
    print(f"model {size / 2**20:.0f} MiB, every upload capped at {args.mbit} Mbit/s (tc tbf): one copy takes "
          f"{copy_s:.1f} s at the cap; hosts reached over ssh as root; CPUs shared with the controller")  # fmt: skip
    print(f"{'hosts':>5} {'delivery':>10} {'wall s':>8} {'copy times':>10} {'rounds':>6} {'controller MiB':>15} "
          f"{'reported':>9} {'host MiB sent (each)':<40} load")  # fmt: skip
    overheads, pieces_overheads = [], []
    try:
        for n in args.sizes:
            subprocess.run(["podman", "rm", "-f", *[f"{PREFIX}-{i}" for i in range(1, 64)]], capture_output=True)
            hosts = start_hosts(n, (key.with_suffix(".pub")).read_text().strip())
            for h in hosts:
                cap(["nsenter", "-t", pid_of(h), "-n"], "eth0", args.mbit)
            cap([], bridge(), args.mbit)
            res = {}
            for delivery in args.deliveries:
                empty(hosts)
                load = os.getloadavg()[0]
                r = run(tmp, hosts, key, model, delivery)
                res[delivery] = r
                sent = " ".join(f"{b / 2**20:.0f}" for b in r["host_bytes"].values())
                print(f"{n:>5} {delivery:>10} {r['wall']:>8.1f} {r['wall'] / copy_s:>10.1f} {r['rounds']:>6} "
                      f"{r['controller_bytes'] / 2**20:>15.0f} {r['reported_controller'] / 2**20:>9.0f} "
                      f"{sent:<40} {load:.2f}{'' if r['status'] == 'successful' else '  ' + r['status']}",
                      flush=True)  # fmt: skip
                for name, span in r["tasks"][: args.tasks]:
                    print(f"{'':>5} {'':>10} {span:>8.1f}  {name}")
                if delivery == "fanout" and r["rounds"]:
                    overheads.append((r["wall"] - (1 + r["rounds"]) * copy_s) / (1 + r["rounds"]))
                if delivery == "pieces" and r["status"] == "successful":
                    pieces_overheads.append(r["wall"] - (1 + (n - 1) / n) * copy_s)
            for delivery in ("fanout", "pieces"):
                if (
                    delivery in res
                    and "controller" in res
                    and res["controller"]["status"] == "successful" == (res[delivery]["status"])
                ):
                    print(f"{'':>5} {delivery:>10} {res['controller']['wall'] / res[delivery]['wall']:.2f}x faster "
                          f"than controller; origins {json.dumps(res[delivery]['origins'])}")  # fmt: skip
            if not args.keep:
                subprocess.run(["podman", "rm", "-f", *hosts], capture_output=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    extrapolate(
        max(0.0, sum(overheads) / len(overheads)) if overheads else None,
        max(0.0, sum(pieces_overheads) / len(pieces_overheads)) if pieces_overheads else None,
    )


if __name__ == "__main__":
    main()
