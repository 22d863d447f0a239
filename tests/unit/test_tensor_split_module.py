"""The tensor_split module run for real through ``ansible localhost -m llamafleet.mtp.tensor_split``.

Arguments are the real pipeline's output: gpu_facts from the nvidia-smi stand-in profile through
the parser, gguf_info from the Qwen3.6-27B header generator through the header reader. Each case is
a real ad-hoc run (AnsiballZ packaging, module_utils import by collection path, argument spec, JSON).
"""

from __future__ import annotations

import re

import pytest
from ansible_collections.llamafleet.mtp.plugins.module_utils import gguf_header
from ansible_run import needs_ansible, run_module
from nvsmi_profiles import facts_from_profile, profile_path

from tests.harness.gguf import qwen36_27b_header as qwen

pytestmark = needs_ansible


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    out = tmp_path_factory.mktemp("mod") / "Qwen3.6-27B-Q4_K_M-mtp.gguf"
    qwen.write_qwen36_27b_header(out)
    return {
        "gguf": gguf_header.gguf_info(out),
        "gpu_facts": facts_from_profile(profile_path("seed-2x-v100-pcie16")),
    }


def test_module_plans_a_fitting_split(inputs):
    result = run_module(
        "tensor_split", {**inputs, "context": 262144, "cache_type_k": "q4_0", "cache_type_v": "q4_0"}, check_mode=True
    )
    assert result.get("failed") is not True, result
    assert result["changed"] is False
    plan = result["plan"]
    assert plan["fits"] is True
    inst = plan["instances"][0]
    assert inst["cuda_visible_devices"] == "0,1" and inst["split_mode"] == "layer"
    assert inst["tensor_split_arg"] == ",".join(str(t) for t in inst["tensor_split"])
    assert [d["fits"] for d in inst["per_device"]] == [True, True]
    assert plan["explanation"]


def test_module_refuses_with_numbers(inputs):
    result = run_module("tensor_split", {**inputs, "context": 262144})
    assert result["failed"] is True
    assert "does not fit" in result["msg"] and "16384 MiB free" in result["msg"]
    err = result["plan_error"]
    assert [n["available_mib"] for n in err["needed_vs_available"]] == [16384, 16384]
    assert "q4_0" in err["suggestions"]["cache_types"]
    assert err["suggestions"]["max_context"] % 256 == 0
    # what was counted per GPU, in the result and in the message
    for n in err["needed_vs_available"]:
        assert sum(n["counted_mib"].values()) == n["needed_mib"]
        assert set(n["counted_mib"]) == {"weights", "kv", "recurrent", "mtp_weights", "mtp_kv", "output", "compute",
                                         "cuda_context", "reserve"}  # fmt: skip
        assert n["compute_terms_mib"]["kq_mask"] > 0
        assert f"needs {n['needed_mib']} MiB (weights {n['counted_mib']['weights']} + KV" in result["msg"]
    assert "q8_0" in [c["cache_type"] for c in err["suggestions"]["checked_cache_types"]]


def test_module_reports_what_it_counted_per_gpu(inputs):
    result = run_module(
        "tensor_split",
        {**inputs, "context": 262144, "cache_type_k": "q4_0", "cache_type_v": "q4_0", "cuda_context_mib": 300},
        check_mode=True,
    )
    plan = result["plan"]
    assert plan["settings"]["cuda_context_mib"] == 300
    for d in plan["instances"][0]["per_device"]:
        assert d["cuda_context_mib"] == 300 and d["compute_terms_mib"]["kv_f16"] == 1024.0
        counted = (
            "weights",
            "kv",
            "recurrent",
            "mtp_weights",
            "mtp_kv",
            "output",
            "compute",
            "cuda_context",
            "reserve",
        )
        assert d["total_mib"] == sum(d[f"{c}_mib"] for c in counted)
    assert any("CUDA context (300 MiB)" in line for line in plan["explanation"])


def test_module_rejects_bad_replicas(inputs):
    result = run_module("tensor_split", {**inputs, "context": 32768, "replicas": "lots"})
    assert result["failed"] is True
    assert "replicas" in result["msg"]


def _site_verdict(inputs, inst, mem_available_bytes):
    """What site.yml's plan stage (fleet_instances.plan_host, as instance_plan runs it) says for one instance."""
    from ansible_collections.llamafleet.mtp.plugins.module_utils import fleet_instances as fi

    (resolved,), problems = fi.resolve([dict({"name": "a", "model": "m", "port": 8080}, **inst)])
    assert not problems
    out = fi.plan_host(
        host="h1",
        instances=[resolved],
        models={"m": {"gguf": inputs["gguf"]}},
        gpu_facts=inputs["cpu_facts"],
        host_state={"mem_available_bytes": mem_available_bytes, "instances": {}},
    )
    return out["problems"]


def _mem_available():
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))


@pytest.mark.parametrize(
    ("inst", "refused_for"),
    [
        # the case, about 268 GB on a CPU host (with rope scaling: above Qwen3.6-27B's training context)
        ({"context": 99_999_744, "rope_scaling": "yarn"}, "host RAM"),
        ({"context": 2 * 262144}, "training context"),  # above its 262144 tokens without rope scaling
        ({"context": 4096}, None),
    ],
)
def test_module_and_site_give_one_verdict_on_a_cpu_host(inputs, inst, refused_for):
    inputs = dict(inputs, cpu_facts={"count": 0, "gpus": []})
    args = {k: v for k, v in inst.items()}
    result = run_module("tensor_split", {"gpu_facts": inputs["cpu_facts"], "gguf": inputs["gguf"], **args})
    site = _site_verdict(inputs, inst, _mem_available())
    if refused_for is None:
        assert result.get("failed") is not True and not site, (result.get("msg"), site)
        assert result["plan"]["mode"] == "cpu" and result["unchecked"] == []
        assert any(c.startswith("host RAM:") for c in result["checked"])
        return
    assert result.get("failed") is True and site, (result, site)
    wanted = "MiB of host RAM" if refused_for == "host RAM" else "above the model's training context"
    assert wanted in result["msg"] and any(wanted in p for p in site)

    # the same message (site.yml's names the host and instance; MemAvailable moves between the two reads)
    def same(text):
        return re.sub(r"\(a |\(the planned instance |\d+ MiB are available.*", "", text.split(": ", 1)[1])

    assert [same(p) for p in result["problems"]] == [same(p) for p in site]


def test_module_says_what_it_did_not_check(inputs):
    args = {
        "gpu_facts": {"count": 0, "gpus": []},
        "gguf": inputs["gguf"],
        "context": 99_999_744,
        "rope_scaling": "yarn",
    }
    result = run_module("tensor_split", dict(args, check_host_memory=False))
    assert result.get("failed") is not True and result["plan"]["fits"] is True
    assert result["unchecked"] == [f"host RAM for the CPU plan ({result['plan']['instances'][0]['host_mib']} MiB): "
                                   "check_host_memory is false"]  # fmt: skip
