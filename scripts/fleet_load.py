#!/usr/bin/env python3
"""Fleet load benchmark: served speed of the whole fleet through its gateway, two gateway configurations
side by side in one run. A measurement, not a test: it prints tables (and --json) and asserts nothing.

Closed-loop clients (each sends its next request when the last one ended) at concurrency levels (default: 1,
the fleet's slots, 2x and 4x slots) for --seconds each, a request mix per client (seeded): short completions
(--short-tokens, 80 %), long ones (--long-tokens) and multi-turn conversations that resend a growing shared
prefix (--multi-turn, with an X-Session-Id header), streaming (--stream, the default: time to first token is
measured) or not. Per level and configuration: requests, failures, fleet completion tokens/s, time to first
token and end-to-end latency p50/p95/p99 (all and short requests alone), the prompt-cache reuse of the
conversations (cache_n / (cache_n + prompt_n) in the responses' timings; and of the resent prefix alone: the last
turn's prompt and answer) and the ratio of fleet tokens/s to
the sum of the instances' single-stream tokens/s (each instance measured directly, alone, with the same mix), and
the same ratio for the level's own mix (each request served counted at its kind's single-stream latency).

The configurations are the gateway's, switched at run time through HAProxy's runtime API (no restart):
  slot-aware  each server's maxconn = its instance's slots (llama_gateway_slot_aware: true, opt-in): requests
              wait in HAProxy's queue for the first free slot on any instance;
  leastconn   maxconn 0 (unlimited; the role's default): every request goes to the least busy instance at once
              and waits inside that llama-server.
  affinity    leastconn, and a conversation's requests (X-Session-Id) go to the instance its session hashes to
              (llama_gateway_affinity: header, bounded load); needs a gateway deployed with it (on the sandbox,
              --affinity deploys it). Off in the other configurations (its servers in MAINT).
Levels alternate the order of the two, so drift hits both alike.

On the sandbox fleet (scripts/run-sandbox.sh; the default when its containers run) it first pins each llama
host to its own cores (podman update --cpuset-cpus; it says so), serves a generated model slow enough that a
long completion lasts seconds (--model-embd/--model-layers; through site.yml on a copy of inventories/sandbox,
so the planner gives each confined host --threads for its cores), measures, and then puts the sandbox back
(cores and model). --keep-sandbox-model skips the model; --no-pin skips the pinning.

Elsewhere: --gateway URL --instances URL,URL --key-file F --admin-cmd 'ssh gw sudo socat stdio
/run/haproxy/admin.sock' (a command that sends its standard input to the runtime API and prints the answer).

  .venv/bin/python scripts/fleet_load.py [--seconds 20] [--levels 1,2,4,8] [--json out.json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import yaml

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("LLAMA_MTP_CACHE", "/var/cache/llama-mtp-fleet"))
SOCKET_PY = (
    "import socket,sys\n"
    "s=socket.socket(socket.AF_UNIX);s.connect('/run/haproxy/admin.sock');s.sendall(sys.stdin.buffer.read())\n"
    "b=b''\n"
    "while True:\n d=s.recv(65536)\n if not d: break\n b+=d\n"
    "sys.stdout.write(b.decode())\n"
)
TOPICS = ["the tides", "a lighthouse", "compilers", "bread", "glaciers", "chess openings", "volcanoes", "bees"]


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


# ------------------------------------------------------------------------------------------------
# one request


def chat(url, key, messages, max_tokens, stream, session=None, timeout=600):
    """One /v1/chat/completions; returns {ok, ttft, e2e, tokens, cache_n, prompt_n, error}."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    body = {"model": "fleet", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": stream,
            "cache_prompt": True}  # fmt: skip
    if stream:
        body["stream_options"] = {"include_usage": True}
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    if session:
        headers["X-Session-Id"] = session
    t0 = time.perf_counter()
    out = {"ok": False, "ttft": None, "e2e": None, "tokens": 0, "cache_n": None, "prompt_n": None, "error": None}
    try:
        conn.request("POST", parts.path.rstrip("/") + "/v1/chat/completions", json.dumps(body), headers)
        resp = conn.getresponse()
        if resp.status != 200:
            out["error"] = f"HTTP {resp.status}: {resp.read()[:200]!r}"
            return out
        text, timings, usage = [], None, None
        if stream:
            for raw in resp:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                for ch in chunk.get("choices") or []:
                    piece = (ch.get("delta") or {}).get("content")
                    if piece:
                        if out["ttft"] is None:
                            out["ttft"] = time.perf_counter() - t0
                        text.append(piece)
                timings = chunk.get("timings") or timings
                usage = chunk.get("usage") or usage
        else:
            answer = json.loads(resp.read())
            out["ttft"] = time.perf_counter() - t0
            text = [(answer.get("choices") or [{}])[0].get("message", {}).get("content") or ""]
            timings, usage = answer.get("timings"), answer.get("usage")
        out["e2e"] = time.perf_counter() - t0
        out["tokens"] = int((usage or {}).get("completion_tokens") or (timings or {}).get("predicted_n") or 0)
        out["cache_n"] = (timings or {}).get("cache_n")
        out["prompt_n"] = (timings or {}).get("prompt_n")
        out["text"] = "".join(text)
        out["ok"] = out["tokens"] > 0
        if not out["ok"]:
            out["error"] = "no tokens"
    except (OSError, http.client.HTTPException, ValueError) as e:
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    return out


class Client(threading.Thread):
    """A closed-loop client: its next request when the last one ended, until the deadline."""

    def __init__(self, idx, url, key, args, deadline, seed):
        super().__init__(daemon=True)
        self.url, self.key, self.args, self.deadline = url, key, args, deadline
        self.rng = random.Random(seed * 1000 + idx)
        self.idx, self.rows, self.conversation, self.turn, self.held = idx, [], None, 0, None

    def next_request(self):
        a = self.args
        if self.conversation is not None:
            return "turn", self.conversation, a.long_tokens // 2
        r = self.rng.random()
        topic = self.rng.choice(TOPICS)
        if r < a.multi_turn:
            self.conversation = [{"role": "system", "content": f"You are a patient tutor. Context: {a.prefix}"}]
            self.conversation.append({"role": "user", "content": f"Teach me about {topic}."})
            self.turn = 0
            return "turn", self.conversation, a.long_tokens // 2
        if r < a.multi_turn + a.long_share:
            return "long", [{"role": "user", "content": f"Write a long essay about {topic}."}], a.long_tokens
        return "short", [{"role": "user", "content": f"One word for {topic}?"}], a.short_tokens

    def run(self):
        while time.monotonic() < self.deadline:
            kind, messages, n = self.next_request()
            session = f"client-{self.idx}" if kind == "turn" else None
            res = chat(self.url, self.key, list(messages), n, self.args.stream, session)
            res.update(kind=kind, turn=self.turn if kind == "turn" else None, t_end=time.monotonic(),
                       resent=self.held if kind == "turn" and self.turn else None)  # fmt: skip
            self.rows.append(res)
            if kind == "turn":
                # what the server held of this conversation after this turn: its prompt and its answer
                self.held = (res["cache_n"] or 0) + (res["prompt_n"] or 0) + res["tokens"] if res["ok"] else None
                if res["ok"] and self.turn + 1 < self.args.turns:
                    self.conversation.append({"role": "assistant", "content": res.get("text") or "..."})
                    self.conversation.append({"role": "user", "content": "Go on, in more detail."})
                    self.turn += 1
                else:
                    self.conversation = None


def run_level(url, key, clients, args, seed):
    t0 = time.monotonic()
    deadline = t0 + args.seconds
    threads = [Client(i, url, key, args, deadline, seed) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    return summarize([r for t in threads for r in t.rows], wall)


def summarize(rows, wall):
    good = [r for r in rows if r["ok"]]
    short = [r for r in good if r["kind"] == "short"]
    later_turns = [r for r in good if r["kind"] == "turn" and r["turn"] and r["cache_n"] is not None]
    cached = sum(r["cache_n"] for r in later_turns)
    fresh = sum(r["prompt_n"] or 0 for r in later_turns)
    # the goal's measure: of the tokens a later turn resends (the last turn's prompt and answer), the share that
    # came from the prompt cache
    resent = [r for r in later_turns if r.get("resent")]
    resent_total = sum(r["resent"] for r in resent)
    resent_cached = sum(min(r["cache_n"], r["resent"]) for r in resent)

    def ms(xs, p):
        v = pct(xs, p)
        return None if v is None else round(v * 1000, 1)

    return {
        "requests": len(rows),
        "failed": len(rows) - len(good),
        "errors": sorted({r["error"] for r in rows if r["error"]})[:5],
        "wall_s": round(wall, 2),
        "tokens": sum(r["tokens"] for r in good),
        "tok_s": round(sum(r["tokens"] for r in good) / wall, 1) if wall else None,
        **{f"ttft_p{p}_ms": ms([r["ttft"] for r in good if r["ttft"] is not None], p) for p in (50, 95, 99)},
        **{f"e2e_p{p}_ms": ms([r["e2e"] for r in good], p) for p in (50, 95, 99)},
        **{f"short_e2e_p{p}_ms": ms([r["e2e"] for r in short], p) for p in (50, 95, 99)},
        "cache_reuse": round(cached / (cached + fresh), 3) if cached + fresh else None,
        "prefix_reuse": round(resent_cached / resent_total, 3) if resent_total else None,
        # per kind of request: how many ended well and their summed latency (the same-mix ratio's inputs)
        "kinds": {k: _kind(good, k) for k in ("short", "long", "turn")},
    }


def _kind(rows, kind):
    rows = [r for r in rows if r["kind"] == kind]
    return {"n": len(rows), "e2e_s": round(sum(r["e2e"] for r in rows), 3)}


def same_mix_ratio(level, singles):
    """What the fleet did per second of wall time, in the instances' own single-stream time: each request the level
    served counts the mean latency its kind had on one instance alone (the instances' average), and the sum over
    the requests is divided by the instances and the wall time. 1.0: every instance as busy and as fast as alone.
    Unlike tokens/s against the single streams' tokens/s it does not move with the level's random mix (20 % long
    completions of 160 tokens among 12-token ones: a few more long ones in a 20 s level raise tokens/s by a fifth)."""
    means = {}
    for kind in ("short", "long", "turn"):
        per = [s["kinds"][kind]["e2e_s"] / s["kinds"][kind]["n"] for s in singles if s["kinds"][kind]["n"]]
        means[kind] = sum(per) / len(per) if per else None
    work = 0.0
    for kind, k in level["kinds"].items():
        if k["n"] and means[kind] is None:
            return None  # a kind the single streams never sent: no reference for it
        work += k["n"] * (means[kind] or 0)
    return round(work / (len(singles) * level["wall_s"]), 3) if singles and level["wall_s"] else None


# ------------------------------------------------------------------------------------------------
# the gateway's configurations, through its runtime API


class Gateway:
    def __init__(self, admin_cmd, backend="llama"):
        self.cmd, self.backend = admin_cmd, backend

    def api(self, command):
        out = subprocess.run(self.cmd, input=command + "\n", capture_output=True, text=True, shell=True, check=True)
        return out.stdout

    def servers(self, backend=None):
        """show stat's rows of the servers of a backend (default: the main one)."""
        lines = self.api("show stat").splitlines()
        head = lines[0].lstrip("# ").split(",")
        rows = [dict(zip(head, line.split(","), strict=False)) for line in lines[1:] if line]
        backend = backend or self.backend
        return [r for r in rows if r["pxname"] == backend and r["svname"] not in ("FRONTEND", "BACKEND")]

    def maxconn(self, rows=None):
        return {r["svname"]: int(r["slim"]) if r.get("slim") else 0 for r in (self.servers() if rows is None else rows)}

    def affinity_servers(self):
        """The servers of the session-affinity backend (llama_gateway_affinity), if the gateway has one."""
        return [r["svname"] for r in self.servers(f"{self.backend}_affinity")]

    def set_affinity(self, on):
        """Affinity off at run time: its servers in MAINT, so the gateway sends sessions to the least busy server
        (its rule needs a usable affinity server); on: READY (their health still follows the tracked servers)."""
        for name in self.affinity_servers():
            answer = self.api(f"set server {self.backend}_affinity/{name} state {'ready' if on else 'maint'}").strip()
            if answer:
                raise SystemExit(f"runtime API: set server {self.backend}_affinity/{name}: {answer}")

    def set_maxconn(self, values):
        for name, n in values.items():
            answer = self.api(f"set maxconn server {self.backend}/{name} {n}").strip()
            if answer:
                raise SystemExit(f"runtime API: set maxconn server {self.backend}/{name} {n}: {answer}")


def total_slots(addr, key, timeout=10):
    """llama-server's own slot count (GET /props: total_slots), or None where it does not answer."""
    host, _, port = addr.rpartition(":")
    try:
        conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout)
        conn.request("GET", "/props", headers={"Authorization": f"Bearer {key}"})
        resp = conn.getresponse()
        return int(json.loads(resp.read())["total_slots"]) if resp.status == 200 else None
    except (OSError, ValueError, KeyError, TypeError, http.client.HTTPException):
        return None


# ------------------------------------------------------------------------------------------------
# the sandbox fleet


def podman(*args, check=True):
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=check).stdout.strip()


def ip(container):
    return podman("inspect", container, "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}")


def sandbox_hosts(prefix):
    names = podman("ps", "--format", "{{.Names}}").split()
    hosts = sorted(n for n in names if n.startswith(prefix + "-") and n.split("-")[-1].isdigit())
    return hosts, f"{prefix}-gateway" if f"{prefix}-gateway" in names else None


def site(inventory, *extra, gateway=False):
    # A benchmark's model and instances are changed on purpose, so the speed gate is off for its deploys: it would
    # (rightly) refuse the slower generated model, and its measurement before a restart is of an instance whose
    # threads were just confined to fewer cores (the pinning comes first, so that the plan sees it), which took up
    # to 5 minutes per host. The gateway is left as it is unless asked.
    cmd = [str(REPO / ".venv" / "bin" / "ansible-playbook"), "site.yml", "-i", str(inventory),
           *([] if gateway else ["--skip-tags", "gateway"]), "-e", "llamafleet_accept_slower=true",
           "-e", json.dumps({"llamafleet_speed_gate": {"enabled": False}}), *extra]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:])
        raise SystemExit(f"site.yml -i {inventory} failed (rc {proc.returncode})")
    return time.monotonic() - t0


def bench_inventory(args):
    """A copy of inventories/sandbox serving a generated model slow enough for routing effects to show."""
    name = f"fleet-load-e{args.model_embd}-l{args.model_layers}"
    out = CACHE / "models" / "fleet-load"
    path = out / f"{name}.gguf"
    if not path.exists():
        subprocess.run([sys.executable, str(REPO / "tests/harness/gguf/make_models.py"), "--kind", "agree", "--name",
                        name, "--n-embd", str(args.model_embd), "--n-layer", str(args.model_layers), "--out",
                        str(out)], check=True, capture_output=True)  # fmt: skip
    inv = Path(tempfile.mkdtemp(prefix="fleet-load-inv-")) / "sandbox"
    shutil.copytree(REPO / "inventories" / "sandbox", inv)
    gv_path = inv / "group_vars" / "llama_hosts.yml"
    gv = yaml.safe_load(gv_path.read_text())
    gv["llamafleet_models"].append({"name": name, "source": "controller", "controller_path": str(path)})
    gv["llamafleet_instances"][0]["model"] = name
    gv["llamafleet_instances"][0]["parallel"] = args.parallel
    for item in args.instance_field or []:
        field, _, value = item.partition("=")
        gv["llamafleet_instances"][0][field] = yaml.safe_load(value)
    gv_path.write_text("---\n" + yaml.safe_dump(gv, sort_keys=False))
    return inv, name


# ------------------------------------------------------------------------------------------------


def table(results, levels, configs):
    cols = [("req", "requests"), ("fail", "failed"), ("tok/s", "tok_s"), ("vs 1-stream", "ratio"),
            ("same mix", "same_mix"),
            ("ttft p50", "ttft_p50_ms"), ("ttft p99", "ttft_p99_ms"), ("e2e p50", "e2e_p50_ms"),
            ("e2e p95", "e2e_p95_ms"), ("e2e p99", "e2e_p99_ms"), ("short p50", "short_e2e_p50_ms"),
            ("short p99", "short_e2e_p99_ms"), ("cache", "cache_reuse"), ("prefix", "prefix_reuse")]  # fmt: skip
    print(f"{'clients':>7} {'config':<11} " + " ".join(f"{h:>11}" for h, _ in cols))
    for level in levels:
        for cfg in configs:
            r = results[cfg][str(level)]
            cells = []
            for _, k in cols:
                v = r.get(k)
                cells.append(f"{'-' if v is None else v:>11}")
            print(f"{level:>7} {cfg:<11} " + " ".join(cells))
    print("(latencies in ms; 'vs 1-stream': fleet tokens/s / sum of the instances' single-stream tokens/s;")
    print(" 'same mix': the requests served, each at its kind's single-stream latency, per instance and second;")
    print(" 'cache': prompt tokens of later conversation turns served from the prompt cache;")
    print(" 'prefix': of the tokens a later turn resends (the last turn's prompt and answer), those from the cache)")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=20.0, help="per level and configuration")
    p.add_argument("--levels", help="concurrency levels (default: 1, slots, 2x, 4x slots)")
    p.add_argument("--short-tokens", type=int, default=12)
    p.add_argument("--long-tokens", type=int, default=160)
    p.add_argument("--long-share", type=float, default=0.2, help="share of long completions")
    p.add_argument("--multi-turn", type=float, default=0.0, help="share of clients' picks that start a conversation")
    p.add_argument("--turns", type=int, default=4, help="turns per conversation")
    p.add_argument("--prefix", default="A shared system prompt that every conversation resends. " * 8)
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--configs", default="slot-aware,leastconn")
    p.add_argument("--json", type=Path, help="write every figure here")
    p.add_argument("--gateway", help="the gateway's base URL (default: the sandbox's)")
    p.add_argument("--instances", help="comma-separated instance base URLs (single-stream baselines)")
    p.add_argument("--key-file", type=Path, default=CACHE / "sandbox-api-key")
    p.add_argument("--admin-cmd", help="command that talks to the gateway's runtime API on stdin/stdout")
    p.add_argument("--backend", default="llama")
    p.add_argument("--prefix-name", default=os.environ.get("SANDBOX_PREFIX", "llama-sandbox"))
    p.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True, help="sandbox: a core per host")
    p.add_argument("--keep-sandbox-model", action="store_true", help="sandbox: measure the model it serves")
    p.add_argument("--model-embd", type=int, default=768)
    p.add_argument("--model-layers", type=int, default=6)
    p.add_argument("--parallel", type=int, default=1, help="sandbox: slots per instance")
    p.add_argument("--instance-field", action="append", metavar="FIELD=YAML",
                   help="sandbox: set a field of the benchmark's instance (repeatable), e.g. "
                        "'extra_args=[--slot-prompt-similarity, \"0\"]'")  # fmt: skip
    p.add_argument(
        "--affinity",
        action="store_true",
        help="sandbox: deploy the gateway with llama_gateway_affinity: header first (and put it back)",
    )
    p.add_argument("--gateway-var", action="append", metavar="VAR=VALUE",
                   help="sandbox: deploy the gateway with this role variable first (repeatable; put back after), "
                        "e.g. llama_gateway_slot_aware=true llama_gateway_queue_order=fifo")  # fmt: skip
    args = p.parse_args()
    key = args.key_file.read_text().split()[0]

    restore = []
    sandbox = not args.gateway
    try:
        if sandbox:
            hosts, gw = sandbox_hosts(args.prefix_name)
            if not hosts or not gw:
                raise SystemExit(
                    "no sandbox fleet with a gateway runs (scripts/run-sandbox.sh), and no --gateway given"
                )
            ncpu = os.cpu_count() or 1
            if args.pin:
                for i, h in enumerate(hosts):
                    podman("update", "--cpuset-cpus", str(i % ncpu), h)
                restore.append(lambda: [podman("update", "--cpuset-cpus", f"0-{ncpu - 1}", h) for h in hosts])
                print("sandbox: pinned each llama host to its own core: "
                      + ", ".join(f"{h} -> CPU {i % ncpu}" for i, h in enumerate(hosts))
                      + (" (more hosts than cores: some share)" if len(hosts) > ncpu else ""))  # fmt: skip
            if not args.keep_sandbox_model or args.pin:
                inv, model = (bench_inventory(args) if not args.keep_sandbox_model
                              else (REPO / "inventories" / "sandbox", "the sandbox model"))  # fmt: skip
                s = site(inv)
                restore.append(lambda: site(REPO / "inventories" / "sandbox"))
                print(f"sandbox: serving {model} (site.yml on {inv}, {s:.0f} s; the plan sees each host's cores)")
            gateway_vars = (["llama_gateway_affinity=header"] if args.affinity else []) + (args.gateway_var or [])
            if gateway_vars:
                # as JSON, so true is a boolean (key=value would hand the role the string "true")
                pairs = [v.partition("=") for v in gateway_vars]
                extra = [x for k, _, v in pairs for x in ("-e", json.dumps({k: yaml.safe_load(v)}))]
                s = site(inv if not args.keep_sandbox_model else REPO / "inventories" / "sandbox", *extra,
                         gateway=True)  # fmt: skip
                restore.append(lambda: site(REPO / "inventories" / "sandbox", gateway=True))
                print(f"sandbox: gateway deployed with {', '.join(gateway_vars)} ({s:.0f} s)")
            url = f"http://{ip(gw)}:8000"
            instances = [f"http://{ip(h)}:8080" for h in hosts]
            admin = args.admin_cmd or f"podman exec -i {gw} python3 -c {shlex.quote(SOCKET_PY)}"
        else:
            url, instances = args.gateway.rstrip("/"), [u.rstrip("/") for u in (args.instances or "").split(",") if u]
            if not args.admin_cmd:
                raise SystemExit("--admin-cmd is needed with --gateway (the configurations switch through it)")
            admin = args.admin_cmd
        gateway = Gateway(admin, args.backend)
        rows = gateway.servers()
        deployed = gateway.maxconn(rows)
        if not deployed:
            raise SystemExit(f"the gateway has no servers in backend {args.backend}")
        # slot-aware: maxconn = the instance's slots; where the gateway was deployed without maxconn, ask the
        # instance itself (/props total_slots) through the address the gateway uses
        asked = {r["svname"]: total_slots(r.get("addr") or "", key) for r in rows if not deployed[r["svname"]]}
        slot_aware = {k: v or asked.get(k) or 1 for k, v in deployed.items()}
        if asked:
            said = ", ".join(f"{k}: {v or 'no answer, 1'}" for k, v in sorted(asked.items()))
            print(f"note: the gateway runs without maxconn on {sorted(asked)}: slot-aware here means maxconn = "
                  f"the slots each llama-server reports in /props ({said})")  # fmt: skip
        slots = sum(slot_aware.values())
        settings = {"slot-aware": slot_aware, "leastconn": dict.fromkeys(deployed, 0),
                    "affinity": dict.fromkeys(deployed, 0)}  # fmt: skip
        restore.append(lambda: gateway.set_maxconn(deployed))
        has_affinity = bool(gateway.affinity_servers())
        if has_affinity:
            restore.append(lambda: gateway.set_affinity(True))
        configs = [c for c in args.configs.split(",") if c]
        unknown = [c for c in configs if c not in settings]
        if unknown:
            raise SystemExit(f"unknown configuration(s) {unknown}: choose from {sorted(settings)}")
        if "affinity" in configs and not has_affinity:
            raise SystemExit(
                f"the gateway has no backend {args.backend}_affinity: deploy it with "
                "llama_gateway_affinity: header (or user) to measure the affinity configuration"
            )
        levels = [int(x) for x in args.levels.split(",")] if args.levels else sorted({1, slots, 2 * slots, 4 * slots})
        print(f"gateway {url}: {len(deployed)} servers, {slots} slots; levels {levels}; {args.seconds:.0f} s each; "
              f"mix {1 - args.long_share - args.multi_turn:.0%} short ({args.short_tokens} tokens), "
              f"{args.long_share:.0%} long ({args.long_tokens}), {args.multi_turn:.0%} conversations; "
              f"{'streaming' if args.stream else 'not streaming'}")  # fmt: skip

        single = {}
        for u in instances:
            single[u] = run_level(u, key, 1, args, args.seed)
            print(f"single stream, directly on {u}: {single[u]['tok_s']} tokens/s ({single[u]['failed']} failed)")
        single_sum = sum(r["tok_s"] or 0 for r in single.values())

        results = {c: {} for c in configs}
        for n, level in enumerate(levels):
            for cfg in configs if n % 2 == 0 else list(reversed(configs)):
                gateway.set_maxconn(settings[cfg])
                if has_affinity:
                    gateway.set_affinity(cfg == "affinity")
                r = run_level(url, key, level, args, args.seed + level)
                r["ratio"] = round(r["tok_s"] / single_sum, 3) if single_sum and r["tok_s"] else None
                r["same_mix"] = same_mix_ratio(r, list(single.values()))
                results[cfg][str(level)] = r
        print()
        table(results, levels, configs)
        for cfg in configs:
            for level in levels:
                errs = results[cfg][str(level)]["errors"]
                if errs:
                    print(f"errors ({cfg}, {level} clients): {errs}")
        if args.json:
            args.json.write_text(json.dumps({"gateway": url, "slots": slots, "levels": levels, "single": single,
                                             "single_sum_tok_s": single_sum, "results": results,
                                             "settings": vars(args) | {"json": str(args.json),
                                                                       "key_file": str(args.key_file)}},
                                            indent=1, default=str))  # fmt: skip
    finally:
        for undo in reversed(restore):
            try:
                undo()
            except (subprocess.CalledProcessError, SystemExit) as e:
                print(f"could not restore: {e}", file=sys.stderr)
        if sandbox and restore:
            print("sandbox: put back (cores, model, gateway maxconn)")


if __name__ == "__main__":
    main()
