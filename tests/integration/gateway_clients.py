"""Clients of the fleet's one OpenAI endpoint (role llama_gateway), for the fleet tests and
scripts/gateway_latency.py: the real openai client on the controller, plain and streaming.

Every request is recorded as ``[t_start, t_end, ok, error]``; the client never retries
(``max_retries=0``), so a failure the gateway lets through is counted, not hidden.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

CACHE = Path(os.environ.get("LLAMA_MTP_CACHE", "/var/cache/llama-mtp-fleet"))
# The sandbox inventory generates its API key here (ansible.builtin.password lookup, mode 0600).
API_KEY_FILE = CACHE / "sandbox-api-key"
GATEWAY_PORT = 8000
METRICS_PORT = 8404


def api_key():
    return API_KEY_FILE.read_text().split()[0]


def container_ip(name):
    out = subprocess.run(
        ["podman", "inspect", name, "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def base_url(container, port=GATEWAY_PORT):
    return f"http://{container_ip(container)}:{port}/v1"


def client(url, key=None, timeout=30):
    import openai

    return openai.OpenAI(base_url=url, api_key=key or api_key(), timeout=timeout, max_retries=0)


def chat(c, max_tokens=4):
    """One short plain chat completion; True when it returned tokens."""
    r = c.chat.completions.create(
        model="sandbox", messages=[{"role": "user", "content": "Hi"}], max_tokens=max_tokens, temperature=0
    )
    return bool(r.choices) and r.usage.completion_tokens > 0


def chat_stream(c, max_tokens=8):
    """One streaming chat completion read to its end; True when it streamed content and finished."""
    got, finished = 0, False
    for chunk in c.chat.completions.create(
        model="sandbox",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
    ):
        for ch in chunk.choices:
            got += bool(ch.delta and ch.delta.content)
            finished = finished or ch.finish_reason is not None
    return got > 0 and finished


class GatewayLoops:
    """Request loops through the gateway on the controller: one plain, one streaming (threads)."""

    def __init__(self, url, key=None, pause=1.0, deadline_s=900):
        self.url, self.key, self.pause = url, key or api_key(), pause
        self.results = {"plain": [], "stream": []}
        self._stop = threading.Event()
        self._t_end = time.time() + deadline_s
        self._threads = [
            threading.Thread(target=self._loop, args=(kind, fn), daemon=True)
            for kind, fn in (("plain", chat), ("stream", chat_stream))
        ]
        for t in self._threads:
            t.start()

    def _loop(self, kind, fn):
        c = client(self.url, self.key)
        while not self._stop.is_set() and time.time() < self._t_end:
            t0 = time.time()
            try:
                ok, err = fn(c), ""
            except Exception as e:  # noqa: BLE001 - every failure is a data point
                ok, err = False, f"{type(e).__name__}: {e}"[:200]
            self.results[kind].append([t0, time.time(), ok, err])
            time.sleep(self.pause)

    def stop(self):
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)
        return self.results


def failures(results):
    """{kind: number of failed requests}."""
    return {k: sum(1 for r in rows if not r[2]) for k, rows in results.items()}


def gateway_stat(container, server=None):
    """Rows of HAProxy's 'show stat' (runtime API socket on the gateway), optionally one server's."""
    code = (
        "import socket,sys\n"
        "s=socket.socket(socket.AF_UNIX); s.connect('/run/haproxy/admin.sock'); s.sendall(b'show stat\\n'); b=b''\n"
        "while True:\n d=s.recv(65536)\n if not d: break\n b+=d\n"
        "sys.stdout.write(b.decode())\n"
    )
    out = subprocess.run(["podman", "exec", container, "python3", "-c", code], capture_output=True, text=True).stdout
    lines = out.lstrip("# ").splitlines()
    head = lines[0].split(",") if lines else []
    rows = [dict(zip(head, line.split(","), strict=False)) for line in lines[1:] if line]
    return [r for r in rows if server is None or r.get("svname") == server]
