"""No warning the user did not cause: the controller under test (the project venv's ansible-core, or a
scripts/core-lane.sh venv through LLAMAFLEET_ANSIBLE_BIN) prints no ``[WARNING]``, ``[DEPRECATION WARNING]`` or
Python ``...Warning:`` line for site.yml's syntax check, for every playbook the collection ships, and for a run of a
module that takes secrets (host_files, on module_utils/secret_module: the ``remove_values`` deprecation of
ansible-core 2.22 came from there) and of one that reads the host (gpu_facts on the nvidia-smi stand-in).

What is printed is what is tested here, so the commands run as a user runs them (the ansible CLI, the checkout's
ansible.cfg, Python's default warning filters), with every line on stdout and stderr read. The check is bound to
what it claims: it fails when the commands print nothing at all (a run that never reached ansible), and a
deliberately warning command is caught by the same pattern.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
from ansible_run import REPO, VENV_BIN, needs_ansible

WARNING = re.compile(r"\[(DEPRECATION )?WARNING\]|\b\w*Warning:")
PLAYBOOKS = sorted(p.name for p in (REPO / "playbooks").glob("*.yml"))


def _cli(*args: str, cwd=REPO, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "PYTHONWARNINGS"))
    }  # as a user's shell has it
    env.update(
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        PATH=f"{VENV_BIN}:{os.environ.get('PATH', os.defpath)}",
        # the facts a module returns go to the tests' own cache (conftest.py), never the checkout's (ansible.cfg)
        ANSIBLE_CACHE_PLUGIN_CONNECTION=os.environ["ANSIBLE_CACHE_PLUGIN_CONNECTION"],
        **(env_extra or {}),
    )
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _warnings(proc: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in (proc.stdout + proc.stderr).splitlines() if WARNING.search(ln)]


@needs_ansible
def test_the_pattern_catches_a_warning():
    """A warning ansible itself prints (an unknown inventory file) is found by the same pattern."""
    proc = _cli(str(VENV_BIN / "ansible-playbook"), "-i", "/nonexistent-inventory", "--syntax-check", "site.yml")
    assert _warnings(proc), proc.stdout + proc.stderr


@needs_ansible
def test_site_and_every_playbook_syntax_check_without_warnings():
    for pb in ["site.yml", *(f"playbooks/{p}" for p in PLAYBOOKS)]:
        proc = _cli(str(VENV_BIN / "ansible-playbook"), "--syntax-check", pb)
        assert proc.returncode == 0, (pb, proc.stdout[-2000:], proc.stderr[-2000:])
        assert "playbook:" in proc.stdout, (pb, proc.stdout)  # it reached ansible's own output
        assert not _warnings(proc), (pb, _warnings(proc))


@needs_ansible
def test_modules_run_without_warnings(tmp_path):
    inv = tmp_path / "hosts.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}"}
    inv.write_text(json.dumps({"all": {"hosts": {"localhost": local}}}))
    key = tmp_path / "keys" / "k.lst"
    host_files = {
        "directories": [{"path": str(key.parent), "mode": "0700"}],
        "private_files": [{"path": str(key), "content": "sk-secret-value\n"}],
    }
    profile = REPO / "tests" / "fixtures" / "nvidia-smi" / "profiles" / "seed-2x-v100-pcie16.json"
    runs = [
        ("host_files", json.dumps(host_files), {}),
        (
            "gpu_facts",
            json.dumps({"nvidia_smi": str(REPO / "tests" / "stand-ins" / "nvidia-smi")}),
            {"NVIDIA_SMI_PROFILE": str(profile)},
        ),
    ]
    for module, args, env in runs:
        proc = _cli(str(VENV_BIN / "ansible"), "-i", str(inv), "localhost", "-m", f"llamafleet.mtp.{module}",
                    "-a", args, env_extra=env)  # fmt: skip
        assert proc.returncode == 0, (module, proc.stdout[-3000:], proc.stderr[-3000:])
        assert "localhost | " in proc.stdout, (module, proc.stdout)
        assert not _warnings(proc), (module, _warnings(proc))
    assert key.read_text() == "sk-secret-value\n"


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
