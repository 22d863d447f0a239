"""The generated GGUF test models served by a real CPU llama-server (slow lane).

Needs LLAMA_SERVER_BIN: a llama-server binary of the pinned llama.cpp (tests/harness/llamacpp/build.sh
prints its install dir; the binary is <dir>/bin/llama-server). Each test starts its own server on
127.0.0.1 on a free port and always stops it.

Run: LLAMA_SERVER_BIN=/var/cache/llama-mtp-fleet/builds/<sha12>-cpu/bin/llama-server \
     .venv/bin/pytest tests/integration/test_models_serve.py
"""

import contextlib
import json
import os
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.harness.gguf import make_models as mm

SERVER_BIN = os.environ.get("LLAMA_SERVER_BIN", "")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not SERVER_BIN,
        reason="LLAMA_SERVER_BIN is unset: point it at a llama-server binary (tests/harness/llamacpp/build.sh)",
    ),
]

PROMPT = "Hello world"
N_PREDICT = 48
NO_MTP_LAYERS = "context type MTP requested but model doesn't contain MTP layers"


@pytest.fixture(scope="module")
def server_bin() -> str:
    path = Path(SERVER_BIN)
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"LLAMA_SERVER_BIN={SERVER_BIN} is not an executable file")
    return str(path)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return mm.write_all_small(tmp_path_factory.mktemp("models"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_cmd(server_bin, model: Path, port: int, *extra: str) -> list[str]:
    return [
        server_bin,
        *("-m", str(model), "--host", "127.0.0.1", "--port", str(port)),
        *("-c", "512", "-np", "1", "-t", "2", "--no-webui", "--metrics"),
        *extra,
    ]


class Server:
    def __init__(self, port: int, proc: subprocess.Popen, log: Path):
        self.port, self.proc, self.log = port, proc, log

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(
            self.url(path), data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.load(r)

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(self.url("/metrics"), timeout=10) as r:
            text = r.read().decode()
        return {
            m.group(1): float(m.group(2)) for m in re.finditer(r"^llamacpp:(\w+) ([-0-9.e+]+)$", text, re.MULTILINE)
        }

    def complete(self, **overrides) -> dict:
        body = {"prompt": PROMPT, "n_predict": N_PREDICT, "temperature": 0, "top_k": 1, "return_tokens": True}
        body.update(overrides)
        return self.post("/completion", body)


@contextlib.contextmanager
def serve(server_bin, model: Path, tmp_path: Path, *extra: str):
    port = free_port()
    log = tmp_path / f"server-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(server_cmd(server_bin, model, port, *extra), stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llama-server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama-server not healthy after 60 s:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        yield Server(port, proc, log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def expected_tokens(srv: Server, model: mm.ModelFiles) -> list[int]:
    """The greedy continuation the generator built: follow main_map from the last prompt token."""
    prompt = srv.post("/tokenize", {"content": PROMPT})["tokens"]
    tok, out = prompt[-1], []
    for _ in range(N_PREDICT):
        tok = model.main_map[tok]
        out.append(tok)
    return out


def test_plain_model_refuses_draft_mtp(server_bin, models):
    cmd = server_cmd(server_bin, models["tiny-plain"].path, free_port(), "--spec-type", "draft-mtp")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert NO_MTP_LAYERS in proc.stdout + proc.stderr


@pytest.mark.parametrize("name", ["tiny-plain", "tiny-plain-split", "tiny-agree"])
def test_models_serve_their_built_continuation_without_mtp(server_bin, models, tmp_path, name):
    with serve(server_bin, models[name].path, tmp_path) as srv:
        res = srv.complete()
        assert res["tokens"] == expected_tokens(srv, models[name])
        assert res["timings"]["predicted_n"] == N_PREDICT
        assert "draft_n" not in res["timings"]


def test_mtp_model_drafts_with_draft_mtp(server_bin, models, tmp_path):
    with serve(server_bin, models["tiny-mtp"].path, tmp_path, "--spec-type", "draft-mtp") as srv:
        res = srv.complete()
        assert res["tokens"] == expected_tokens(srv, models["tiny-mtp"])  # drafts never change greedy output
        assert res["timings"]["draft_n"] > 0
        assert 0 <= res["timings"]["draft_n_accepted"] <= res["timings"]["draft_n"]


@pytest.mark.parametrize(
    ("name", "n_max"),
    [("tiny-agree", "3"), ("tiny-agree", "1"), ("tiny-agree", "6"), ("tiny-agree-f16", "3"), ("tiny-agree-split", "3")],
)
def test_agree_model_accepts_every_draft(server_bin, models, tmp_path, name, n_max):
    extra = ("--spec-type", "draft-mtp", "--spec-draft-n-max", n_max)
    with serve(server_bin, models[name].path, tmp_path, *extra) as srv:
        res = srv.complete()
        t = res["timings"]
        assert res["tokens"] == expected_tokens(srv, models[name])
        assert t["draft_n"] >= N_PREDICT // (int(n_max) + 1) - 1
        assert t["draft_n_accepted"] == t["draft_n"]
        deadline = time.monotonic() + 10  # the slot's stats reach /metrics when it is released
        while (m := srv.metrics())["spec_decode_num_draft_tokens_total"] != t["draft_n"]:
            assert time.monotonic() < deadline, m
            time.sleep(0.1)
        assert m["spec_decode_num_accepted_tokens_total"] == t["draft_n"]


@pytest.mark.parametrize("n_max", ["1", "3"])
def test_partial_model_accepts_some_drafts(server_bin, models, tmp_path, n_max):
    extra = ("--spec-type", "draft-mtp", "--spec-draft-n-max", n_max)
    with serve(server_bin, models["tiny-partial"].path, tmp_path, *extra) as srv:
        res = srv.complete()
        t = res["timings"]
        assert res["tokens"] == expected_tokens(srv, models["tiny-partial"])
        assert t["draft_n"] > 0
        assert 0.3 < t["draft_n_accepted"] / t["draft_n"] < 0.95
