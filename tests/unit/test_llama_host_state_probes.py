"""llama_host_state's probes that run on every host of every run: an instance's /health, python3-apt, and whether
an instance's process runs what its environment file says.

The health probe talks to a real HTTP server on localhost (http.server in a thread); the python3-apt probe
is compared with a real `import apt` in a fresh interpreter.
"""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("ansible")

from ansible_collections.llamafleet.mtp.plugins.modules.llama_host_state import (  # noqa: E402
    _health,
    _live,
    _python_apt,
    _runs_env_file,
)

METRICS = (Path(__file__).parents[1] / "fixtures" / "llama-server" / "mainline-0c1e570.metrics.txt").read_bytes()
KEY = "sk-live-test"


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802  # http.server's name
        path = self.path.split("?")[0]
        code = {"/health": 200, "/busy": 503}.get(path, 404)
        body = b'{"status":"ok"}' if code == 200 else b'{"error":"loading model"}'
        if path == "/metrics":  # as llama-server answers with --api-key: 401 without the key
            ok = self.headers.get("Authorization") == f"Bearer {KEY}"
            code, body = (200, METRICS) if ok else (401, b'{"error":{"code":401,"message":"Invalid API Key"}}')
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_live_reads_health_and_metrics_with_the_key_file_on_the_host(server, tmp_path):
    inst = {"name": "main", "url": "http://advertised.example:1", "health_url": server + "/health"}
    (tmp_path / "main.key").write_text(KEY + "\n")
    live = _live(inst, str(tmp_path), 3)
    assert live["health"] == 200 and live["error"] is None and live["url"] == "http://advertised.example:1"
    assert live["metrics"]["llamacpp:tokens_predicted_total"] == 144
    assert live["metrics"]['llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"}'] == 45
    (tmp_path / "main.key").write_text("wrong\n")
    live = _live(inst, str(tmp_path), 3)
    assert live["metrics"] is None and live["error"] == "/metrics answered 401"
    down = _live({"name": "main", "health_url": f"http://127.0.0.1:{_closed_port()}/health"}, str(tmp_path), 1)
    assert isinstance(down["health"], str) and down["metrics"] is None and "refused" in down["error"].lower()
    assert _live({"name": "x"}, str(tmp_path), 1)["error"] == "no url recorded"


def test_health_is_the_status_code(server):
    assert _health(f"{server}/health", 2) == 200
    assert _health(f"{server}/health?x=1", 2) == 200
    assert _health(f"{server}/busy", 2) == 503  # llama-server while it loads the model
    assert _health(f"{server}/nothing", 2) == 404


def test_health_of_an_instance_that_does_not_answer_is_a_short_reason():
    code = _health(f"http://127.0.0.1:{_closed_port()}/health", 2)
    assert isinstance(code, str) and code and "\n" not in code and len(code) <= 120
    assert code != 200


def test_health_over_https_to_a_plain_http_server_fails_without_raising(server):
    code = _health(server.replace("http://", "https://") + "/health", 2)
    assert isinstance(code, str) and code


def test_python_apt_says_whether_import_apt_works():
    imports = subprocess.run([sys.executable, "-c", "import apt"], capture_output=True, check=False).returncode == 0
    assert _python_apt() is imports


def test_a_process_runs_its_environment_file_or_not(tmp_path):
    """A real process (sleep, started as systemd starts llama-server: the binary's path, then the words of
    LLAMA_SERVER_ARGS): the same words match; other words, or a binary path that names another file now
    (a switched build link), do not."""
    link = tmp_path / "current"
    link.symlink_to("/bin")
    proc = subprocess.Popen([str(link / "sleep"), "30"])
    env = tmp_path / "main.env"
    try:
        env.write_text("# comment\nLLAMA_SERVER_ARGS=30\nCUDA_DEVICE_ORDER=PCI_BUS_ID\n")
        # Popen returns once forked; on a busy machine (and from a multi-threaded pytest, Python 3.13 warns) the
        # exec comes later: until then /proc shows the parent's command line, or none.
        deadline, seen = time.monotonic() + 20, None
        while time.monotonic() < deadline:
            seen = _runs_env_file(proc.pid, str(env))
            if seen is True:
                break
            time.sleep(0.05)
        assert seen is True, (seen, proc.poll(), _proc_exe(proc.pid), Path(f"/proc/{proc.pid}/cmdline").read_bytes())
        env.write_text("LLAMA_SERVER_ARGS=31\n")
        assert _runs_env_file(proc.pid, str(env)) is False
        env.write_text("LLAMA_SERVER_ARGS=30\n")
        link.unlink()
        (tmp_path / "other").mkdir()
        (tmp_path / "other" / "sleep").write_bytes(Path("/bin/sleep").read_bytes())
        link.symlink_to(tmp_path / "other")
        assert _runs_env_file(proc.pid, str(env)) is False  # the link names another binary now
        assert _runs_env_file(proc.pid, str(tmp_path / "missing.env")) is None
    finally:
        proc.kill()
        proc.wait()
    assert _runs_env_file(proc.pid, str(env)) is None  # no such process


def _proc_exe(pid):
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None
