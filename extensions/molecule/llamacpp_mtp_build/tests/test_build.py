"""Final state after converge (PR stand-in), upgrade (mainline), failed build and rollback.

Real parts: systemd hosts in podman, the real llama.cpp tree from the local mirror (its
refs/pull/22673/head is a stand-in for the pre-merge PR head), a real compile (ccache-backed).
"""

import json

ROOT = "/opt/llama.cpp"


def _info(host, link):
    target = host.file(f"{ROOT}/{link}").linked_to
    return target, json.loads(host.file(f"{target}/build-info.json").content_string)


def test_current_is_pr_build_after_rollback(host):
    target, info = _info(host, "current")
    assert info["ref"] == "pull/22673"
    assert info["capabilities"]["mtp_spec_type"] == "mtp"
    assert target.startswith(f"{ROOT}/builds/{info['commit'][:12]}-")


def test_previous_is_mainline(host):
    _, info = _info(host, "previous")
    assert info["capabilities"]["mtp_spec_type"] == "draft-mtp"
    assert info["cmake_args"].count("-DGGML_NATIVE=OFF") == 1
    assert "-DBUILD_SHARED_LIBS=OFF" in info["cmake_args"]


def test_binary_accepts_its_spelling_and_rejects_the_other(host):
    ok = host.run(f"{ROOT}/current/bin/llama-server --spec-type mtp -h")
    bad = host.run(f"{ROOT}/current/bin/llama-server --spec-type draft-mtp -h")
    assert ok.rc == 0
    assert bad.rc == 1 and "unknown speculative type" in bad.stderr + bad.stdout


def test_binary_is_self_contained(host):
    ldd = host.run(f"ldd {ROOT}/current/bin/llama-server").stdout
    assert "libllama" not in ldd and "libggml" not in ldd


def test_version_carries_build_commit(host):
    _, info = _info(host, "current")
    out = host.run(f"{ROOT}/current/bin/llama-server --version")
    assert f"commit {info['commit'][:9]}" in out.stderr + out.stdout


def test_no_leftover_unpack_dirs(host):
    names = host.check_output(f"ls -A {ROOT}/builds").split()
    assert not [n for n in names if n.startswith(".")]
    assert len(names) == 2
