"""The llama_server_capabilities module run for real through ``ansible localhost -m ...``.

Missing / non-executable / non-llama binaries need nothing; the rest runs against the two real
CPU builds (slow lane; paths from LLAMA_SERVER_BIN / LLAMA_SERVER_PR_BIN, see test_llama_caps).
"""

from __future__ import annotations

import stat

import pytest
from ansible_collections.llamafleet.mtp.plugins.module_utils import llama_caps as lc
from ansible_run import needs_ansible, run_module
from test_llama_caps import ALL_SPLIT_MODES, MAINLINE_BIN, PR_BIN, needs, subprocess_run

pytestmark = needs_ansible


def run_caps(args: str, **kw) -> dict:
    """llama_server_capabilities, k=v ARGS; the exit status is not cross-checked (as before)."""
    return run_module("llama_server_capabilities", args, check_rc=False, **kw)


def test_module_fails_clearly_on_a_missing_or_wrong_binary(tmp_path):
    r = run_caps(f"binary={tmp_path}/nope/llama-server")
    assert r["failed"] and "does not exist" in r["msg"]
    script = tmp_path / "llama-server"
    script.write_text("#!/bin/sh\necho 'hello from not-llama'\necho second line\n")
    r = run_caps(f"binary={script}")
    assert r["failed"] and "not an executable file" in r["msg"]
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    r = run_caps(f"binary={script}")
    assert r["failed"] and "no 'version: ...'" in r["msg"] and "hello from not-llama" in r["msg"]


@pytest.mark.slow
@needs(MAINLINE_BIN)
@needs(PR_BIN)
def test_module_against_both_real_builds():
    # a stray LLAMA_ARG_SPEC_TYPE on the host would break --help; the module drops LLAMA_ARG_*
    main = run_caps(f"binary={MAINLINE_BIN}", check_mode=True, extra_env={"LLAMA_ARG_SPEC_TYPE": "bogus"})
    pr = run_caps(f"binary={PR_BIN}")
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
    r = run_caps(f"binary={MAINLINE_BIN} confirm=false")
    assert not r.get("failed"), r.get("msg")
    assert r["capabilities"]["confirmed"] is False and r["capabilities"]["mtp_spec_type"] == "draft-mtp"
