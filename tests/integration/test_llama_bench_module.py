"""The llama_bench module against a real CPU llama-server serving generated models (slow lane).

Real: the llama-server binary (LLAMA_SERVER_BIN), the GGUF models (the agree model's MTP head
always agrees with the main model, so acceptance must be exactly 1.0; the plain model drafts
nothing), the module run by ansible.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.gguf import make_models as mm
from tests.integration.test_models_serve import SERVER_BIN, serve

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not SERVER_BIN, reason="LLAMA_SERVER_BIN is unset")]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return mm.write_all_small(tmp_path_factory.mktemp("models"))


def _run_bench(args: dict, timeout: int) -> subprocess.CompletedProcess:
    """``ansible localhost -m llamafleet.mtp.llama_bench -a ARGS -o`` (one-line output)."""
    cmd = [str(Path(sys.executable).parent / "ansible"), "localhost", "-m", "llamafleet.mtp.llama_bench"]
    cmd += ["-a", json.dumps(args), "-o"]
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def _bench(url, **args):
    proc = _run_bench(dict(url=url, n_predict=32, runs=2, **args), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.split("=>", 1)[1])["row"]


def test_agree_model_measures_full_acceptance(models, tmp_path):
    agree = models["tiny-agree"].paths[0]
    with serve(SERVER_BIN, agree, tmp_path, "--spec-type", "draft-mtp", "--spec-draft-n-max", "3") as srv:
        row = _bench(srv.url(""), label="mtp-n3", draft_n_max=3)
    assert row["mtp"] is True and row["runs"] == 2 and row["tokens"] == 64
    assert row["acceptance_source"] == "metrics" and row["acceptance"] == 1.0
    assert row["draft_tokens"] > 0 and row["tok_s_median"] > 0


def test_no_mtp_baseline_drafts_nothing(models, tmp_path):
    with serve(SERVER_BIN, models["tiny-agree"].paths[0], tmp_path) as srv:
        row = _bench(srv.url(""), label="no-mtp")
    assert row["mtp"] is False and row["acceptance"] is None and row["draft_tokens"] == 0


def test_server_without_metrics_is_a_clear_error(models, tmp_path):
    with serve(SERVER_BIN, models["tiny-agree"].paths[0], tmp_path) as srv:
        # a URL where /metrics is missing: the server's 404 for an unknown path prefix
        proc = _run_bench(dict(url=srv.url("/nope"), label="x", warmup=0, runs=1), timeout=120)
    assert proc.returncode != 0 and "answered 404" in proc.stdout
