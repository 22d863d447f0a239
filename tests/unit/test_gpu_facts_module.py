"""The real gpu_facts module, run by the real `ansible` CLI against the nvidia-smi stand-in."""

from __future__ import annotations

import json
import sys

import pytest
from ansible_run import needs_ansible, run_module
from nvsmi_profiles import PROFILES_DIR, STANDIN, facts_from_profile

pytestmark = needs_ansible


def gpu_facts(args: str = "", profile: str | None = None, path: str = "/usr/bin:/bin", check: bool = False) -> dict:
    """Run `ansible localhost -m llamafleet.mtp.gpu_facts -a ARGS` with PATH=PATH; return the host's result."""
    env = {}
    if profile:
        env["NVIDIA_SMI_PROFILE"] = str(PROFILES_DIR / f"{profile}.json") if "/" not in profile else profile
    extra = ["-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}"]
    return run_module("gpu_facts", args, check_mode=check, extra_env=env, extra_args=extra, path=path)


@pytest.mark.parametrize(
    "profile",
    ["uts-2x-v100-pcie32", "cn5900x-2x-rtx3090-nvlink-busy", "noderecord-8x-h200-nvswitch", "lentvm-1x-h200"],
)
def test_module_publishes_the_facts_the_parser_builds(profile):
    result = gpu_facts(f"nvidia_smi={STANDIN}", profile)
    assert not result.get("failed"), result.get("msg")
    assert result["changed"] is False
    facts = result["ansible_facts"]["gpu_facts"]
    assert facts == facts_from_profile(PROFILES_DIR / f"{profile}.json")
    assert facts["source"] == "nvidia-smi" and facts["count"] == len(
        json.loads((PROFILES_DIR / f"{profile}.json").read_text())["gpus"]
    )


def test_module_finds_nvidia_smi_on_path_and_runs_in_check_mode():
    result = gpu_facts("", "cn5900x-2x-rtx3090-nvlink-busy", path=f"{STANDIN.parent}:/usr/bin:/bin", check=True)
    facts = result["ansible_facts"]["gpu_facts"]
    assert [g["memory_used_mib"] for g in facts["gpus"]] == [22943, 22943]
    assert facts["topology"] == {"matrix": [["X", "NV4"], ["NV4", "X"]], "nvlink_groups": [[0, 1]]}
    assert facts["cuda_driver_version"] == "12.6"


def test_no_nvidia_smi_means_no_gpus():
    result = gpu_facts("")
    assert not result.get("failed") and result["changed"] is False
    assert result["ansible_facts"]["gpu_facts"] == {
        "count": 0,
        "driver_version": None,
        "cuda_driver_version": None,
        "source": "none",
        "gpus": [],
        "topology": {"matrix": [], "nvlink_groups": []},
    }
    failed = gpu_facts("required=true")
    assert failed["failed"] and "nvidia-smi is not on PATH" in failed["msg"]


def test_explicit_path_that_does_not_exist_fails():
    result = gpu_facts("nvidia_smi=/nonexistent/nvidia-smi")
    assert result["failed"] and "/nonexistent/nvidia-smi is not an executable file" in result["msg"]


def test_no_devices(tmp_path):
    profile = tmp_path / "none.json"
    profile.write_text(json.dumps({"failure": "no-devices", "gpus": [], "driver_version": "535.104.05"}))
    result = gpu_facts(f"nvidia_smi={STANDIN}", str(profile))
    assert result["ansible_facts"]["gpu_facts"]["count"] == 0
    assert result["ansible_facts"]["gpu_facts"]["source"] == "none"
    required = gpu_facts(f"nvidia_smi={STANDIN} required=true", str(profile))
    assert required["failed"] and "No devices were found" in required["msg"]


def variant(tmp_path, name: str, **changes) -> str:
    profile = json.loads((PROFILES_DIR / f"{name}.json").read_text())
    profile.update(changes)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(profile))
    return str(path)


def test_nvml_failure_fails_with_nvidia_smi_words(tmp_path):
    result = gpu_facts(f"nvidia_smi={STANDIN}", variant(tmp_path, "uts-2x-v100-pcie32", failure="nvml"))
    assert result["failed"]
    assert "Failed to initialize NVML: Driver/library version mismatch" in result["msg"]
    assert "ansible_facts" not in result or "gpu_facts" not in result.get("ansible_facts", {})


def test_gpu_error_gives_facts_and_fails_only_when_asked(tmp_path):
    profile = variant(tmp_path, "jtkj003-8x-a100-sxm4-nvswitch", failure="gpu-error:6")
    result = gpu_facts(f"nvidia_smi={STANDIN}", profile)
    assert not result.get("failed"), result.get("msg")
    facts = result["ansible_facts"]["gpu_facts"]
    assert [g["index"] for g in facts["gpus"] if not g["healthy"]] == [6]
    assert facts["gpus"][6]["error"] == "memory.used: [Unknown Error]; memory.free: [Unknown Error]"
    assert any("GPU 6 (00000000:B7:00.0) is not healthy" in w for w in result.get("warnings", []))
    assert gpu_facts(f"nvidia_smi={STANDIN} require_healthy=any", profile).get("failed") is not True
    result = gpu_facts(f"nvidia_smi={STANDIN} require_healthy=all", profile)
    assert result["failed"]
    assert "GPU 6 (00000000:B7:00.0): memory.used: [Unknown Error]" in result["msg"]
    sick = [g["index"] for g in result["gpu_facts"]["gpus"] if not g["healthy"]]
    assert sick == [6]


@pytest.mark.parametrize("failure", ["gpu-unknown:3", "gpu-reset:3", "gpu-na:3", "gpu-lost:3"])
def test_dead_gpu_among_eight_through_the_module(tmp_path, failure):
    result = gpu_facts(f"nvidia_smi={STANDIN}", variant(tmp_path, "seed-8x-v100-sxm2-cubemesh", failure=failure))
    assert not result.get("failed"), result.get("msg")
    facts = result["ansible_facts"]["gpu_facts"]
    assert facts["count"] == 8
    assert [g["healthy"] for g in facts["gpus"]] == [True] * 3 + [False] + [True] * 4


def test_nonutf8_byte_in_nvidia_smi_output(tmp_path):
    """A non-UTF-8 byte (Latin-1 output) must not replace the result with Ansible's UTF-8 error."""
    profile = json.loads((PROFILES_DIR / "seed-2x-v100-pcie16.json").read_text())
    profile["gpus"][0]["name"] = "Tesla V100-PCIE-16GB \u00e9dition"
    profile.update(output_encoding="latin-1", crlf=True)
    path = tmp_path / "latin1.json"
    path.write_text(json.dumps(profile))
    result = gpu_facts(f"nvidia_smi={STANDIN}", str(path))
    assert not result.get("failed"), result.get("msg")
    assert result["ansible_facts"]["gpu_facts"]["gpus"][0]["name"] == "Tesla V100-PCIE-16GB \ufffddition"
    # a failure's message and output are clean too
    profile["failure"] = "gpu-error:0"
    path.write_text(json.dumps(profile))
    failed = gpu_facts(f"nvidia_smi={STANDIN} require_healthy=all", str(path))
    assert failed["failed"] and "\n" not in failed["msg"]
    assert "\ufffd" in failed["nvidia_smi_output"]


def test_llama_host_state_reads_the_same_gpu_facts_in_one_call(tmp_path):
    """The facts stage's one round trip: llama_host_state with gpu_facts publishes what gpu_facts publishes."""
    profile = "noderecord-8x-h200-nvswitch"
    env = {"NVIDIA_SMI_PROFILE": str(PROFILES_DIR / f"{profile}.json")}
    extra = ["-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}"]
    args = {
        "install_root": str(tmp_path / "opt"),
        "config_dir": str(tmp_path / "etc"),
        "applied_path": str(tmp_path / "applied.json"),
        "gpu_facts": {"nvidia_smi": str(STANDIN), "require_healthy": "any"},
    }
    result = run_module("llama_host_state", args, extra_env=env, extra_args=extra)
    facts = result["ansible_facts"]
    assert facts["gpu_facts"] == facts_from_profile(PROFILES_DIR / f"{profile}.json")
    assert facts["llama_host_state"]["build"] is None and facts["llama_host_state"]["instances"] == {}

    failed = run_module(
        "llama_host_state", {**args, "gpu_facts": {"required": True}}, extra_args=extra, path="/usr/bin:/bin"
    )
    assert failed["failed"] and "nvidia-smi is not on PATH" in failed["msg"]
    assert "llama_host_state" not in (failed.get("ansible_facts") or {})
