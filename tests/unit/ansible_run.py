"""Run this collection's modules for real through the project venv's ``ansible`` CLI.

Shared by the tests/unit/test_*_module.py style tests (imported like nvsmi_profiles). Each call is a
real ansible ad-hoc run on localhost (AnsiballZ packaging, module_utils import by collection path,
argument spec, JSON result); the result dict comes from the JSON stdout callback.

- ``run_module`` / ``run_adhoc``: inherit os.environ, ansible.builtin.json callback via ansible.cfg.
- ``isolated_env`` / ``posix_json_result``: a minimal environment (a chosen PATH and nothing else
  inherited) and the ansible.posix.json callback, for tests where PATH decides what the module finds.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = REPO / ".venv" / "bin" / "ansible"
PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"

needs_ansible = pytest.mark.skipif(not ANSIBLE.exists(), reason="needs the project venv (.venv/bin/ansible)")


def ansible_env(extra_env: dict | None = None) -> dict:
    """os.environ plus the settings that make ``ansible`` print one JSON document and nothing noisy."""
    return dict(
        os.environ,
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
        ANSIBLE_LOCALHOST_WARNING="0",
        ANSIBLE_INVENTORY_UNPARSED_WARNING="0",
        ANSIBLE_NOCOLOR="1",
        **(extra_env or {}),
    )


def run_adhoc(
    module: str,
    args: str | dict,
    *,
    check_mode: bool = False,
    extra_env: dict | None = None,
    extra_args: list[str] | tuple[str, ...] = (),
    check_rc: bool = True,
) -> tuple[dict, str]:
    """Run ``ansible localhost -m llamafleet.mtp.MODULE -a ARGS``; return (host result, stdout + stderr).

    ARGS is passed as is when a string (``k=v`` form), as JSON when a dict. With CHECK_RC the
    exit status must agree with the result's ``failed``.
    """
    a = args if isinstance(args, str) else json.dumps(args)
    cmd = [str(ANSIBLE), "localhost", "-m", f"llamafleet.mtp.{module}", "-a", a, *extra_args]
    if check_mode:
        cmd.append("--check")
    p = subprocess.run(cmd, cwd=REPO, env=ansible_env(extra_env), capture_output=True, text=True, timeout=180)
    # profile_tasks (enabled in ansible.cfg) prints a timestamp line before the JSON document
    start = p.stdout.find("{\n")
    assert start >= 0, f"no JSON in ansible output (rc {p.returncode}):\n{p.stdout}\n{p.stderr}"
    doc, _ = json.JSONDecoder().raw_decode(p.stdout[start:])
    result = doc["plays"][0]["tasks"][0]["hosts"]["localhost"]
    if check_rc:
        assert (p.returncode != 0) == bool(result.get("failed")), p.stdout
    return result, p.stdout + p.stderr


def run_module(module: str, args: str | dict, **kw) -> dict:
    """``run_adhoc`` returning only the host result (same keyword arguments)."""
    return run_adhoc(module, args, **kw)[0]


def isolated_env(path: str) -> dict:
    """A minimal environment for ``ansible``: PATH, HOME, C.UTF-8 and the ansible.posix.json callback."""
    return {
        "PATH": path,
        "HOME": os.environ.get("HOME", "/root"),
        "LC_ALL": "C.UTF-8",
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
        "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.json",
    }


def posix_json_result(proc: subprocess.CompletedProcess, tool: str = "ansible") -> dict:
    """The first task's localhost result from a run under ``isolated_env``; fail the test if no JSON."""
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        pytest.fail(f"{tool} printed no JSON (rc {proc.returncode}): {proc.stdout}\n{proc.stderr}")
    return report["plays"][0]["tasks"][0]["hosts"]["localhost"]
