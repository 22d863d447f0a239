"""The llama_server_capabilities module run for real through ``ansible localhost -m ...``.

Missing / non-executable / non-llama binaries need nothing; the rest runs against the two real
CPU builds (slow lane; paths from LLAMA_SERVER_BIN / LLAMA_SERVER_PR_BIN, see test_llama_caps).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest
from ansible_collections.llamafleet.mtp.plugins.module_utils import llama_caps as lc
from test_llama_caps import ALL_SPLIT_MODES, MAINLINE_BIN, PR_BIN, REPO, needs, subprocess_run

ANSIBLE = REPO / ".venv" / "bin" / "ansible"
pytestmark = pytest.mark.skipif(not ANSIBLE.exists(), reason="needs the project venv (.venv/bin/ansible)")


def run_module(args: str, check: bool = False, extra_env: dict | None = None) -> dict:
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
        ANSIBLE_LOCALHOST_WARNING="0",
        ANSIBLE_INVENTORY_UNPARSED_WARNING="0",
        ANSIBLE_NOCOLOR="1",
        **(extra_env or {}),
    )
    cmd = [str(ANSIBLE), "localhost", "-m", "llamafleet.mtp.llama_server_capabilities", "-a", args]
    p = subprocess.run(
        cmd + (["--check"] if check else []), cwd=REPO, env=env, capture_output=True, text=True, timeout=180
    )
    start = p.stdout.find("{\n")
    assert start >= 0, f"no JSON in ansible output (rc {p.returncode}):\n{p.stdout}\n{p.stderr}"
    doc, _ = json.JSONDecoder().raw_decode(p.stdout[start:])
    return doc["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_module_fails_clearly_on_a_missing_or_wrong_binary(tmp_path):
    r = run_module(f"binary={tmp_path}/nope/llama-server")
    assert r["failed"] and "does not exist" in r["msg"]
    script = tmp_path / "llama-server"
    script.write_text("#!/bin/sh\necho 'hello from not-llama'\necho second line\n")
    r = run_module(f"binary={script}")
    assert r["failed"] and "not an executable file" in r["msg"]
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    r = run_module(f"binary={script}")
    assert r["failed"] and "no 'version: ...'" in r["msg"] and "hello from not-llama" in r["msg"]


@pytest.mark.slow
@needs(MAINLINE_BIN)
@needs(PR_BIN)
def test_module_against_both_real_builds():
    # a stray LLAMA_ARG_SPEC_TYPE on the host would break --help; the module drops LLAMA_ARG_*
    main = run_module(f"binary={MAINLINE_BIN}", check=True, extra_env={"LLAMA_ARG_SPEC_TYPE": "bogus"})
    pr = run_module(f"binary={PR_BIN}")
    for r in (main, pr):
        assert not r.get("failed"), r.get("msg")
        assert r["changed"] is False and r["capabilities"]["confirmed"] is True
        assert r["capabilities"]["split_modes"] == ALL_SPLIT_MODES
    assert main["capabilities"]["mtp_spec_type"] == "draft-mtp"
    assert pr["capabilities"]["mtp_spec_type"] == "mtp"
    assert main["capabilities"] == lc.probe(subprocess_run, str(MAINLINE_BIN))
    assert main["capabilities"]["commit"] != pr["capabilities"]["commit"]


@pytest.mark.slow
@needs(MAINLINE_BIN)
def test_module_without_confirmation():
    r = run_module(f"binary={MAINLINE_BIN} confirm=false")
    assert not r.get("failed"), r.get("msg")
    assert r["capabilities"]["confirmed"] is False and r["capabilities"]["mtp_spec_type"] == "draft-mtp"
