"""gpu_facts -> gguf_info -> tensor_split chained by a real ansible-playbook run on localhost.

Stand-ins: the GPUs (tests/stand-ins/nvidia-smi replaying the 2x V100 16 GB profile built from
real captures) and the 16.5 GB Qwen3.6-27B MTP GGUF (a header-faithful sparse file from
tests/harness/gguf/qwen36_27b_header.py). Everything else is real: the modules, the parsers,
the GGUF reader and the planner.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "stand-ins" / "nvidia-smi"
PROFILES = REPO / "tests" / "fixtures" / "nvidia-smi" / "profiles"


@pytest.fixture(scope="module")
def qwen_header(tmp_path_factory):
    out = tmp_path_factory.mktemp("qwen") / "Qwen3.6-27B-Q4_K_M-mtp.gguf"
    subprocess.run([sys.executable, str(REPO / "tests/harness/gguf/qwen36_27b_header.py"), str(out)], check=True)
    return out


def _run_chain(tmp_path, profile, model):
    out = tmp_path / "chain.json"
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        NVIDIA_SMI_PROFILE=str(PROFILES / profile),
        CHAIN_NVIDIA_SMI=str(STANDIN),
        CHAIN_MODEL=str(model),
        CHAIN_OUT=str(out),
    )
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "tests/playbooks/chain.yml"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc, out


def test_chain_plans_two_v100_16gb(tmp_path, qwen_header):
    proc, out = _run_chain(tmp_path, "seed-2x-v100-pcie16.json", qwen_header)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["gpu_facts"]["count"] == 2
    assert data["gguf"]["architecture"] == "qwen35" and data["gguf"]["mtp"] is True
    plan = data["plan"]
    assert plan["fits"] is True
    (inst,) = plan["instances"]
    assert inst["devices"] == [0, 1]
    assert inst["split_mode"] == "layer"
    a, b = inst["tensor_split"]
    # Near 50,50 on two equal cards, shifted toward GPU0: the last GPU also holds the output
    # tensor, the MTP block with its own KV cache and the MTP context's compute buffer.
    assert 0.5 <= a / (a + b) <= 0.65


def test_chain_refuses_one_v100_16gb_before_any_change(tmp_path, qwen_header):
    proc, out = _run_chain(tmp_path, "seed-1x-v100-pcie16.json", qwen_header)
    assert proc.returncode != 0
    assert not out.exists()
    assert "MiB" in proc.stdout  # the refusal carries the numbers
