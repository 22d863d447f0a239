#!/usr/bin/python
"""Ansible module llamafleet.mtp.tensor_split: plan GPUs, -ts split and memory for llama-server."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: tensor_split
short_description: Plan which GPUs a llama-server instance uses, its -ts split, and check that it fits
version_added: "0.1.0"
description:
  - Pure planning from facts; touches nothing on the host and never reports a change. Inputs are the
    C(gpu_facts) fact of M(llamafleet.mtp.gpu_facts) and the C(gguf) result of M(llamafleet.mtp.gguf_info)
    (both described in docs/facts.md).
  - Models llama.cpp's memory placement (commit 0c1e570) per GPU - weights of the blocks a GPU holds,
    their KV cache at the chosen cache types (only the model's KV layers; C(-c) is the total context over
    all C(-np) slots), recurrent state (C(parallel * (1 + draft_n_max)) rows with MTP), the MTP block and the
    MTP draft context's own KV cache on the GPU that holds the MTP block, the output tensor on the GPU that
    holds the output layer, compute buffers and a reserve. C(token_embd) stays in host memory, as llama.cpp
    keeps the input layer on the CPU.
  - Picks the fewest GPUs that fit; among sets of the same size it prefers the fastest interconnect, judged by
    the worst link inside the set - C(NV<n>) is a bonded set of n NVLinks, so C(NV18) > C(NV12) > ... > C(NV2) >
    C(NV1), and every C(NV#) beats C(PIX) > C(PXB) > C(PHB) > C(NODE) > C(SYS) - then, among sets with the same
    worst link, the most NVLinks inside the set in total (the most NVLink bandwidth), then a single NUMA node,
    then the most free memory. On an 8x V100 SXM2 cube mesh a 2-GPU instance therefore takes an C(NV2) pair,
    not an C(NV1) one. Uses C(memory_free_mib), so memory used by other processes counts.
  - GPUs in MIG mode and unhealthy GPUs (C(healthy=false) in C(gpu_facts), for example a GPU nvidia-smi cannot
    reach) are skipped with a note in C(skipped) and C(explanation); the plan uses the other GPUs.
  - For a layer split it chooses integer C(-ts) proportions (one per GPU, in C(CUDA_VISIBLE_DEVICES) order)
    that balance the needed/free ratio of the GPUs, then re-runs llama.cpp's own float32 layer-assignment
    formula (src/llama-model.cpp:1556-1614) on them and plans from that assignment.
  - When nothing fits it fails before anything changes, with the numbers (per GPU, what it needs by category
    and what it has free) and what would fit - the largest context (a multiple of 256) at the requested cache
    types, and every cheaper cache type (C(q8_0), C(q5_1), C(q5_0), C(q4_1), C(q4_0)) that fits the
    requested context; the cheaper types that were checked and do not fit are named with their shortfall.
  - Compute buffers are an estimate unless O(compute_buffer_mib) is given; see that option.
author:
  - llamafleet maintainers (!UNKNOWN)
options:
  gpu_facts:
    description:
      - The C(gpu_facts) fact gathered by M(llamafleet.mtp.gpu_facts) on the target host.
    type: dict
    required: true
  gguf:
    description:
      - The C(gguf) result of M(llamafleet.mtp.gguf_info) for the model file.
    type: dict
    required: true
  context:
    description:
      - Total context (llama-server C(-c)) shared by all slots. llama.cpp pads it to a multiple of 256 and,
        without a unified KV cache, gives each slot C(context / parallel) (padded to 256).
      - Defaults to the model's training context (C(gguf.context_length)), as C(-c 0) does.
    type: int
  cache_type_k:
    description: KV cache type for K (C(-ctk)).
    type: str
    default: f16
    choices: [f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1]
  cache_type_v:
    description: KV cache type for V (C(-ctv)). Quantized V needs flash attention (llama.cpp's default C(auto)).
    type: str
    default: f16
    choices: [f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1]
  parallel:
    description: Number of server slots (C(-np)).
    type: int
    default: 1
  kv_unified:
    description: Plan for C(--kv-unified) (one KV stream shared by all slots instead of one per slot).
    type: bool
    default: false
  mtp:
    description:
      - Use the model's MTP head for speculative decoding (C(--spec-type draft-mtp)).
      - Defaults to true when the model has MTP (nextn) layers and llama.cpp has an MTP graph for its
        architecture. C(true) for a model without MTP layers is an error.
    type: bool
  draft_n_max:
    description:
      - C(--spec-draft-n-max). With MTP it also sets the number of recurrent-state rollback rows per slot.
    type: int
    default: 2
  draft_cache_type_k:
    description: KV cache type of the MTP draft context (C(--spec-draft-type-k), llama.cpp default f16).
    type: str
    default: f16
    choices: [f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1]
  draft_cache_type_v:
    description: KV cache type of the MTP draft context (C(--spec-draft-type-v), llama.cpp default f16).
    type: str
    default: f16
    choices: [f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1]
  reserve_mib:
    description:
      - Free memory (MiB) to leave on every GPU, like llama.cpp's C(--fit-target) (default 1024), on top of the
        CUDA context (O(cuda_context_mib)).
    type: int
    default: 1024
  cuda_context_mib:
    description:
      - Memory (MiB) the CUDA context of the llama-server process takes on every GPU it uses, before any buffer
        (driver state, loaded kernels, cuBLAS). nvidia-smi's free memory still includes it; llama.cpp's own
        C(--fit-target) is measured after it exists. 526 MiB were in use on an H200 (CUDA 13.0, driver 580)
        before any llama.cpp buffer; older GPUs and toolkits use less. Not counted for a CPU-only plan.
    type: int
    default: 512
  compute_buffer_mib:
    description:
      - Flat compute-buffer size (MiB) to plan on every GPU instead of the built-in estimate (for example a value
        read from llama-server's C(CUDA0 compute buffer size) log lines; C(tests/gpu/calibrate_compute.py) collects
        them).
      - "The built-in estimate, per GPU, is the sum of the terms returned as C(compute_terms_mib) -
        C(activations) (a per-ubatch term calibrated on llama.cpp's own compute-buffer sizes, docs/measurements.md);
        C(kq_mask), the F16 KQ mask C(n_ctx_seq * n_ubatch * 2) bytes on GPUs with attention layers, copied to
        every GPU from the host and kept 4 times when a layer split pipelines over several GPUs (ggml's scheduler);
        C(inputs), the hidden state each GPU receives, with the same copies; C(kv_f16), with a quantized K or V
        cache, the F16 copy of one layer's whole K and V that CUDA's batched flash-attention kernels add to the
        compute buffer (ggml-cuda/fattn.cu); C(logits) on the output GPU; and the MTP draft context's own
        C(mtp_*) terms on the GPU that holds the MTP block."
      - "The activation term was calibrated on llama.cpp's CPU backend (no GPU was available); the CUDA-only
        terms follow the llama.cpp source lines cited in plugins/module_utils/tensor_plan.py. Two single-GPU runs
        on an H200 used within 0.1 % of the planned totals (with the CUDA context taken from the same runs); the
        4 KQ-mask copies per GPU of a layer split come from the scheduler's source and were not measured."
    type: int
  devices:
    description:
      - Restrict planning to these GPU indices (nvidia-smi indices). The plan still uses the fewest of them that
        fit. An index the host does not have is an error.
    type: list
    elements: int
  max_gpus:
    description: Most GPUs one instance may span (default - all usable GPUs).
    type: int
  replicas:
    description:
      - Number of independent llama-server instances on disjoint GPU sets, or C(auto) for as many as fit.
      - C(auto) repeatedly takes the smallest sufficient GPU set (with the interconnect preference) from the
        GPUs not used yet. An integer N needs exactly N sets, or the module fails.
    type: raw
    default: 1
  split_mode:
    description:
      - C(auto) - C(none) on one GPU, C(layer) across several. C(none) - one GPU per instance. C(layer) - allow
        a layer split. C(tensor) - llama.cpp's experimental tensor parallelism (unquantized KV only); refused with
        MTP unless O(force_tensor_split=true), because MTP with C(-sm tensor) has several crash reports.
      - A one-GPU instance is always planned as C(none), without C(-ts).
    type: str
    default: auto
    choices: [auto, none, layer, tensor]
  force_tensor_split:
    description: Accept C(split_mode=tensor) together with MTP.
    type: bool
    default: false
  cpu_ok:
    description:
      - When the host has no usable GPU, plan a CPU-only instance (C(-ngl 0), no C(CUDA_VISIBLE_DEVICES))
        instead of failing. Defaults to true when C(gpu_facts.count) is 0 and false otherwise (GPUs that are all
        skipped are more likely a fault than a plan).
    type: bool
  batch_size:
    description: C(--batch-size) the instance runs with (the outputs and compute buffers it sizes); unset - 2048.
    type: int
  ubatch_size:
    description: C(--ubatch-size) the instance runs with (the compute buffers are sized for it); unset - 512.
    type: int
  rope_scaling:
    description:
      - The instance opts into a context above the model's training context (C(yarn), C(linear)). Without it a
        context whose per-slot share exceeds the training context is refused, as site.yml's plan refuses it.
    type: str
    choices: [linear, yarn]
  check_host_memory:
    description:
      - For a CPU plan, refuse it when this host's C(MemAvailable) cannot hold what the plan needs, as site.yml's
        plan does. Memory held now by a llama-server that the new instance would replace is not counted here
        (site.yml's plan counts it as freed by the restart), so this check can refuse what site.yml accepts;
        C(false) skips it and says so in RV(unchecked).
    type: bool
    default: true
extends_documentation_fragment:
  - llamafleet.mtp.attributes.read_only
notes:
  - Only layer and none split modes are modelled exactly; C(tensor) assumes every GPU holds its C(-ts) share of
    each layer, an approximation.
  - KV cache of sliding-window layers is counted at full context (the GGUF summary carries no SWA facts), which
    over-estimates SWA models.
  - The verdict is site.yml's (C(llamafleet.mtp.instance_plan)) - the same planner, the same training-context
    rule and, for CPU plans, the same host RAM check (read here, on the host); what could not be checked is
    listed in RV(unchecked) rather than answered with C(fits=true).
"""

EXAMPLES = r"""
- name: Gather GPU facts
  llamafleet.mtp.gpu_facts:

- name: Read the model header
  llamafleet.mtp.gguf_info:
    path: /var/lib/llama-models/qwen/Qwen3.6-27B-Q4_K_M-mtp.gguf
  register: model

- name: Plan a 256k context with q4_0 KV and MTP
  llamafleet.mtp.tensor_split:
    gpu_facts: "{{ ansible_facts.gpu_facts }}"
    gguf: "{{ model.gguf }}"
    context: 262144
    cache_type_k: q4_0
    cache_type_v: q4_0
    draft_n_max: 2
  register: split

- name: Show why
  ansible.builtin.debug:
    var: split.plan.explanation

- name: One replica per GPU set on a big node
  llamafleet.mtp.tensor_split:
    gpu_facts: "{{ ansible_facts.gpu_facts }}"
    gguf: "{{ model.gguf }}"
    context: 131072
    replicas: auto
  register: fleet
"""

RETURN = r"""
checked:
  description: What the verdict checked beyond the GPU memory (the training context, this host's RAM).
  returned: success
  type: list
  elements: str
unchecked:
  description: What it could not check, and why (no C(/proc/meminfo), C(check_host_memory=false), ...).
  returned: success
  type: list
  elements: str
problems:
  description: Why the plan was refused (the messages site.yml's plan stage gives).
  returned: failure
  type: list
  elements: str
plan:
  description: The plan. MiB values are rounded up per category.
  returned: success
  type: dict
  contains:
    fits:
      description: True when every instance fits (the module fails otherwise).
      type: bool
    mode:
      description: C(gpu), or C(cpu) for a CPU-only plan.
      type: str
    settings:
      description:
        - The effective settings - C(context) asked, C(n_ctx) llama.cpp will use (padded), C(n_ctx_seq) per slot,
          C(kv_cells) per KV layer, C(parallel), cache types, C(mtp), C(draft_n_max), draft cache types,
          C(recurrent_rows), C(reserve_mib), C(compute_buffer_mib), C(compute_estimated), C(n_batch), C(n_ubatch),
          C(split_mode),
          C(replicas).
      type: dict
    skipped:
      description: GPUs left out, each C(index) and C(reason) (MIG mode, unhealthy, no free-memory reading).
      type: list
      elements: dict
    explanation:
      description: Human-readable lines - the model and memory model, skipped GPUs, why these GPUs, why this split.
      type: list
      elements: str
    instances:
      description: One entry per llama-server instance.
      type: list
      elements: dict
      contains:
        devices:
          description: nvidia-smi indices of its GPUs, in C(CUDA_VISIBLE_DEVICES) order (empty on CPU).
          type: list
          elements: int
        cuda_visible_devices:
          description: Value for C(CUDA_VISIBLE_DEVICES), e.g. C("0,1") (null on CPU). Pair it with
            C(CUDA_DEVICE_ORDER=PCI_BUS_ID) so CUDA's order matches nvidia-smi's indices.
          type: str
        tensor_split:
          description: C(-ts) proportions in C(CUDA_VISIBLE_DEVICES) order (llama.cpp "layers" per GPU, the output
            layer included); null for one GPU.
          type: list
          elements: int
        tensor_split_arg:
          description: The same as the C(-ts) argument string, e.g. C("39,27"); null for one GPU.
          type: str
        split_mode:
          description: C(none) for one GPU, C(layer) across GPUs, C(tensor) only when asked for.
          type: str
        main_gpu:
          description: C(-mg), relative to C(CUDA_VISIBLE_DEVICES) (null on CPU).
          type: int
        n_gpu_layers:
          description: C(-ngl) (block_count + 1 = everything offloaded; 0 on CPU).
          type: int
        layers:
          description:
            - Per GPU, llama.cpp's assignment for this C(-ts) - C(device), C(cuda_index), C(count) ("layers" incl.
              the output layer), C(first)/C(last) layer index, C(blocks), C(trunk_blocks), C(kv_layers),
              C(recurrent_layers), C(holds_mtp), C(holds_output).
          type: list
          elements: dict
        per_device:
          description:
            - Per GPU, what was counted, in MiB - C(weights_mib) (trunk blocks it holds), C(kv_mib), C(recurrent_mib),
              C(mtp_weights_mib), C(mtp_kv_mib) (MTP block and its draft KV cache, on the GPU holding it),
              C(output_mib), C(compute_mib), C(cuda_context_mib), C(reserve_mib); C(total_mib) (their sum).
            - C(compute_terms_mib) - the compute estimate by term (C(activations), C(kq_mask), C(inputs), C(kv_f16),
              C(logits) and the MTP context's C(mtp_activations), C(mtp_kq_mask), C(mtp_inputs), C(mtp_kv_f16),
              C(mtp_logits); zero terms left out); null with O(compute_buffer_mib).
            - C(free_before_mib) (nvidia-smi's free memory), C(free_after_mib) (expected free memory once the server
              runs, i.e. free_before - (total - reserve)), C(fits) (total <= free_before), C(device), C(name).
          type: list
          elements: dict
          sample:
            - device: 0
              name: Tesla V100-PCIE-16GB
              weights_mib: 8346
              kv_mib: 2592
              recurrent_mib: 272
              mtp_weights_mib: 0
              mtp_kv_mib: 0
              output_mib: 0
              compute_mib: 2232
              compute_terms_mib: {activations: 143.8, kq_mask: 1024.0, inputs: 40.0, kv_f16: 1024.0}
              cuda_context_mib: 512
              reserve_mib: 1024
              total_mib: 14978
              free_before_mib: 16384
              free_after_mib: 2430
              fits: true
        fits:
          description: Every GPU of the instance fits.
          type: bool
        required_mib:
          description: Sum of C(total_mib) over its GPUs.
          type: int
        available_mib:
          description: Sum of C(free_before_mib) over its GPUs (null on CPU).
          type: int
        host_mib:
          description: Host memory the model needs at least (C(token_embd), kept on the CPU; everything on CPU).
          type: int
        llama_args:
          description: The llama-server arguments this plan assumes (C(-c -np -ctk -ctv -ngl -sm -mg -ts), and with
            MTP C(--spec-draft-n-max -ctkd -ctvd)); C(--spec-type) is not among them, its spelling follows the binary.
          type: list
          elements: str
plan_error:
  description:
    - On failure, the numbers - C(needed_vs_available) per GPU (C(device), C(needed_mib), C(available_mib),
      C(short_mib), C(counted_mib) - what was counted, by the C(per_device) categories above - and
      C(compute_terms_mib)), the best C(attempt) (an instance as above), C(suggestions) and C(skipped).
    - C(suggestions) has C(max_context) (the largest context, a multiple of 256, that fits at the requested cache
      types), C(cache_types) (every cheaper cache type that fits the requested context) and
      C(checked_cache_types) (each cheaper type tried - C(cache_type), C(fits), C(short_mib)).
    - The message says the same in words - per GPU, what it needs by category and what it has free.
  returned: failure
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llamafleet.mtp.plugins.module_utils.fleet_instances import (
    CACHE_TYPES,
    ROPE_SCALING,
    context_problems,
    memory_problems,
)
from ansible_collections.llamafleet.mtp.plugins.module_utils.tensor_plan import SETTINGS_DEFAULTS, PlanError, plan


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "gpu_facts": {"type": "dict", "required": True},
            "gguf": {"type": "dict", "required": True},
            "context": {"type": "int"},
            "cache_type_k": {"type": "str", "default": "f16", "choices": CACHE_TYPES},
            "cache_type_v": {"type": "str", "default": "f16", "choices": CACHE_TYPES},
            "parallel": {"type": "int", "default": SETTINGS_DEFAULTS["parallel"]},
            "kv_unified": {"type": "bool", "default": False},
            "mtp": {"type": "bool"},
            "draft_n_max": {"type": "int", "default": SETTINGS_DEFAULTS["draft_n_max"]},
            "draft_cache_type_k": {"type": "str", "default": "f16", "choices": CACHE_TYPES},
            "draft_cache_type_v": {"type": "str", "default": "f16", "choices": CACHE_TYPES},
            "reserve_mib": {"type": "int", "default": SETTINGS_DEFAULTS["reserve_mib"]},
            "compute_buffer_mib": {"type": "int"},
            "cuda_context_mib": {"type": "int", "default": SETTINGS_DEFAULTS["cuda_context_mib"]},
            "devices": {"type": "list", "elements": "int"},
            "max_gpus": {"type": "int"},
            "replicas": {"type": "raw", "default": 1},
            "split_mode": {"type": "str", "default": "auto", "choices": ["auto", "none", "layer", "tensor"]},
            "force_tensor_split": {"type": "bool", "default": False},
            "cpu_ok": {"type": "bool"},
            "batch_size": {"type": "int"},
            "ubatch_size": {"type": "int"},
            "rope_scaling": {"type": "str", "choices": ROPE_SCALING},
            "check_host_memory": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    p = dict(module.params)
    replicas = p.pop("replicas")
    if isinstance(replicas, str) and replicas.strip().lower() == "auto":
        replicas = "auto"
    elif isinstance(replicas, str) and replicas.strip().isdigit():
        replicas = int(replicas)
    elif isinstance(replicas, bool) or not isinstance(replicas, int):
        module.fail_json(msg=f"replicas must be a positive integer or 'auto', got {replicas!r}")
    rope_scaling, check_memory = p.pop("rope_scaling"), p.pop("check_host_memory")
    p["n_batch"], p["n_ubatch"] = p.pop("batch_size"), p.pop("ubatch_size")
    gguf = p.pop("gguf")
    try:
        result = plan(p.pop("gpu_facts"), gguf, p.pop("context"), replicas=replicas, **p)
    except PlanError as e:
        module.fail_json(msg=e.message, plan_error=e.details)
    problems, checked, unchecked = verdict(result, gguf, rope_scaling, check_memory)
    if problems:
        module.fail_json(msg="; ".join(problems), problems=problems, plan=result, checked=checked, unchecked=unchecked)
    module.exit_json(changed=False, plan=result, checked=checked, unchecked=unchecked)


def _mem_available():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def verdict(result, gguf, rope_scaling, check_memory):
    """site.yml's rules after the planner (fleet_instances.plan_host): the training context, and host RAM for a CPU
    plan; returns (problems, checked, unchecked)."""
    settings = result.get("settings") or {}
    inst = {"name": None, "context": settings.get("context"), "rope_scaling": rope_scaling}
    problems = context_problems(inst, gguf, None, settings.get("n_ctx_seq"))
    checked, unchecked = ["the model's training context"], []
    if result.get("mode") != "cpu":
        return problems, checked, unchecked
    need = sum(int(i.get("host_mib") or i.get("required_mib") or 0) for i in result.get("instances") or [])
    if not check_memory:
        unchecked.append(f"host RAM for the CPU plan ({need} MiB): check_host_memory is false")
        return problems, checked, unchecked
    available = _mem_available()
    if available is None:
        unchecked.append(f"host RAM for the CPU plan ({need} MiB): /proc/meminfo has no MemAvailable here")
        return problems, checked, unchecked
    checked.append(f"host RAM: {need} MiB planned, {available // 1048576} MiB available (MemAvailable)")
    problems += memory_problems(None, {"the planned instance": need}, available, {})
    return problems, checked, unchecked


if __name__ == "__main__":
    main()
