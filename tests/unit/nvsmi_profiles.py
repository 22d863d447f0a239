"""Load nvidia-smi stand-in profiles through the real parser.

``facts_from_profile(path)`` runs tests/stand-ins/nvidia-smi as a subprocess (the stand-in for GPU
hardware) for every command line gpu_facts runs, and feeds its text output through
plugins/module_utils/nvidia_smi.collect, the same code the module runs. Planner tests use it
to get gpu_facts for the profiles in tests/fixtures/nvidia-smi/profiles/.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ansible_collections.llamafleet.mtp.plugins.module_utils import nvidia_smi

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "stand-ins" / "nvidia-smi"
PROFILES_DIR = REPO / "tests" / "fixtures" / "nvidia-smi" / "profiles"


def profile_path(name: str) -> Path:
    """``profile_path("uts-2x-v100-pcie32")`` -> its JSON file (must exist)."""
    path = PROFILES_DIR / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"no nvidia-smi profile {name!r} in {PROFILES_DIR}")
    return path


def profile_names() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.json"))


def standin_runner(profile: str | os.PathLike, raw: bool = False):
    """A ``run(argv) -> (rc, stdout, stderr)`` that executes argv with NVIDIA_SMI_PROFILE set.

    ``raw=True`` returns the bytes as the process wrote them (the module reads bytes too);
    otherwise text, decoded as UTF-8 with replacement."""
    env = dict(os.environ, NVIDIA_SMI_PROFILE=str(profile), LC_ALL="C")

    def run(argv: list[str]):
        proc = subprocess.run(argv, env=env, capture_output=True, timeout=30, check=False)
        if raw:
            return proc.returncode, proc.stdout, proc.stderr
        return proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")

    return run


def facts_from_profile(path: str | os.PathLike, require_healthy: str = "none") -> dict:
    """gpu_facts for a profile, as the module would publish them (no devices -> count 0)."""
    try:
        return nvidia_smi.collect(standin_runner(path, raw=True), str(STANDIN), require_healthy)
    except nvidia_smi.NoDevicesError:
        return nvidia_smi.empty_facts()
