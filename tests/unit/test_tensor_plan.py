"""Tests for plugins/module_utils/tensor_plan.py (the tensor-split planner).

Inputs come from the real fixture pipeline wherever a fixture exists:

* gpu_facts: nvidia-smi profile -> tests/stand-ins/nvidia-smi (the stand-in for GPU hardware) ->
  plugins/module_utils/nvidia_smi.collect, via ``nvsmi_profiles.facts_from_profile``;
* gguf_info: tests/harness/gguf/qwen36_27b_header.py (header-faithful Qwen3.6-27B Q4_K_M with MTP,
  sparse data) -> plugins/module_utils/gguf_header.gguf_info.

Hand-built dicts are used only for pure-logic cases no capture covers (a mixed-link 4-GPU host).

MEASURED below means: read from the ``-lv 4`` log of a CPU-only llama-server built from T (+ the
PR #22673 stand-in patch, tests/harness/llamacpp) serving the same sparse Qwen3.6-27B header file
with ``--spec-type mtp --no-warmup -fit off``. The KV / recurrent / MTP-KV buffers and the model
buffer do not depend on the backend, so they check the planner's memory model against llama.cpp
itself; CUDA compute buffers could not be measured here (no GPU).
"""

from __future__ import annotations

import copy
import os
import subprocess
from fractions import Fraction
from pathlib import Path

import pytest
from ansible_collections.llamafleet.mtp.plugins.module_utils import gguf_header, nvidia_smi
from ansible_collections.llamafleet.mtp.plugins.module_utils import tensor_plan as tp
from ansible_collections.llamafleet.mtp.plugins.module_utils.tensor_plan import PlanError, plan
from nvsmi_profiles import facts_from_profile, profile_path

MIB = 1024 * 1024
QWEN_WRITER = Path(__file__).resolve().parents[2] / "tests" / "harness" / "gguf" / "qwen36_27b_header.py"


def write_qwen_header(out: Path, mtp: bool = True) -> None:
    """Write the Qwen3.6-27B header stand-in. Its writer needs the gguf package (Python 3.10+): under an
    older Python (the managed-host floor run, scripts/unit-oldest-python.sh) the controller's Python named by
    LLAMAFLEET_GGUF_PYTHON writes the file, and the planner and header reader still run on the old one."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        python = os.environ.get("LLAMAFLEET_GGUF_PYTHON")
        if not python:
            pytest.skip("needs the gguf package or LLAMAFLEET_GGUF_PYTHON")
        cmd = [python, str(QWEN_WRITER), str(out)] + ([] if mtp else ["--no-mtp"])
        subprocess.run(cmd, check=True, capture_output=True, timeout=300)
        return
    from tests.harness.gguf import qwen36_27b_header as qwen

    qwen.write_qwen36_27b_header(out, mtp=mtp)


# ------------------------------------------------------------------------------------------------
# fixtures: the real pipeline


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """gguf_info of the Qwen3.6-27B Q4_K_M + MTP stand-in, read by the real header reader."""
    out = tmp_path_factory.mktemp("qwen") / "Qwen3.6-27B-Q4_K_M-mtp.gguf"
    write_qwen_header(out)
    return gguf_header.gguf_info(out)


@pytest.fixture(scope="module")
def model_no_mtp(tmp_path_factory):
    out = tmp_path_factory.mktemp("qwen-nomtp") / "Qwen3.6-27B-Q4_K_M.gguf"
    write_qwen_header(out, mtp=False)
    return gguf_header.gguf_info(out)


_FACTS = {}


def facts(name):
    """gpu_facts for a profile (the stand-in runs once per profile; callers get a deep copy)."""
    if name not in _FACTS:
        _FACTS[name] = facts_from_profile(profile_path(name))
    return copy.deepcopy(_FACTS[name])


def mixed_24_16():
    """A 24 GB RTX 3090 + a 16 GB V100 in one host.

    No capture of such a host exists, so it is assembled from the parsed facts of two real-pipeline
    profiles (seed-1x-rtx3090, seed-1x-v100-pcie16): the V100 becomes index 1, on the other socket (SYS).
    """
    a = facts("seed-1x-rtx3090")
    b = facts("seed-1x-v100-pcie16")
    v100 = dict(b["gpus"][0], index=1, numa_node=1)
    a["gpus"].append(v100)
    a["count"] = 2
    a["topology"] = {"matrix": [["X", "SYS"], ["SYS", "X"]], "nvlink_groups": []}
    return a


def dev(inst, key):
    return [d[key] for d in inst["per_device"]]


def assert_consistent(inst, model):
    """Invariants every GPU instance must satisfy."""
    for d in inst["per_device"]:
        cats = ("weights", "kv", "recurrent", "mtp_weights", "mtp_kv", "output", "compute", "cuda_context", "reserve")
        assert d["total_mib"] == sum(d[f"{c}_mib"] for c in cats)
        assert cats == tp.COUNTED
        if d["compute_terms_mib"] is not None:  # the compute figure is the sum of its terms, rounded up
            assert abs(sum(d["compute_terms_mib"].values()) - d["compute_mib"]) <= 1
        assert d["free_after_mib"] == d["free_before_mib"] - d["total_mib"] + d["reserve_mib"]
        assert d["fits"] == (d["total_mib"] <= d["free_before_mib"])
    assert inst["required_mib"] == sum(dev(inst, "total_mib"))
    assert inst["available_mib"] == sum(dev(inst, "free_before_mib"))
    assert inst["fits"] == all(dev(inst, "fits"))
    # every block and the output layer land on exactly one device, contiguously, in order
    counts = [lay["count"] for lay in inst["layers"]]
    assert sum(counts) == model["block_count"] + 1
    if inst["tensor_split"]:
        assert inst["tensor_split_arg"] == ",".join(str(t) for t in inst["tensor_split"])
        assignment = tp.simulate_layer_assignment(inst["tensor_split"], model["block_count"])
        assert [assignment.count(i) for i in range(len(inst["devices"]))] == counts
    assert inst["layers"][-1]["holds_output"]
    # weights: all trunk blocks are placed somewhere, the token embedding never on a GPU
    trunk = sum(model["tensor_bytes"]["per_layer"][: model["trunk_layers"]])
    weights = sum(dev(inst, "weights_mib"))
    assert trunk / MIB <= weights <= trunk / MIB + len(inst["devices"])


# ------------------------------------------------------------------------------------------------
# the acceptance table


def test_2x_v100_16gb_262k_q4_0_fits_on_both(model):
    p = plan(facts("seed-2x-v100-pcie16"), model, context=262144, cache_type_k="q4_0", cache_type_v="q4_0")
    assert p["fits"] and len(p["instances"]) == 1
    inst = p["instances"][0]
    assert_consistent(inst, model)
    assert inst["devices"] == [0, 1]
    assert inst["cuda_visible_devices"] == "0,1"
    assert inst["split_mode"] == "layer"
    share = inst["tensor_split"][0] / sum(inst["tensor_split"])
    # near 50/50; GPU 1 also carries the output, the MTP block and its KV, so it gets fewer blocks
    assert 0.5 <= share <= 0.62, inst["tensor_split"]
    assert inst["layers"][1]["holds_mtp"] and not inst["layers"][0]["holds_mtp"]
    assert dev(inst, "mtp_kv_mib") == [0, 1024]  # nextn layer at f16: 4 KiB/token x 262144
    assert sum(dev(inst, "kv_mib")) == 4608  # MEASURED: CPU KV buffer size = 4608.00 MiB
    assert sum(dev(inst, "recurrent_mib")) in (449, 450)  # MEASURED: 448.88 MiB (rows 1 x (1+2))
    assert all(inst["per_device"][i]["fits"] for i in (0, 1))
    assert "-ts" in inst["llama_args"] and "--spec-draft-n-max" in inst["llama_args"]
    assert "--spec-type" not in inst["llama_args"]  # the spelling follows the binary (server role)


def test_1x_3090_100k_q8_0_draft3_single_gpu(model):
    p = plan(facts("seed-1x-rtx3090"), model, context=100000, cache_type_k="q8_0", cache_type_v="q8_0", draft_n_max=3)
    inst = p["instances"][0]
    assert_consistent(inst, model)
    assert inst["devices"] == [0] and inst["split_mode"] == "none"
    assert inst["tensor_split"] is None and inst["tensor_split_arg"] is None
    assert "-ts" not in inst["llama_args"]
    assert p["settings"]["n_ctx"] == 100096  # padded to 256 (llama-context.cpp:290)
    assert p["settings"]["recurrent_rows"] == 4  # 1 slot x (1 + draft_n_max 3)
    d = inst["per_device"][0]
    # q8_0: 16 layers x 4 heads x 2 x (256/32*34) bytes per cell
    assert d["kv_mib"] == -(-16 * 4 * 2 * 272 * 100096 // MIB)
    assert d["recurrent_mib"] == -(-48 * 4 * model["recurrent"]["state_bytes_per_layer"] // MIB)


def test_1x_4090_32k_f16_fits(model):
    p = plan(facts("seed-1x-rtx4090"), model, context=32768)
    inst = p["instances"][0]
    assert_consistent(inst, model)
    assert inst["fits"] and inst["split_mode"] == "none"
    d = inst["per_device"][0]
    # MEASURED at -c 32768 f16: KV 2048.00, RS 448.88, MTP KV 128.00 MiB
    assert (d["kv_mib"], d["recurrent_mib"], d["mtp_kv_mib"]) == (2048, 449, 128)
    # MEASURED model buffer (everything, token_embd included) = 16021.46 MiB
    on_gpu = d["weights_mib"] + d["mtp_weights_mib"] + d["output_mib"]
    assert abs(on_gpu + inst["host_mib"] - 16021.46) < 4
    # the compute estimate is not below what the CPU backend measured (164.02 + 130.02 MiB)
    assert d["compute_mib"] >= 164.02 + 130.02


def test_1x_v100_16gb_refused_with_numbers(model):
    with pytest.raises(PlanError) as ei:
        plan(facts("seed-1x-v100-pcie16"), model, context=32768)
    e = ei.value
    numbers = e.details["needed_vs_available"]
    assert numbers[0]["device"] == 0 and numbers[0]["available_mib"] == 16384
    assert numbers[0]["needed_mib"] > 16384
    assert f"needs {numbers[0]['needed_mib']} MiB (weights " in e.message and "has 16384 MiB free" in e.message
    counted = numbers[0]["counted_mib"]
    assert sum(counted.values()) == numbers[0]["needed_mib"]
    assert counted["cuda_context"] == tp.DEFAULT_CUDA_CONTEXT_MIB and counted["reserve"] == 1024
    # weights alone do not fit: no context and no cache type helps
    sugg = e.details["suggestions"]
    assert (sugg["max_context"], sugg["cache_types"]) == (None, [])
    checked = sugg["checked_cache_types"]
    assert [c["cache_type"] for c in checked] == list(tp.FALLBACK_CACHE_TYPES)  # every cheaper type was tried
    assert all(not c["fits"] and c["short_mib"] > 0 for c in checked)
    assert "smaller quantization" in e.message


def test_2x_v100_16gb_262k_f16_refused_with_suggestions(model):
    f = facts("seed-2x-v100-pcie16")
    with pytest.raises(PlanError) as ei:
        plan(f, model, context=262144)
    e = ei.value
    sugg = e.details["suggestions"]
    assert [n["available_mib"] for n in e.details["needed_vs_available"]] == [16384, 16384]
    assert any(n["short_mib"] > 0 for n in e.details["needed_vs_available"])
    assert "q4_0" in sugg["cache_types"]
    assert sugg["max_context"] and sugg["max_context"] % 256 == 0 and sugg["max_context"] < 262144
    assert f"context <= {sugg['max_context']}" in e.message
    # the suggestions are real: the suggested context fits, 256 more does not; q4_0 fits
    assert plan(f, model, context=sugg["max_context"])["fits"]
    with pytest.raises(PlanError):
        plan(f, model, context=sugg["max_context"] + 256)
    for t in sugg["cache_types"]:
        assert plan(f, model, context=262144, cache_type_k=t, cache_type_v=t)["fits"]
    if "q8_0" not in sugg["cache_types"]:
        with pytest.raises(PlanError):
            plan(f, model, context=262144, cache_type_k="q8_0", cache_type_v="q8_0")
    # every cheaper cache type was checked, q8_0 first; the ones that do not fit are named with the shortfall
    checked = {c["cache_type"]: c for c in sugg["checked_cache_types"]}
    assert list(checked) == list(tp.FALLBACK_CACHE_TYPES)
    assert sugg["cache_types"] == [t for t, c in checked.items() if c["fits"]]
    for t, c in checked.items():
        if not c["fits"]:
            assert c["short_mib"] > 0 and f"{t} (short by {c['short_mib']} MiB" in e.message
    # with the calibrated estimate, q8_0 misses on 2x 16 GB only because of the CUDA-only terms: the
    # F16 K/V copy (1 GiB per GPU) and the 4 pipeline copies of each context's KQ mask
    assert not checked["q8_0"]["fits"] and checked["q8_0"]["short_mib"] < 1024
    assert checked["q5_1"]["fits"] and checked["q4_0"]["fits"]


# ------------------------------------------------------------------------------------------------
# the other required cases


def test_heterogeneous_24_plus_16_gets_an_unequal_split(model):
    f = mixed_24_16()
    with pytest.raises(PlanError):  # the 3090 alone is not enough: the plan must span both
        plan(f, model, context=262144, cache_type_k="q8_0", cache_type_v="q8_0", devices=[0])
    p = plan(f, model, context=262144, cache_type_k="q8_0", cache_type_v="q8_0")
    inst = p["instances"][0]
    assert_consistent(inst, model)
    assert inst["devices"] == [0, 1]
    big, small = inst["tensor_split"]
    assert big > small  # more blocks on the 24 GB card
    used = [d["total_mib"] / d["free_before_mib"] for d in inst["per_device"]]
    assert abs(used[0] - used[1]) < 0.1  # balanced by ratio, not by count


def test_busy_3090s_are_not_planned_as_empty(model):
    f = facts("cn5900x-2x-rtx3090-nvlink-busy")
    assert all(g["memory_used_mib"] > 22000 for g in f["gpus"])
    with pytest.raises(PlanError) as ei:
        plan(f, model, context=32768)
    free = [n["available_mib"] for n in ei.value.details["needed_vs_available"]]
    assert free == [g["memory_free_mib"] for g in f["gpus"]]
    assert all(x < 2048 for x in free)
    # the idle capture of the same host fits on one card
    p = plan(facts("cn5900x-2x-rtx3090-nvlink-idle"), model, context=32768)
    assert len(p["instances"][0]["devices"]) == 1


def test_8x_h200_replicas_auto_gives_8_single_gpu_instances(model):
    f = facts("noderecord-8x-h200-nvswitch")
    p = plan(f, model, context=262144, replicas="auto")
    assert len(p["instances"]) == 8
    assert sorted(i["devices"][0] for i in p["instances"]) == list(range(8))
    for inst in p["instances"]:
        assert_consistent(inst, model)
        assert len(inst["devices"]) == 1 and inst["split_mode"] == "none"
    # an exact count is honoured, and too many is refused with the sets that do fit
    assert len(plan(f, model, context=262144, replicas=3)["instances"]) == 3
    with pytest.raises(PlanError, match="replicas=9"):
        plan(f, model, context=262144, replicas=9)


def test_replicas_auto_groups_pairs_when_one_gpu_is_not_enough(model):
    # 8x A100-SXM4-80GB on NVSwitch (NV12 everywhere), NUMA 0,0,0,0,1,1,1,1. A 1M-token f16 context
    # (64 GiB KV + 4 GiB MTP KV + weights) does not fit one 80 GB card, so every replica takes a pair.
    f = facts("jtkj003-8x-a100-sxm4-nvswitch")
    with pytest.raises(PlanError):
        plan(f, model, context=1048576, max_gpus=1)
    p = plan(f, model, context=1048576, replicas="auto")
    assert [i["devices"] for i in p["instances"]] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    for inst in p["instances"]:
        assert_consistent(inst, model)
        assert inst["split_mode"] == "layer"


def test_mig_gpu_is_skipped_with_a_note(model):
    f = facts("ceems-2x-a100-pcie40-mig")
    assert [g["mig_mode"] for g in f["gpus"]][0] == "Enabled"
    p = plan(f, model, context=65536)
    assert [s["index"] for s in p["skipped"]] == [0]
    assert "MIG" in p["skipped"][0]["reason"]
    assert p["instances"][0]["devices"] == [1]
    assert any("Skipped GPU 0" in line for line in p["explanation"])
    with pytest.raises(PlanError, match="MIG"):
        plan(f, model, context=65536, devices=[0])


def test_tensor_mode_with_mtp_refused_unless_forced(model):
    f = facts("uts-2x-v100-pcie32")
    with pytest.raises(PlanError, match="force_tensor_split"):
        plan(f, model, context=262144, split_mode="tensor")
    p = plan(f, model, context=262144, split_mode="tensor", force_tensor_split=True, max_gpus=2, devices=[0, 1])
    assert p["fits"]
    # without MTP it is allowed; a quantized KV cache is not (llama.cpp needs f16/bf16/f32 there)
    p = plan(f, model, context=131072, split_mode="tensor", mtp=False)
    assert p["instances"][0]["split_mode"] == "none"  # one 32 GB card is enough: fewest GPUs first
    with pytest.raises(PlanError, match="unquantized"):
        plan(f, model, context=131072, split_mode="tensor", mtp=False, cache_type_k="q8_0", cache_type_v="q8_0")


def test_tensor_mode_spans_gpus_when_needed(model):
    f = facts("seed-2x-v100-pcie16")
    p = plan(f, model, context=16384, split_mode="tensor", mtp=False)
    inst = p["instances"][0]
    assert inst["split_mode"] == "tensor" and inst["devices"] == [0, 1]
    assert inst["tensor_split"] == [50, 50]
    assert "-sm" in inst["llama_args"] and "tensor" in inst["llama_args"]


def test_pinned_devices_are_honoured(model):
    f = facts("uts-2x-v100-pcie32")
    assert plan(f, model, context=65536)["instances"][0]["devices"] == [0]
    p = plan(f, model, context=65536, devices=[1])
    assert p["instances"][0]["devices"] == [1]
    assert p["instances"][0]["cuda_visible_devices"] == "1"
    f8 = facts("noderecord-8x-h200-nvswitch")
    p = plan(f8, model, context=262144, devices=[5, 6], replicas="auto")
    assert sorted(i["devices"][0] for i in p["instances"]) == [5, 6]
    with pytest.raises(PlanError, match=r"devices \[7\]"):
        plan(f, model, context=65536, devices=[7])


def test_cpu_host_gets_a_cpu_plan(model):
    f = nvidia_smi.empty_facts()
    assert f["count"] == 0
    p = plan(f, model, context=32768)
    assert p["mode"] == "cpu" and p["fits"]
    inst = p["instances"][0]
    assert inst["cuda_visible_devices"] is None and inst["devices"] == []
    assert inst["tensor_split"] is None and inst["n_gpu_layers"] == 0
    i = inst["llama_args"].index("-ngl")
    assert inst["llama_args"][i + 1] == "0"
    assert any("-ngl 0" in line for line in p["explanation"])
    assert inst["host_mib"] >= 16021  # MEASURED model buffer 16021.46 MiB, all in host memory
    with pytest.raises(PlanError, match="cpu_ok"):
        plan(f, model, context=32768, cpu_ok=False)


def test_all_gpus_skipped_fails_unless_cpu_ok(model):
    f = facts("ceems-2x-a100-pcie40-mig")
    f["gpus"][1]["healthy"] = False
    f["gpus"][1]["error"] = "GPU is lost"
    with pytest.raises(PlanError, match="GPU is lost"):
        plan(f, model, context=32768)
    assert plan(f, model, context=32768, cpu_ok=True)["mode"] == "cpu"


# ------------------------------------------------------------------------------------------------
# the memory model against llama.cpp


def test_context_is_total_over_slots_measured(model):
    # MEASURED at -c 65536 -np 4: n_ctx_seq 16384, KV 4096.00, RS 1795.50, MTP KV 256.00 MiB
    cells = tp.context_cells(65536, 4)
    assert cells == {"n_ctx": 65536, "n_ctx_seq": 16384, "n_stream": 4, "cells": 65536}
    p = plan(facts("noderecord-8x-h200-nvswitch"), model, context=65536, parallel=4)
    d = p["instances"][0]["per_device"][0]
    assert (d["kv_mib"], d["recurrent_mib"], d["mtp_kv_mib"]) == (4096, 1796, 256)
    assert p["settings"]["recurrent_rows"] == 12


def test_context_cells_padding():
    assert tp.context_cells(100000, 1)["n_ctx"] == 100096
    # 3 slots: n_ctx 1024 / 3 = 341 -> 512 per slot, n_ctx rounded to 1536 (llama-context.cpp:295-304)
    assert tp.context_cells(1000, 3) == {"n_ctx": 1536, "n_ctx_seq": 512, "n_stream": 3, "cells": 1536}
    assert tp.context_cells(1000, 3, kv_unified=True) == {
        "n_ctx": 1024,
        "n_ctx_seq": 1024,
        "n_stream": 1,
        "cells": 1024,
    }


def test_cache_type_sizes_match_gguf_py():
    pytest.importorskip("gguf")
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    for name, (blck, size) in tp.CACHE_TYPES.items():
        assert GGML_QUANT_SIZES[GGMLQuantizationType[name.upper()]] == (blck, size), name


def test_kv_scales_with_cache_type(model):
    f = facts("noderecord-8x-h200-nvswitch")
    kv = {}
    for t in ("f16", "q8_0", "q4_0"):
        kv[t] = plan(f, model, context=262144, cache_type_k=t, cache_type_v=t)["instances"][0]["per_device"][0][
            "kv_mib"
        ]
    assert kv == {"f16": 16384, "q8_0": 8704, "q4_0": 4608}


def test_mtp_off_drops_mtp_costs(model, model_no_mtp):
    f = facts("seed-1x-rtx4090")
    on = plan(f, model, context=32768)["instances"][0]["per_device"][0]
    off = plan(f, model, context=32768, mtp=False)
    d = off["instances"][0]["per_device"][0]
    assert d["mtp_weights_mib"] == 0 and d["mtp_kv_mib"] == 0
    assert on["mtp_weights_mib"] > 0 and on["mtp_kv_mib"] == 128
    assert d["recurrent_mib"] < on["recurrent_mib"]  # 1 row instead of 1 + draft_n_max
    assert "--spec-draft-n-max" not in off["instances"][0]["llama_args"]
    # a trunk-only file: MTP defaults off, and asking for it is an error
    p = plan(f, model_no_mtp, context=32768)
    assert p["settings"]["mtp"] is False
    with pytest.raises(PlanError, match="no MTP"):
        plan(f, model_no_mtp, context=32768, mtp=True)


def test_compute_estimate_terms(model):
    """Each term of the estimate follows the llama.cpp source it cites."""
    m = tp.ModelSpec(model)
    s = tp.Settings(m, 262144, cache_type_k="q4_0", cache_type_v="q4_0")
    flags = {"has_kv": True, "has_output": False, "has_mtp": False}
    base = tp.estimate_compute_terms(m, s, pipeline=False, **flags)
    piped = tp.estimate_compute_terms(m, s, pipeline=True, **flags)
    mask = 262144 * 512 * 2  # F16 n_ctx_seq x n_ubatch (src/llama-graph.cpp:982)
    hidden = 512 * 5120 * 4
    assert (base["kq_mask"], base["inputs"]) == (mask, hidden)
    # a layer split pipelines: 4 copies of every split input (ggml-backend.cpp:1379-1387, 1563-1590)
    assert (piped["kq_mask"], piped["inputs"]) == (4 * mask, 4 * hidden)
    assert piped["activations"] == base["activations"] > 0
    # CUDA's batch flash-attention kernels read F16: one layer's K and V of all cells (fattn.cu:722-756)
    assert base["kv_f16"] == 2 * 262144 * 1024 * 2
    assert tp.estimate_compute_terms(m, tp.Settings(m, 262144), pipeline=False, **flags)["kv_f16"] == 0
    # the CPU backend has neither copies nor the F16 conversion
    cpu = tp.estimate_compute_terms(m, s, pipeline=True, backend="cpu", **flags)
    assert (cpu["kq_mask"], cpu["inputs"], cpu["kv_f16"]) == (mask, 0, 0)
    # the MTP device also holds the draft context: its own mask copies, inputs and logits
    mtp = tp.estimate_compute_terms(m, s, pipeline=True, has_kv=True, has_output=True, has_mtp=True)
    assert mtp["mtp_kq_mask"] == 4 * mask and mtp["mtp_inputs"] == 8 * hidden and mtp["mtp_kv_f16"] == 0
    assert mtp["logits"] == mtp["mtp_logits"] == 3 * 248320 * 4  # parallel x (1 + draft_n_max 2) outputs
    assert tp.estimate_compute_bytes(m, s, pipeline=True, **flags) == sum(piped.values())
    # a flat value replaces the estimate on every device
    p = plan(facts("seed-1x-rtx4090"), model, context=32768, compute_buffer_mib=700)
    assert p["instances"][0]["per_device"][0]["compute_mib"] == 700
    assert p["instances"][0]["per_device"][0]["compute_terms_mib"] is None
    assert p["settings"]["compute_estimated"] is False


# ------------------------------------------------------------------------------------------------
# llama.cpp's layer assignment


def test_simulated_assignment_even_split():
    a = tp.simulate_layer_assignment([1, 1], 65)
    assert a[:33] == [0] * 33 and a[33:] == [1] * 33
    assert tp.simulate_layer_assignment([33, 33], 65) == a
    assert tp.simulate_layer_assignment([3, 1], 65).count(0) == 50  # il/66 < 0.75 -> il <= 49


def test_simulated_assignment_uses_float32():
    # -ts 0.6,0.4 on 65 "layers": exact arithmetic on the same float32 inputs would put layer 39 on
    # device 0 (39/65 < float32(0.6)); llama.cpp computes float(39)/65 in float32, which rounds to
    # exactly the same float32 as split point 0.6/1.0, and upper_bound sends it to device 1.
    a = tp.simulate_layer_assignment([0.6, 0.4], 64)
    assert a.count(0) == 39 and a[39] == 1
    ts32 = [Fraction(tp._f32(0.6)), Fraction(tp._f32(0.4))]
    assert Fraction(39, 65) < ts32[0] / sum(ts32)


def test_simulated_assignment_partial_offload_and_errors():
    a = tp.simulate_layer_assignment([1, 1], 65, n_gpu_layers=10)
    assert a[:56] == [None] * 56 and a[56:61] == [0] * 5 and a[61:] == [1] * 5
    with pytest.raises(PlanError):
        tp.simulate_layer_assignment([0, 0], 65)
    with pytest.raises(PlanError):
        tp.simulate_layer_assignment([], 65)


def test_chosen_split_is_verified_by_simulation(model, monkeypatch):
    """The plan follows the assignment llama.cpp computes for the -ts, not the planner's intent."""
    f = facts("seed-2x-v100-pcie16")
    real = tp.simulate_layer_assignment

    def skewed(ts, n, n_gpu_layers=-1):  # pretend llama.cpp put 2 more layers on device 0
        a = real(ts, n, n_gpu_layers)
        return [0 if i < a.count(0) + 2 else d for i, d in enumerate(a)]

    args = {"context": 262144, "cache_type_k": "q4_0", "cache_type_v": "q4_0"}
    straight = plan(f, model, **args)["instances"][0]
    monkeypatch.setattr(tp, "simulate_layer_assignment", skewed)
    inst = plan(f, model, **args)["instances"][0]
    assert inst["tensor_split"] == straight["tensor_split"]
    assert inst["layers"][0]["count"] == inst["tensor_split"][0] + 2
    assert inst["per_device"][0]["weights_mib"] > straight["per_device"][0]["weights_mib"]
    assert inst["per_device"][1]["weights_mib"] < straight["per_device"][1]["weights_mib"]


# ------------------------------------------------------------------------------------------------
# GPU choice


def _four_gpu_host():
    """Pure-logic case (no capture has mixed links): 4x 16 GB; 0-1 SYS, 2-3 NV4, the rest PHB; NUMA 0,0,1,1."""
    gpus = []
    for i in range(4):
        gpus.append(
            {
                "index": i,
                "uuid": f"GPU-{i}",
                "name": "Tesla V100-PCIE-16GB",
                "pci_bus_id": f"00000000:{i + 1:02X}:00.0",
                "memory_total_mib": 16384,
                "memory_used_mib": 0,
                "memory_free_mib": 16384,
                "compute_capability": "7.0",
                "mig_mode": None,
                "numa_node": 0 if i < 2 else 1,
                "cpu_affinity": None,
                "healthy": True,
                "error": None,
            }
        )
    m = [["X", "SYS", "PHB", "PHB"], ["SYS", "X", "PHB", "PHB"], ["PHB", "PHB", "X", "NV4"], ["PHB", "PHB", "NV4", "X"]]
    return {"count": 4, "driver_version": "x", "cuda_driver_version": "12.2", "source": "nvidia-smi", "gpus": gpus,
            "topology": {"matrix": m, "nvlink_groups": [[2, 3]]}}  # fmt: skip


def test_prefers_nvlink_pair(model):
    p = plan(_four_gpu_host(), model, context=262144, cache_type_k="q4_0", cache_type_v="q4_0")
    assert p["instances"][0]["devices"] == [2, 3]
    assert any("NV4" in line for line in p["explanation"])
    # the link outranks the NUMA node: an NVLink pair across sockets beats a PHB pair on one socket
    f = _four_gpu_host()
    m = f["topology"]["matrix"]
    m[2][3] = m[3][2] = "SYS"
    m[1][2] = m[2][1] = "NV4"
    m[0][1] = m[1][0] = "PHB"
    p = plan(f, model, context=262144, cache_type_k="q4_0", cache_type_v="q4_0")
    assert p["instances"][0]["devices"] == [1, 2]


def test_prefers_one_numa_node_then_free_memory(model):
    f = _four_gpu_host()
    for row in f["topology"]["matrix"]:
        for j, v in enumerate(row):
            row[j] = v if v == "X" else "PHB"
    f["gpus"][3]["memory_free_mib"] = 16000
    f["gpus"][3]["memory_used_mib"] = 384
    p = plan(f, model, context=262144, cache_type_k="q4_0", cache_type_v="q4_0")
    assert p["instances"][0]["devices"] == [0, 1]  # same NUMA node, more free than [2, 3]
    f["gpus"][1]["numa_node"] = 1
    p = plan(f, model, context=262144, cache_type_k="q4_0", cache_type_v="q4_0")
    assert p["instances"][0]["devices"] == [1, 2]  # the only full-memory pair on one node


def test_link_rank_order():
    """NV<n> is n bonded NVLinks: more is faster; every NV# beats every PCIe path."""
    order = ["NV18", "NV12", "NV4", "NV2", "NV1", "PIX", "PXB", "PHB", "NODE", "SYS", "???"]
    ranks = [tp._link_rank(c) for c in order]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)
    assert tp._link_rank("SOC") == tp._link_rank("SYS") and tp._link_rank("nv2") == tp._link_rank("NV2")
    assert tp._link_rank(None) == tp._link_rank("X?") > tp._link_rank("SYS")
    assert [tp.nvlink_count(c) for c in ("NV18", "NV1", "PIX", "NV", None)] == [18, 1, 0, 0, 0]


def test_cube_mesh_2_gpu_instance_takes_an_nv2_pair(model):
    """8x V100 SXM2 hybrid cube mesh: GPUs 0,1 are joined by NV1; a 2-GPU instance must take an NV2 pair
    (on one NUMA node), and replicas take the NV2 pairs before any NV1 pair."""
    f = facts("seed-8x-v100-sxm2-cubemesh")
    m = f["topology"]["matrix"]
    assert m[0][1] == "NV1" and m[0][3] == "NV2" and f["topology"]["nvlink_groups"] == [list(range(8))]
    args = {"context": 262144, "cache_type_k": "q4_0", "cache_type_v": "q4_0"}
    p = plan(f, model, **args)
    inst = p["instances"][0]
    assert len(inst["devices"]) == 2
    a, b = inst["devices"]
    assert m[a][b] == "NV2" and inst["devices"] == [0, 3]  # NV2, both on NUMA node 0, lowest indices
    assert any("worst link NV2" in line for line in p["explanation"])
    p = plan(f, model, replicas="auto", **args)
    pairs = [i["devices"] for i in p["instances"]]
    assert pairs == [[0, 3], [1, 2], [4, 7], [5, 6]]
    assert all(m[x][y] == "NV2" for x, y in pairs)


def test_equal_worst_link_more_total_nvlinks_wins():
    """Two 3-GPU sets whose worst link is NV1: the one with more bonded links in total ranks first."""
    gpus = [{"index": i, "numa_node": 0, "memory_free_mib": 16384} for i in range(6)]
    m = [["X" if i == j else "SYS" for j in range(6)] for i in range(6)]

    def link(i, j, code):
        m[i][j] = m[j][i] = code

    link(0, 1, "NV1"), link(0, 2, "NV1"), link(1, 2, "NV1")  # 3 links
    link(3, 4, "NV1"), link(3, 5, "NV2"), link(4, 5, "NV4")  # 7 links
    low, _ = tp._group_key(gpus[:3], m)
    high, worst = tp._group_key(gpus[3:], m)
    assert worst == "NV1" and high < low
    assert [g for _, g, _ in tp._candidate_groups(gpus, 3, m)][0] == gpus[3:]


def test_replicas_exact_uses_disjoint_pairs(model):
    f = _four_gpu_host()
    p = plan(f, model, context=262144, cache_type_k="q4_0", cache_type_v="q4_0", replicas=2)
    sets = [i["devices"] for i in p["instances"]]
    assert sets == [[2, 3], [0, 1]]
    with pytest.raises(PlanError, match="replicas=3"):
        plan(f, model, context=262144, cache_type_k="q4_0", cache_type_v="q4_0", replicas=3)


def test_split_mode_none_keeps_one_gpu(model):
    with pytest.raises(PlanError):
        plan(facts("seed-2x-v100-pcie16"), model, context=32768, split_mode="none")
    p = plan(facts("uts-2x-v100-pcie32"), model, context=32768, split_mode="none")
    assert p["instances"][0]["split_mode"] == "none"


# ------------------------------------------------------------------------------------------------
# input errors


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"cache_type_k": "q3_k"}, "not a llama.cpp KV cache type"),
        ({"parallel": 0}, "parallel must be >= 1"),
        ({"context": "lots"}, "context must be an integer"),
        ({"replicas": "many"}, "replicas must be an integer"),
        ({"split_mode": "row"}, "split_mode='row'"),
        ({"draft_cache_type_v": "q2"}, "draft_cache_type_v"),
    ],
)
def test_bad_inputs_are_named(model, kwargs, match):
    args = {"context": 32768, **kwargs}
    with pytest.raises(PlanError, match=match):
        plan(facts("seed-1x-rtx4090"), model, **args)


def test_bad_facts_are_named(model):
    broken = dict(model)
    del broken["kv_layers"]
    with pytest.raises(PlanError, match="missing 'kv_layers'"):
        plan(facts("seed-1x-rtx4090"), broken, context=32768)
    with pytest.raises(PlanError, match="gpu_facts"):
        plan(None, model, context=32768)
    short = copy.deepcopy(model)
    short["tensor_bytes"]["per_layer"].pop()
    with pytest.raises(PlanError, match="per_layer has 64 entries"):
        plan(facts("seed-1x-rtx4090"), short, context=32768)


def test_default_context_is_the_training_context(model):
    p = plan(facts("noderecord-8x-h200-nvswitch"), model)
    assert p["settings"]["context"] == model["context_length"] == 262144


def test_empty_devices_list_is_an_error(model):
    with pytest.raises(PlanError, match="devices is an empty list"):
        plan(facts("seed-1x-rtx4090"), model, context=32768, devices=[])


@pytest.mark.parametrize("failure", ["gpu-error:3", "gpu-unknown:3", "gpu-reset:3", "gpu-na:3"])
def test_dead_gpu_is_skipped_with_a_note_and_the_rest_planned(model, tmp_path, failure):
    """A host with 1 dead GPU of 8 still gets a plan on the other 7, and the explanation says why."""
    import json

    profile = json.loads(profile_path("seed-8x-v100-sxm2-cubemesh").read_text())
    profile["failure"] = failure
    path = tmp_path / "dead.json"
    path.write_text(json.dumps(profile))
    f = facts_from_profile(path)
    p = plan(f, model, context=262144, cache_type_k="q4_0", cache_type_v="q4_0", replicas="auto")
    assert [sk["index"] for sk in p["skipped"]] == [3]
    assert any(line.startswith("Skipped GPU 3: not healthy") for line in p["explanation"])
    used = [d for inst in p["instances"] for d in inst["devices"]]
    assert 3 not in used and len(p["instances"]) == 3
    if f["topology"]["matrix"]:  # the fields were unreadable, the topology was not: NV2 pairs only
        assert [i["devices"] for i in p["instances"]] == [[1, 2], [4, 7], [5, 6]]
    else:  # nvidia-smi topo -m printed only the device-handle line
        assert any(line.startswith("GPU links unknown") for line in p["explanation"])


# ------------------------------------------------------------------------------------------------
# calibration: llama.cpp's own buffer sizes (CPU backend) at 7 points, tests/gpu/calibrate_compute.py


def _calibration():
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "gpu" / "results" / "cpu-2026-12-01" / "calibration.json"
    return json.loads(path.read_text())


@pytest.mark.parametrize("record", _calibration(), ids=lambda r: r["point"])
def test_calibration_points_measured_on_llama_cpp(model, record):
    """At every measured point: KV, recurrent state and MTP KV are exact; the compute estimate (CPU terms)
    is never below what llama.cpp allocated and at most 35 % above it (the margin and the MTP context's
    short-context peak); the CUDA plan adds only the source-derived CUDA terms on top."""
    st = record["settings"]
    m = tp.ModelSpec(model)
    s = tp.Settings(m, st["context"], cache_type_k=st["cache_type"], cache_type_v=st["cache_type"],
                    parallel=st["parallel"], mtp=True, draft_n_max=st["draft_n_max"])  # fmt: skip
    target, mtp = record["contexts"]
    costs = tp.layer_costs(m, s)
    assert -(-sum(c["kv"] for c in costs) // MIB) == target["KV"]["CPU"]
    assert abs(sum(c["recurrent"] for c in costs) / MIB - target["RS"]["CPU"]) < 0.01
    assert sum(c["mtp_kv"] for c in costs) / MIB == mtp["KV"]["CPU"]
    flags = {"has_kv": True, "has_output": True, "has_mtp": True, "pipeline": False}
    cpu = tp.estimate_compute_terms(m, s, backend="cpu", **flags)
    planned_target = sum(v for k, v in cpu.items() if not k.startswith("mtp_")) / MIB
    planned_mtp = sum(v for k, v in cpu.items() if k.startswith("mtp_")) / MIB
    for planned, measured in ((planned_target, target["compute"]["CPU"]), (planned_mtp, mtp["compute"]["CPU"])):
        assert measured <= planned <= 1.35 * measured, (planned, measured)
    cuda = tp.estimate_compute_terms(m, s, backend="cuda", **flags)
    extra = {k: cuda[k] - cpu[k] for k in cuda if cuda[k] != cpu[k]}
    assert set(extra) <= {"inputs", "kv_f16", "mtp_inputs", "mtp_kv_f16"}
