"""Final state of the llama_gateway scenario: Debian's HAProxy, hardened, in front of two real llama-server
instances on the same host; API keys checked at the gateway; runtime API; Prometheus exporter; file_sd.

Real parts: a systemd host in podman, HAProxy from the Debian mirror, the real CPU llama-server build and a
tiny generated GGUF model (tests/harness/gguf/make_models.py), the real openai client on the controller.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time

import pytest

KEY = "molecule-gateway-key-3d8e61b0"
SERVERS = ("llama-gateway-deb12_a", "llama-gateway-deb12_b")

_HTTP = r"""
import json, sys, urllib.request, urllib.error
a = json.loads(sys.argv[1])
data = json.dumps(a["body"]).encode() if a.get("body") is not None else None
h = dict(a.get("headers") or {}, **({"Content-Type": "application/json"} if data else {}))
req = urllib.request.Request(a["url"], data=data, headers=h, method="POST" if data else "GET")
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    with opener.open(req, timeout=60) as r:
        print(json.dumps({"status": r.status, "body": r.read().decode()}))
except urllib.error.HTTPError as e:
    print(json.dumps({"status": e.code, "body": e.read().decode()}))
"""

_STAT = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect("/run/haproxy/admin.sock"); s.sendall(b"show stat\n"); b = b""
while True:
    d = s.recv(65536)
    if not d: break
    b += d
sys.stdout.write(b.decode())
"""

CHAT = {"model": "tiny-agree", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


def http(host, url, body=None, headers=None):
    arg = {"url": url, "headers": headers, "body": body}
    return json.loads(host.check_output(f"python3 -c {shlex.quote(_HTTP)} {shlex.quote(json.dumps(arg))}"))


def stat(host, backend="llama"):
    lines = host.check_output(f"python3 -c {shlex.quote(_STAT)}").lstrip("# ").splitlines()
    head = lines[0].split(",")
    return {
        r["svname"]: r
        for r in (dict(zip(head, line.split(","), strict=False)) for line in lines[1:])
        if r.get("pxname") == backend
    }


def test_haproxy_from_debian_running_enabled_config_valid(host):
    assert host.package("haproxy").is_installed
    svc = host.service("haproxy")
    assert svc.is_running and svc.is_enabled
    host.run_expect([0], "haproxy -c -q -f /etc/haproxy/haproxy.cfg")
    cfg = host.file("/etc/haproxy/haproxy.cfg").content_string
    assert "balance leastconn" in cfg and "option httpchk GET /health" in cfg and "retry-on conn-failure" in cfg
    assert "timeout server 600s" in cfg


def test_hardening_drop_in_is_in_effect(host):
    show = host.check_output("systemctl show haproxy -p NoNewPrivileges -p ProtectSystem -p ProtectHome -p PrivateTmp")
    assert "NoNewPrivileges=yes" in show and "ProtectSystem=full" in show
    assert "ProtectHome=yes" in show and "PrivateTmp=yes" in show


def test_runtime_socket_root_and_haproxy_only(host):
    sock = host.file("/run/haproxy/admin.sock")
    assert sock.is_socket and sock.mode == 0o660 and sock.group == "haproxy"


def test_keys_root_haproxy_0640_and_never_in_the_config(host):
    for name in ("bearer.lst", "keys.lst"):
        f = host.file(f"/etc/haproxy/llama-keys/{name}")
        assert f.user == "root" and f.group == "haproxy" and f.mode == 0o640
        assert KEY in f.content_string
    assert KEY not in host.file("/etc/haproxy/haproxy.cfg").content_string


def test_both_instances_up_and_back_after_the_drain(host):
    rows = stat(host)
    assert {s: rows[s]["status"] for s in SERVERS} == {s: "UP" for s in SERVERS}


def test_drain_recorded_no_session_left(host):
    record = json.loads(host.file("/root/drain-record.json").content_string)
    assert record == [
        {"server": "llama-gateway-deb12_a", "gateways": ["llama-gateway-deb12"], "timed_out": [], "sessions_left": 0}
    ]


def test_completion_through_the_gateway_with_the_key(host):
    r = http(host, "http://127.0.0.1:8000/v1/chat/completions", CHAT, {"Authorization": f"Bearer {KEY}"})
    assert r["status"] == 200 and json.loads(r["body"])["usage"]["completion_tokens"] > 0
    r = http(host, "http://127.0.0.1:8000/v1/chat/completions", CHAT, {"X-Api-Key": KEY})
    assert r["status"] == 200


@pytest.mark.parametrize("headers", [None, {"Authorization": "Bearer wrong"}, {"X-Api-Key": "wrong"}])
def test_missing_or_bad_key_gets_401_from_the_gateway(host, headers):
    r = http(host, "http://127.0.0.1:8000/v1/chat/completions", CHAT, headers)
    assert r["status"] == 401 and json.loads(r["body"])["error"]["type"] == "authentication_error"


def test_health_is_public(host):
    assert http(host, "http://127.0.0.1:8000/health")["status"] == 200


def test_requests_go_to_both_instances(host):
    before = {s: int(r["stot"]) for s, r in stat(host).items() if s in SERVERS}
    for _ in range(6):
        http(host, "http://127.0.0.1:8000/v1/chat/completions", CHAT, {"Authorization": f"Bearer {KEY}"})
    after = {s: int(r["stot"]) for s, r in stat(host).items() if s in SERVERS}
    assert all(after[s] > before[s] for s in SERVERS), (before, after)


def _sent(host, n, session):
    before = {s: int(r["stot"]) for s, r in stat(host, "llama_affinity").items() if s in SERVERS}
    plain = {s: int(r["stot"]) for s, r in stat(host).items() if s in SERVERS}
    for _ in range(n):
        headers = {"Authorization": f"Bearer {KEY}", **({"X-Session-Id": session} if session else {})}
        assert http(host, "http://127.0.0.1:8000/v1/chat/completions", CHAT, headers)["status"] == 200
    after = {s: int(r["stot"]) for s, r in stat(host, "llama_affinity").items() if s in SERVERS}
    plain_after = {s: int(r["stot"]) for s, r in stat(host).items() if s in SERVERS}
    return {s: after[s] - before[s] for s in SERVERS}, {s: plain_after[s] - plain[s] for s in SERVERS}


def test_a_session_stays_on_one_instance(host):
    """llama_gateway_affinity: header - every request of a conversation goes to the same instance (its prompt
    cache), through the affinity backend; the main backend sees none of them."""
    for session in ("conversation-1", "conversation-2", "conversation-3"):
        affinity, plain = _sent(host, 5, session)
        assert sorted(affinity.values()) == [0, 5], (session, affinity)
        assert sum(plain.values()) == 0, plain


def test_sessions_spread_over_instances(host):
    used = set()
    for i in range(12):
        affinity, _ = _sent(host, 1, f"user-{i}")
        used |= {s for s, n in affinity.items() if n}
    assert used == set(SERVERS)


def test_requests_without_a_session_go_to_the_least_busy(host):
    affinity, plain = _sent(host, 4, None)
    assert sum(affinity.values()) == 0 and sum(plain.values()) == 4, (affinity, plain)


def test_prometheus_exporter_and_file_sd(host):
    prom = http(host, "http://127.0.0.1:8404/metrics")
    assert prom["status"] == 200
    assert 'haproxy_server_status{proxy="llama",server="llama-gateway-deb12_a"' in prom["body"]
    sd = json.loads(host.file("/etc/prometheus/file_sd/llamafleet.json").content_string)
    targets = {t: g["labels"]["job"] for g in sd for t in g["targets"]}
    assert targets == {
        "llama-gateway-deb12:8404": "llama-gateway",
        "127.0.0.1:8081": "llama-server",
        "127.0.0.1:8082": "llama-server",
    }


def test_openai_client_from_the_controller(host):
    openai = pytest.importorskip("openai")
    ip = subprocess.run(
        ["podman", "inspect", host.backend.name, "--format", "{{.NetworkSettings.IPAddress}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    c = openai.OpenAI(base_url=f"http://{ip}:8000/v1", api_key=KEY, timeout=60, max_retries=0)
    chunks = list(c.chat.completions.create(stream=True, **CHAT))
    assert any(ch.choices and ch.choices[0].delta.content for ch in chunks)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"http://{ip}:8000/v1", api_key="wrong", max_retries=0).models.list()


def test_no_key_in_the_journal(host):
    """AnsibleModule logs every module call to the journal ("Invoked with ..."):
    the gateway's API key (its key lists are multi-line files) must never be there."""
    # every field of every entry (export format: the module's options are fields too), searched on the host
    invoked = host.run("journalctl --no-pager -o export | grep -ac 'Invoked with'")
    assert int(invoked.stdout.strip() or 0) > 0  # the modules' calls are there to search
    for secret in (KEY,):
        found = host.run(f"journalctl --no-pager -o export | grep -acF -- {shlex.quote(secret)}")
        assert found.stdout.strip() == "0", f"{secret[:6]}... is in the journal {found.stdout.strip()} times"


_ORDER = r"""
import json, os, signal, socket, subprocess, sys, threading, time, urllib.request

key, held, other = sys.argv[1], sys.argv[2], sys.argv[3]


def admin(cmd):
    s = socket.socket(socket.AF_UNIX); s.connect("/run/haproxy/admin.sock"); s.sendall((cmd + "\n").encode())
    b = b""
    while True:
        d = s.recv(65536)
        if not d:
            return b.decode()
        b += d


def pid(unit):
    return int(subprocess.check_output(["systemctl", "show", "-p", "MainPID", "--value", unit]).strip())


done = []


def ask(label, max_tokens):
    body = {"model": "tiny-agree", "messages": [{"role": "user", "content": "Tell me a story"}],
            "max_tokens": max_tokens, "temperature": 0}
    req = urllib.request.Request("http://127.0.0.1:8000/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json", "Authorization": "Bearer " + key})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=60) as r:
        done.append((label, r.status))


print(admin(f"set server llama/{other} state maint").strip(), file=sys.stderr)
server = pid("llama-server@" + held.rsplit("_", 1)[1] + ".service")
os.kill(server, signal.SIGSTOP)  # the held instance's one slot is taken by the first request, which waits
try:
    threads = []
    for label, n, pause in (("first", 8, 0.3), ("long", 200, 0.2), ("short", 4, 0.2)):
        t = threading.Thread(target=ask, args=(label, n)); t.start(); threads.append(t); time.sleep(pause)
    queued = [line for line in admin("show stat").splitlines() if line.startswith("llama,BACKEND,")]
finally:
    os.kill(server, signal.SIGCONT)
for t in threads:
    t.join()
print(admin(f"set server llama/{other} state ready").strip(), file=sys.stderr)
print(json.dumps({"done": done, "backend_queue": queued[0].split(",")[2] if queued else None}))
"""


def test_short_requests_leave_the_slot_queue_first(host):
    """llama_gateway_slot_aware with the default queue order (short_first): a request waits in HAProxy's queue as
    if it had arrived 10 ms later per token it asks for. With instance b in maintenance and instance a's one slot
    held (its llama-server stopped with SIGSTOP for under a second, so the first request is in flight), a 200-token
    request queued 0.2 s before a 4-token one is served after it; in arrival order (fifo) it would be first. Real
    HAProxy, real llama-server; the stop only holds the slot."""
    out = json.loads(host.check_output(f"python3 -c {shlex.quote(_ORDER)} {KEY} {SERVERS[0]} {SERVERS[1]}"))
    assert out["backend_queue"] == "2", out  # both waited in the backend's queue
    assert out["done"] == [["first", 200], ["short", 200], ["long", 200]], out
    # both back: b left maintenance, and its health checks need a few seconds to settle ("UP 1/2" on the way)
    for _ in range(20):
        rows = stat(host)
        if all(rows[s]["status"] == "UP" for s in SERVERS):
            break
        time.sleep(0.5)
    assert {s: rows[s]["status"] for s in SERVERS} == {s: "UP" for s in SERVERS}
