"""Run this collection's modules for real, through ansible-runner and the project venv's ansible.

Shared by the tests/unit/test_*_module.py style tests (imported like nvsmi_profiles). Each call is a
real ansible run on localhost (AnsiballZ packaging, module_utils import by collection path, argument
spec, JSON result) driven by ``ansible_runner.run``: the module's result is the ``res`` of its job
event (``runner_on_ok`` / ``runner_on_failed`` ...), and the run is checked against ``runner.rc`` and
``runner.stats`` - nothing is parsed out of the printed output.

- ``run_adhoc`` / ``run_module``: ``ansible localhost -m llamafleet.mtp.MODULE -a ARGS``.
- ``run_playbook``: a playbook (e.g. one the test wrote) against localhost.
- ``path=`` (both): the PATH the module sees, for tests where PATH decides what it finds. The venv's bin
  directory always comes first (ansible-runner finds ``ansible`` / ``ansible-playbook`` there); it holds
  Python tooling only, none of the host commands the modules look for.

Under a Python without ansible-runner (the managed-host floor run, scripts/unit-oldest-python.sh, where
the test process is Python 3.8 and the modules run on that Python as their host interpreter), the same
``_run`` executes in the project venv's Python: ``python ansible_run.py`` reads the request as JSON on
stdin and prints the outcome as JSON.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The controller under test: the project venv, or another ansible-core's venv (scripts/core-lane.sh sets it).
VENV_BIN = Path(os.environ.get("LLAMAFLEET_ANSIBLE_BIN") or REPO / ".venv" / "bin")
ANSIBLE = VENV_BIN / "ansible"
PLAYBOOK = VENV_BIN / "ansible-playbook"

needs_ansible = pytest.mark.skipif(not ANSIBLE.exists(), reason=f"needs a controller venv ({VENV_BIN}/ansible)")

# job event -> the flag the host result carries for it (as ansible's own json callback reports it)
RESULT_EVENTS = {
    "runner_on_ok": None,
    "runner_on_failed": "failed",
    "runner_on_unreachable": "unreachable",
    "runner_on_skipped": "skipped",
}


def ansible_env(extra_env: dict | None = None, path: str | None = None) -> dict:
    """The variables ansible-runner adds to os.environ for the run."""
    env = {
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_LOCALHOST_WARNING": "0",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0",
        "ANSIBLE_NOCOLOR": "1",
        "LC_ALL": "C.UTF-8",
    }
    env["PATH"] = f"{VENV_BIN}:{path if path is not None else os.environ.get('PATH', os.defpath)}"
    env.update(extra_env or {})
    return env


def _run(request: dict) -> dict:
    """One ansible_runner.run; returns rc, status, stats, the localhost results (in order) and the output."""
    import ansible_runner

    with tempfile.TemporaryDirectory(prefix="ansible-run-") as private_data_dir:
        kwargs = {
            "private_data_dir": private_data_dir,
            "host_cwd": str(REPO),
            "envvars": request["env"],
            "cmdline": shlex.join(request["extra_args"]) if request["extra_args"] else None,
            "quiet": True,
            "suppress_env_files": True,
            "timeout": request.get("timeout", 180),
        }
        if request.get("playbook"):
            kwargs.update(playbook=request["playbook"])
        else:
            kwargs.update(host_pattern="localhost", module=request["module"], module_args=request["module_args"])
        runner = ansible_runner.run(**kwargs)
        results = []
        for e in runner.events:
            if e.get("event") in RESULT_EVENTS and e.get("event_data", {}).get("host") == "localhost":
                res = dict(e["event_data"].get("res") or {})
                # the event type says how the task ended (the res of a failed task has no "failed" key)
                flag = RESULT_EVENTS[e["event"]]
                if flag:
                    res.setdefault(flag, True)
                results.append(res)
        with runner.stdout as f:
            output = f.read()
        return {"rc": runner.rc, "status": runner.status, "stats": runner.stats, "results": results, "output": output}


def _run_somewhere(request: dict) -> dict:
    """``_run`` here when ansible-runner imports, else in the project venv's Python (see the module doc)."""
    try:
        import ansible_runner  # noqa: F401
    except ImportError:
        proc = subprocess.run(
            [str(VENV_BIN / "python"), __file__],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=request.get("timeout", 180) + 60,
            check=False,
        )
        if proc.returncode != 0:
            pytest.fail(f"ansible_run in the venv's Python failed (rc {proc.returncode}):\n{proc.stderr}")
        return json.loads(proc.stdout)
    return _run(request)


def _outcome(request: dict, check_rc: bool) -> tuple[dict, str, dict]:
    out = _run_somewhere(request)
    assert out["results"], f"no result event for localhost (status {out['status']}, rc {out['rc']}):\n{out['output']}"
    result = out["results"][-1]
    stats = out["stats"] or {}
    if check_rc:
        failed = bool(result.get("failed") or result.get("unreachable"))
        assert (out["rc"] != 0) == failed, out["output"]
        assert bool(stats.get("failures", {}).get("localhost") or stats.get("dark", {}).get("localhost")) == failed
    return result, out["output"], stats


def run_adhoc(
    module: str,
    args: str | dict,
    *,
    check_mode: bool = False,
    extra_env: dict | None = None,
    extra_args: list[str] | tuple[str, ...] = (),
    check_rc: bool = True,
    path: str | None = None,
) -> tuple[dict, str]:
    """Run ``ansible localhost -m llamafleet.mtp.MODULE -a ARGS``; return (host result, ansible's output).

    ARGS is passed as is when a string (``k=v`` form), as JSON when a dict. With CHECK_RC the runner's rc
    and stats must agree with the result's ``failed``.
    """
    request = {
        "module": f"llamafleet.mtp.{module}",
        "module_args": args if isinstance(args, str) else json.dumps(args),
        "extra_args": [*extra_args, *(["--check"] if check_mode else [])],
        "env": ansible_env(extra_env, path),
    }
    result, output, _ = _outcome(request, check_rc)
    return result, output


def run_module(module: str, args: str | dict, **kw) -> dict:
    """``run_adhoc`` returning only the host result (same keyword arguments)."""
    return run_adhoc(module, args, **kw)[0]


def run_playbook(
    playbook: str | os.PathLike,
    *,
    extra_env: dict | None = None,
    extra_args: list[str] | tuple[str, ...] = (),
    check_rc: bool = True,
    path: str | None = None,
) -> dict:
    """Run a playbook of one localhost task with ansible-playbook; return that task's host result."""
    request = {
        "playbook": str(Path(playbook).resolve()),
        "extra_args": list(extra_args),
        "env": ansible_env(extra_env, path),
    }
    return _outcome(request, check_rc)[0]


if __name__ == "__main__":
    json.dump(_run(json.load(sys.stdin)), sys.stdout)
