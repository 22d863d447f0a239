#!/usr/bin/python
"""Ansible module llamafleet.mtp.llama_server_args: render and check llama-server instances for systemd."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llama_server_args
short_description: Render and check llama-server instances (arguments, environment, systemd drop-in)
version_added: "0.1.0"
description:
  - Turns instance settings, the C(tensor_split) plans, the C(model_fetch) facts and the capabilities of the
    llama-server binary into each instance's argument list, environment and systemd drop-in, or fails listing
    every problem before anything is changed.
  - Runs on the target host, where it reads each model's GGUF header (unless C(models) carries the
    C(gguf_info) result) and the binary's identity; it changes nothing and never reports a change.
  - Flags are rendered in their long spelling and only when the binary's C(--help) lists them; the MTP
    C(--spec-type) spelling comes from the capabilities (C(mtp) on the PR 22673 build, C(draft-mtp) on mainline).
  - Refuses duplicate instance names, port clashes, C(mtp) with a model or binary without MTP, C(--split-mode
    tensor) with MTP unless forced, a non-loopback bind without an API key unless allowed, flags the binary does
    not know, and API keys anywhere but O(instances[].api_key) (which is delivered as a root-only systemd credential
    and passed with C(--api-key-file), never in argv).
  - The pure logic is plugins/module_utils/llama_server_args.py.
author:
  - llamafleet maintainers (!UNKNOWN)
options:
  instances:
    description:
      - The instances (the role's C(llama_server_systemd_instances)). Settings left unset use the instance's plan
        (C(plans[name])) where it has them, else llama-server's defaults, except C(parallel) (1), C(mtp) (true) and
        C(draft_n_max) (2). A setting that disagrees with the plan is refused.
    type: list
    elements: dict
    required: true
    suboptions:
      # BEGIN FIELDS: generated from fleet_instances.FIELDS by scripts/field_docs.py; edit FIELDS, not this
      name:
        description: Instance name; the unit is C(llama-server@<name>.service). a-z, 0-9, '.', '_', '-'.
        type: str
        required: true
      model:
        description: A model name of C(model_fetch_facts); its C(path) is served.
        type: str
      model_path:
        description: The GGUF file to serve (first part of a split GGUF), instead of C(model).
        type: path
      host:
        description: Address to bind. A non-loopback address needs C(api_key) or C(allow_unauthenticated).
        type: str
        default: 127.0.0.1
      port:
        description: TCP port, 1024-65535 (the service has no capabilities); replica i uses port + i.
        type: int
        required: true
      context:
        description: Total context (C(--ctx-size)) over all slots; default the plan's, else the model's.
        type: int
      parallel:
        description: Server slots (C(--parallel)); default the plan's, else 1 (recommended with MTP).
        type: int
        default: 1
      kv_unified:
        description: Unified KV cache (C(--kv-unified)); default the plan's.
        type: bool
        default: false
      cache_type_k:
        description: KV cache type for K (C(--cache-type-k)); default the plan's.
        type: str
        choices:
          - f32
          - f16
          - bf16
          - q8_0
          - q4_0
          - q4_1
          - iq4_nl
          - q5_0
          - q5_1
        default: f16
      cache_type_v:
        description: KV cache type for V (C(--cache-type-v)); default the plan's.
        type: str
        choices:
          - f32
          - f16
          - bf16
          - q8_0
          - q4_0
          - q4_1
          - iq4_nl
          - q5_0
          - q5_1
        default: f16
      flash_attn:
        description: Flash attention (C(--flash-attn)); unset = llama-server's auto.
        type: str
        choices:
          - 'on'
          - 'off'
          - auto
      mtp:
        description: >-
          MTP speculative decoding with the spelling the binary knows; default the plan's, else true. Refused for a
          model without MTP (nextn) layers or a binary without MTP.
        type: bool
      draft_n_max:
        description: Drafted tokens per step (C(--spec-draft-n-max)), 1-16; default the plan's, else 2.
        type: int
        default: 2
      spec_draft_p_min:
        description: >-
          C(--spec-draft-p-min), 0-1 - MTP stops a draft at a token whose top probability is below it; unset -
          llama.cpp's default (0). Rendered with MTP on; refused for a binary without the flag. C(playbooks/bench.yml
          --tags autotune) measures a few values and keeps the best (C(llamafleet_autotune)).
        type: float
      spec_draft_n_min:
        description: >-
          C(--spec-draft-n-min), 0-16 and at most C(draft_n_max) - drafts shorter than this are discarded; unset -
          llama.cpp's default (0). Rendered with MTP on; refused for a binary without the flag.
        type: int
      draft_cache_type_k:
        description: KV cache type K of the MTP draft context (C(--spec-draft-type-k)); default the plan's.
        type: str
        choices:
          - f32
          - f16
          - bf16
          - q8_0
          - q4_0
          - q4_1
          - iq4_nl
          - q5_0
          - q5_1
        default: f16
      draft_cache_type_v:
        description: KV cache type V of the MTP draft context (C(--spec-draft-type-v)); default the plan's.
        type: str
        choices:
          - f32
          - f16
          - bf16
          - q8_0
          - q4_0
          - q4_1
          - iq4_nl
          - q5_0
          - q5_1
        default: f16
      slot_prompt_similarity:
        description: >-
          C(--slot-prompt-similarity), 0-1. The default 0 makes every slot switch save the slot's prompt to
          llama-server's host-memory prompt cache (C(--cache-ram)) and load the request's best match from it, so
          conversations that share a system prompt keep their prefixes when there are more of them than slots
          (llama.cpp's own 0.1 reuses a similar slot without saving it). The default is rendered only where the binary
          has the flag and C(--cache-ram); refused with C(--cache-ram 0) in C(extra_args).
        type: float
        default: 0.0
      rope_scaling:
        description: Opt into a context above the training one.
        type: str
        choices:
          - linear
          - yarn
      rope_scale:
        description: --rope-scale (with rope_scaling).
        type: float
      temp:
        description: Default sampling temperature (C(--temp)); unset = llama-server's.
        type: float
      top_k:
        description: Default top-k (C(--top-k)).
        type: int
      top_p:
        description: Default top-p (C(--top-p)).
        type: float
      min_p:
        description: Default min-p (C(--min-p)).
        type: float
      repeat_penalty:
        description: Default repeat penalty (C(--repeat-penalty)).
        type: float
      alias:
        description: >-
          More names the instance answers to, comma-separated (C(--alias)). The declared model's name is always one of
          them, also without this field (a C(model_path) instance: the file's name without C(.gguf)), so responses'
          C(model) and the instance's C(/v1/models) carry a name, never a host path; llama-server keeps the names
          sorted and reports the alphabetically first.
        type: str
      api_key:
        description: >-
          API key (vault it). Written to C(<config_dir>/<name>.key) (root, 0600) and handed to the server as a systemd
          credential, read with C(--api-key-file); it is never in argv or a world-readable file.
        type: str
      allow_unauthenticated:
        description: Allow a non-loopback C(host) without an API key.
        type: bool
        default: false
      devices:
        description: nvidia-smi indices of the GPUs, instead of the plan's (an empty list means CPU).
        type: list
        elements: int
      max_gpus:
        description: At most this many GPUs per replica.
        type: int
      tensor_split:
        description: C(--tensor-split) with explicit C(devices) ("3,1" or a list); with a plan the plan's.
        type: raw
      split_mode:
        description: C(--split-mode); default the plan's (none for one GPU, layer across GPUs).
        type: str
        choices:
          - auto
          - none
          - layer
          - row
          - tensor
        default: auto
      main_gpu:
        description: C(--main-gpu); default the plan's.
        type: int
      n_gpu_layers:
        description: C(--n-gpu-layers); default the plan's (0 on CPU).
        type: int
      force_split_mode_tensor:
        description: Accept C(--split-mode tensor) together with MTP (known llama-server crashes).
        type: bool
        default: false
      threads:
        description: >-
          C(--threads). On a host that several instances share it is also how many whole cores of its own the instance
          gets (C(CPUAffinity=)); unset there, the instances share the cores evenly and C(--threads) and
          C(--threads-batch) follow. An instance alone on its host keeps llama.cpp's own choice.
        type: int
      threads_batch:
        description: C(--threads-batch).
        type: int
      allow_oversubscribe:
        description: Share the host's cores with the other instances (no cores of its own, llama.cpp's thread count).
        type: bool
        default: false
      batch_size:
        description: C(--batch-size); the plan counts it (the compute buffers and outputs it sizes); unset - 2048.
        type: int
      ubatch_size:
        description: C(--ubatch-size); the plan sizes the compute buffers for it; unset - 512.
        type: int
      webui:
        description: Keep llama-server's web UI (otherwise C(--no-webui)).
        type: bool
        default: false
      metrics:
        description: Prometheus C(/metrics) (C(--metrics)).
        type: bool
        default: true
      extra_args:
        description: >-
          More arguments, one token per item (C(["--top-nsigma", "1.0"])); flags the role renders, API keys and flags
          the binary does not know are refused.
        type: list
        elements: str
        default: []
      environment:
        description: More environment variables (not the API key, not the CUDA device variables).
        type: dict
        default: {}
      replicas:
        description: >-
          Number of instances, or C(auto) for one per instance of the plan; more than one are named C(<name>-<i>) on
          ports port+i.
        type: raw
        default: 1
      health_timeout:
        description: Seconds the health gate waits; default base + per-GiB time for the model's size.
        type: int
      # END FIELDS
  binary:
    description: Path of the llama-server executable the units run.
    type: path
    required: true
  capabilities:
    description: The C(capabilities) of M(llamafleet.mtp.llama_server_capabilities) for O(binary).
    type: dict
    required: true
  models:
    description: C(model_fetch_facts) (model name -> C(path), C(sha256), C(gguf), ...).
    type: dict
    default: {}
  plans:
    description: C(llamafleet_plan) (instance name -> the C(plan) of M(llamafleet.mtp.tensor_split)).
    type: dict
    default: {}
  config_dir:
    description: Directory of the instances' environment and key files.
    type: path
    default: /etc/llama-server
  user:
    description: The service user (to warn about model files it cannot read).
    type: str
    default: llama-server
  group:
    description:
      - The service user's primary group, which reads the model files on a host where the user does not exist yet
        (the role creates it after this check).
    type: str
    default: llama-server
  advertise_host:
    description: Host name used in the published URL of instances bound to a wildcard address.
    type: str
  health_timeout_base:
    description: Health-gate timeout, fixed part in seconds.
    type: int
    default: 60
  binary_identity:
    description:
      - What the environment file names as the binary's identity, instead of the binary's path, size and mtime.
        The role passes C(pending <build>) in check mode when a new build would be installed, so the predicted
        environment file differs from the current one exactly as the real run's will.
    type: str
  health_timeout_per_gib:
    description: Health-gate timeout, seconds per GiB of model.
    type: int
    default: 30
extends_documentation_fragment:
  - llamafleet.mtp.attributes.read_only
"""

EXAMPLES = r"""
- name: Render the instances
  llamafleet.mtp.llama_server_args:
    instances:
      - name: qwen
        model: qwen36-27b
        port: 8080
        api_key: "{{ vault_qwen_api_key }}"
    binary: "{{ llamacpp_mtp_build_facts.server }}"
    capabilities: "{{ llamacpp_mtp_build_facts.capabilities }}"
    models: "{{ model_fetch_facts }}"
    plans: "{{ llamafleet_plan | default({}) }}"
  register: rendered
"""

RETURN = r"""
instances:
  description: One entry per systemd instance (replicas expanded).
  returned: success
  type: list
  elements: dict
  contains:
    name:
      description: Instance name (C(<name>-<i>) for replicas).
      type: str
    config_name:
      description: The name in O(instances).
      type: str
    unit:
      description: C(llama-server@<name>.service).
      type: str
    host:
      description: Bind address.
      type: str
    port:
      description: Port.
      type: int
    parallel:
      description: Slots (C(--parallel)), the requests it decodes at once; the gateway lets that many through.
      type: int
    cpus:
      description: The logical CPUs of its own (C(CPUAffinity=)) on a host it shares with other instances, else null.
      type: list
      elements: int
    url:
      description: Base URL (a wildcard bind uses O(advertise_host)).
      type: str
    health_url:
      description: URL the health gate polls (loopback for wildcard binds).
      type: str
    mode:
      description: C(gpu) or C(cpu).
      type: str
    devices:
      description: nvidia-smi indices of its GPUs.
      type: list
      elements: int
    mtp:
      description: Whether MTP speculative decoding is on.
      type: bool
    spec_type:
      description: The C(--spec-type) value (C(mtp) or C(draft-mtp)), null without MTP.
      type: str
    model_path:
      description: The served GGUF file.
      type: str
    model_size_bytes:
      description: Size of the model (all parts).
      type: int
    api_key:
      description: Whether an API key is set.
      type: bool
    key_file:
      description: Root-only file the key is written to (systemd passes it as a credential).
      type: str
    args:
      description: The llama-server arguments.
      type: list
      elements: str
    env:
      description: Environment variables (C(CUDA_VISIBLE_DEVICES), C(CUDA_DEVICE_ORDER), ...).
      type: dict
    env_file:
      description: Content of C(<config_dir>/<name>.env).
      type: str
    dropin:
      description: Content of the unit drop-in (read-only model paths, credential, GPU relaxations).
      type: str
    health_timeout:
      description: Seconds the health gate waits.
      type: int
    notes:
      description: Flags left out because the binary lacks them.
      type: list
      elements: str
binary_identity:
  description: The binary's resolved path, size and modification time (in the env files, so a new build restarts).
  returned: success
  type: str
"""

import grp
import os
import pwd

from ansible_collections.llamafleet.mtp.plugins.module_utils import host_paths
from ansible_collections.llamafleet.mtp.plugins.module_utils.fleet_instances import argument_spec
from ansible_collections.llamafleet.mtp.plugins.module_utils.gguf_header import GGUFError, gguf_info
from ansible_collections.llamafleet.mtp.plugins.module_utils.llama_server_args import (
    ServerArgsError,
    model_info_from_gguf,
    model_path_for,
    render,
)
from ansible_collections.llamafleet.mtp.plugins.module_utils.secret_module import AnsibleModule


def _stat_identity(paths: list[str]) -> str:
    parts = []
    for p in paths:
        st = os.stat(p)
        parts.append(f"{os.path.realpath(p)}:{st.st_size}:{st.st_mtime_ns}")
    return " ".join(parts)


def _unreadable(paths: list[str], user: str, group: str) -> list[str]:
    try:
        pw = pwd.getpwnam(user)
        uid, gids = pw.pw_uid, {pw.pw_gid}
    except KeyError:
        # A fresh host: the role creates the user after this check, in its group (model_fetch gives the files that
        # group), so the group is what will read them; with no group yet either there is nothing to judge.
        try:
            uid, gids = None, {grp.getgrnam(group).gr_gid}
        except KeyError:
            return []
    bad = []
    for p in paths:
        st = os.stat(p)
        if (
            st.st_mode & 0o004
            or (st.st_uid == uid and st.st_mode & 0o400)
            or (st.st_gid in gids and st.st_mode & 0o040)
        ):
            continue
        bad.append(p)
    return bad


def main() -> None:
    suboptions = argument_spec()
    module = AnsibleModule(
        argument_spec={
            "instances": {"type": "list", "elements": "dict", "required": True, "options": suboptions},
            "binary": {"type": "path", "required": True},
            "capabilities": {"type": "dict", "required": True},
            "models": {"type": "dict", "default": {}},
            "plans": {"type": "dict", "default": {}},
            **host_paths.options("config_dir"),
            "user": {"type": "str", "default": "llama-server"},
            "group": {"type": "str", "default": "llama-server"},
            "advertise_host": {"type": "str"},
            "health_timeout_base": {"type": "int", "default": 60},
            "health_timeout_per_gib": {"type": "int", "default": 30},
            "binary_identity": {"type": "str"},
        },
        supports_check_mode=True,
    )
    p = module.params
    binary = p["binary"]
    binary_identity = p["binary_identity"]
    if binary_identity is None:
        if not os.path.isfile(binary) or not os.access(binary, os.X_OK):
            module.fail_json(
                msg=f"llama-server binary {binary} does not exist or is not executable; build/install it first"
            )
        st = os.stat(binary)
        binary_identity = f"{os.path.realpath(binary)}:{st.st_size}:{st.st_mtime_ns}"

    models = p["models"] or {}
    model_info, problems = {}, []
    for inst in p["instances"]:
        path, problem = model_path_for(inst, models)
        if problem or path in model_info:
            continue
        entry = models.get(inst.get("model")) if inst.get("model") else None
        try:
            if entry and entry.get("gguf"):
                gguf = entry["gguf"]
                paths = (gguf.get("split") or {}).get("paths") or [path]
                shas = [f["sha256"] for f in entry.get("files") or [] if f.get("sha256")] or [entry.get("sha256")]
                identity = "sha256:" + ",".join(shas) if all(shas) else _stat_identity(paths)
            else:
                gguf = gguf_info(path)
                paths = gguf["split"]["paths"]
                identity = _stat_identity(paths)
        except GGUFError as e:
            problems.append(f"instance {inst['name']!r}: model {path}: {e}")
            continue
        except OSError as e:
            problems.append(f"instance {inst['name']!r}: model {path}: {e.strerror or e}")
            continue
        model_info[path] = model_info_from_gguf(gguf, identity)
        for bad in _unreadable(paths, p["user"], p["group"]):
            module.warn(f"model file {bad} is not readable by {p['user']}; llama-server will fail to load it")
    if problems:
        module.fail_json(
            msg="llama_server_systemd: nothing was changed; fix these and run again:\n- " + "\n- ".join(problems)
        )

    try:
        instances = render(
            p["instances"],
            capabilities=p["capabilities"],
            model_info=model_info,
            models=models,
            plans=p["plans"],
            binary=binary,
            binary_identity=binary_identity,
            config_dir=p["config_dir"],
            advertise_host=p["advertise_host"],
            health_base_s=p["health_timeout_base"],
            health_per_gib_s=p["health_timeout_per_gib"],
        )
    except ServerArgsError as e:
        module.fail_json(msg=str(e), problems=e.problems)
    module.exit_json(changed=False, instances=instances, binary_identity=binary_identity)


if __name__ == "__main__":
    main()
