"""The declared state of a host and the one instance resolver.

Pure logic, no Ansible imports. Everything a host should run is declared in the inventory:

* the llama.cpp ref (``llamacpp_mtp_build_ref``; ``playbooks/upgrade.yml`` writes the fleet-wide value into
  ``<inventory>/group_vars/all/llamafleet_release.yml``);
* the models (``llamafleet_models``) and the model upgrades (``llamafleet_release_models``: instance -> model);
* the instances (``llamafleet_instances``, fields in ``FIELDS`` below);
* the benchmark's autotune result (``llamafleet_autotune``: instance -> ``{draft_n_max, spec_draft_p_min}``, or
  the best draft-n-max alone as written before p-min was tuned).

``resolve`` turns that into one list of complete, validated instances: defaults applied once, autotune and
model upgrades applied once. The planner's settings (``planner_kwargs``) and the server's arguments
(``llama_server_args.render``) are both derived from the resolved instance, so they cannot disagree.
``FIELDS`` is the only place an instance field, its default and its check are written: the server role's
``meta/argument_specs.yml`` and the modules' DOCUMENTATION are checked against it by a unit test.

Every problem names the host, the instance and the field, and all of them are listed at once.
"""

from __future__ import annotations

import difflib
import ipaddress
import re

from ansible_collections.llamafleet.mtp.plugins.module_utils.cpu_cores import divide as cores_divide
from ansible_collections.llamafleet.mtp.plugins.module_utils.llamacpp_build import BuildInputError, parse_ref
from ansible_collections.llamafleet.mtp.plugins.module_utils.tensor_plan import (
    DEFAULT_DRAFT_N_MAX,
    PlanError,
    plan,
    tensor_split_mtp_problem,
)

# The llama.cpp ref when the inventory declares none (PR ggml-org/llama.cpp#22673 merged as b9180).
# The llamacpp_mtp_build role's default is the same (checked by a unit test).
DEFAULT_REF = "b9180"
DRAFT_N_MAX_LIMIT = 16  # llama.cpp's default --spec-draft-n-max; above it a draft is mostly rejected work
CACHE_TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]
SPLIT_MODES = ["auto", "none", "layer", "row", "tensor"]
FLASH_ATTN = ["on", "off", "auto"]
ROPE_SCALING = ["linear", "yarn"]

# name -> spec. "default": applied by resolve (None: not rendered, llama-server's own default, or the
# plan's where "plan" names the planner option). "flag": a value llama-server takes as it is - the flag it renders
# to, then its other spellings (extra_args may not use any of them); rendered only where the built binary lists
# the flag (else refused, naming the field; a default with "default_if_known" - more flags it needs - is left out
# instead where the binary lacks one of them), and only with MTP on where "with_mtp". "doc": the one description
# (scripts/field_docs.py writes the fields into the role's argument_specs and the llama_server_args module's
# DOCUMENTATION; a unit test fails when they are stale).
FIELDS: dict = {
    "name": {
        "type": "str",
        "required": True,
        "doc": "Instance name; the unit is C(llama-server@<name>.service). a-z, 0-9, '.', '_', '-'.",
    },
    "model": {"type": "str", "doc": "A model name of C(model_fetch_facts); its C(path) is served."},
    "model_path": {"type": "path", "doc": "The GGUF file to serve (first part of a split GGUF), instead of C(model)."},
    "host": {
        "type": "str",
        "default": "127.0.0.1",
        "doc": "Address to bind. A non-loopback address needs C(api_key) or C(allow_unauthenticated).",
    },
    "port": {
        "type": "int",
        "required": True,
        "min": 1024,
        "max": 65535,
        "why": "the service runs without CAP_NET_BIND_SERVICE; put a reverse proxy in front for a low port",
        "doc": "TCP port, 1024-65535 (the service has no capabilities); replica i uses port + i.",
    },
    "context": {
        "type": "int",
        "min": 1,
        "plan": "context",
        "doc": "Total context (C(--ctx-size)) over all slots; default the plan's, else the model's.",
    },
    "parallel": {
        "type": "int",
        "default": 1,
        "min": 1,
        "plan": "parallel",
        "doc": "Server slots (C(--parallel)); default the plan's, else 1 (recommended with MTP).",
    },
    "kv_unified": {
        "type": "bool",
        "default": False,
        "plan": "kv_unified",
        "doc": "Unified KV cache (C(--kv-unified)); default the plan's.",
    },
    "cache_type_k": {
        "type": "str",
        "default": "f16",
        "choices": CACHE_TYPES,
        "plan": "cache_type_k",
        "doc": "KV cache type for K (C(--cache-type-k)); default the plan's.",
    },
    "cache_type_v": {
        "type": "str",
        "default": "f16",
        "choices": CACHE_TYPES,
        "plan": "cache_type_v",
        "doc": "KV cache type for V (C(--cache-type-v)); default the plan's.",
    },
    "flash_attn": {
        "type": "str",
        "choices": FLASH_ATTN,
        "doc": "Flash attention (C(--flash-attn)); unset = llama-server's auto.",
    },
    "mtp": {
        "type": "bool",
        "plan": "mtp",
        "doc": (
            "MTP speculative decoding with the spelling the binary knows; default the plan's, else true. "
            "Refused for a model without MTP (nextn) layers or a binary without MTP."
        ),
    },
    "draft_n_max": {
        "type": "int",
        "default": DEFAULT_DRAFT_N_MAX,
        "min": 1,
        "max": DRAFT_N_MAX_LIMIT,
        "why": "tokens drafted per step (--spec-draft-n-max); MTP pays off at 1-4, llama.cpp's own default is 16",
        "plan": "draft_n_max",
        "doc": "Drafted tokens per step (C(--spec-draft-n-max)), 1-16; default the plan's, else 2.",
    },
    "spec_draft_p_min": {
        "type": "float",
        "min": 0.0,
        "max": 1.0,
        "why": "a probability: MTP stops a draft at a token the model gives less than this (--spec-draft-p-min)",
        "doc": (
            "C(--spec-draft-p-min), 0-1 - MTP stops a draft at a token whose top probability is below it; "
            "unset - llama.cpp's default (0). Rendered with MTP on; refused for a binary without the flag. "
            "C(playbooks/bench.yml --tags autotune) measures a few values and keeps the best "
            "(C(llamafleet_autotune))."
        ),
        "flag": ["--spec-draft-p-min", "--draft-p-min"],
        "with_mtp": True,
    },
    "spec_draft_n_min": {
        "type": "int",
        "min": 0,
        "max": DRAFT_N_MAX_LIMIT,
        "why": "a draft shorter than this is discarded (--spec-draft-n-min); at most draft_n_max",
        "doc": (
            "C(--spec-draft-n-min), 0-16 and at most C(draft_n_max) - drafts shorter than this are "
            "discarded; unset - llama.cpp's default (0). Rendered with MTP on; refused for a binary without "
            "the flag."
        ),
        "flag": ["--spec-draft-n-min"],
        "with_mtp": True,
    },
    "draft_cache_type_k": {
        "type": "str",
        "default": "f16",
        "choices": CACHE_TYPES,
        "plan": "draft_cache_type_k",
        "doc": "KV cache type K of the MTP draft context (C(--spec-draft-type-k)); default the plan's.",
    },
    "draft_cache_type_v": {
        "type": "str",
        "default": "f16",
        "choices": CACHE_TYPES,
        "plan": "draft_cache_type_v",
        "doc": "KV cache type V of the MTP draft context (C(--spec-draft-type-v)); default the plan's.",
    },
    "slot_prompt_similarity": {
        "type": "float",
        "default": 0.0,
        "min": 0.0,
        "max": 1.0,
        "why": "a fraction of the request's prompt (--slot-prompt-similarity); 0 turns the similarity pick off",
        "flag": ["--slot-prompt-similarity", "-sps"],
        "default_if_known": ["--cache-ram"],
        "doc": (
            "C(--slot-prompt-similarity), 0-1. The default 0 makes every slot switch save the slot's prompt to "
            "llama-server's host-memory prompt cache (C(--cache-ram)) and load the request's best match from it, "
            "so conversations that share a system prompt keep their prefixes when there are more of them than "
            "slots (llama.cpp's own 0.1 reuses a similar slot without saving it). The default is rendered only "
            "where the binary has the flag and C(--cache-ram); refused with C(--cache-ram 0) in C(extra_args)."
        ),
    },
    "rope_scaling": {"type": "str", "choices": ROPE_SCALING, "doc": "Opt into a context above the training one."},
    "rope_scale": {"type": "float", "doc": "--rope-scale (with rope_scaling)."},
    "temp": {
        "type": "float",
        "flag": ["--temp", "--temperature"],
        "doc": "Default sampling temperature (C(--temp)); unset = llama-server's.",
    },
    "top_k": {"type": "int", "flag": ["--top-k"], "doc": "Default top-k (C(--top-k))."},
    "top_p": {"type": "float", "flag": ["--top-p"], "doc": "Default top-p (C(--top-p))."},
    "min_p": {"type": "float", "flag": ["--min-p"], "doc": "Default min-p (C(--min-p))."},
    "repeat_penalty": {
        "type": "float",
        "flag": ["--repeat-penalty"],
        "doc": "Default repeat penalty (C(--repeat-penalty)).",
    },
    "alias": {
        "type": "str",
        "doc": (
            "More names the instance answers to, comma-separated (C(--alias)). The declared model's name is always "
            "one of them, also without this field (a C(model_path) instance: the file's name without C(.gguf)), so "
            "responses' C(model) and the instance's C(/v1/models) carry a name, never a host path; llama-server "
            "keeps the names sorted and reports the alphabetically first."
        ),
    },
    "api_key": {
        "type": "str",
        "no_log": True,
        "doc": (
            "API key (vault it). Written to C(<config_dir>/<name>.key) (root, 0600) and handed to the server"
            " as a systemd credential, read with C(--api-key-file); it is never in argv or a world-readable "
            "file."
        ),
    },
    "allow_unauthenticated": {
        "type": "bool",
        "default": False,
        "doc": "Allow a non-loopback C(host) without an API key.",
    },
    "devices": {
        "type": "list",
        "elements": "int",
        "plan": "devices",
        "doc": "nvidia-smi indices of the GPUs, instead of the plan's (an empty list means CPU).",
    },
    "max_gpus": {"type": "int", "min": 1, "plan": "max_gpus", "doc": "At most this many GPUs per replica."},
    "tensor_split": {
        "type": "raw",
        "doc": 'C(--tensor-split) with explicit C(devices) ("3,1" or a list); with a plan the plan\'s.',
    },
    "split_mode": {
        "type": "str",
        "default": "auto",
        "choices": SPLIT_MODES,
        "plan": "split_mode",
        "doc": "C(--split-mode); default the plan's (none for one GPU, layer across GPUs).",
    },
    "main_gpu": {"type": "int", "doc": "C(--main-gpu); default the plan's."},
    "n_gpu_layers": {"type": "int", "doc": "C(--n-gpu-layers); default the plan's (0 on CPU)."},
    "force_split_mode_tensor": {
        "type": "bool",
        "default": False,
        "plan": "force_tensor_split",
        "doc": "Accept C(--split-mode tensor) together with MTP (known llama-server crashes).",
    },
    "threads": {
        "type": "int",
        "min": 1,
        "doc": (
            "C(--threads). On a host that several instances share it is also how many whole cores of its own"
            " the instance gets (C(CPUAffinity=)); unset there, the instances share the cores evenly and "
            "C(--threads) and C(--threads-batch) follow. An instance alone on its host keeps llama.cpp's own"
            " choice."
        ),
    },
    "threads_batch": {"type": "int", "min": 1, "doc": "C(--threads-batch)."},
    "allow_oversubscribe": {
        "type": "bool",
        "default": False,
        "doc": ("Share the host's cores with the other instances (no cores of its own, llama.cpp's thread count)."),
    },
    "batch_size": {
        "type": "int",
        "min": 1,
        "plan": "n_batch",
        "doc": "C(--batch-size); the plan counts it (the compute buffers and outputs it sizes); unset - 2048.",
    },
    "ubatch_size": {
        "type": "int",
        "min": 1,
        "plan": "n_ubatch",
        "doc": "C(--ubatch-size); the plan sizes the compute buffers for it; unset - 512.",
    },
    "webui": {"type": "bool", "default": False, "doc": "Keep llama-server's web UI (otherwise C(--no-webui))."},
    "metrics": {"type": "bool", "default": True, "doc": "Prometheus C(/metrics) (C(--metrics))."},
    "extra_args": {
        "type": "list",
        "elements": "str",
        "default": [],
        "doc": (
            'More arguments, one token per item (C(["--top-nsigma", "1.0"])); flags the role renders, API '
            "keys and flags the binary does not know are refused."
        ),
    },
    "environment": {
        "type": "dict",
        "default": {},
        "doc": "More environment variables (not the API key, not the CUDA device variables).",
    },
    "replicas": {
        "type": "raw",
        "default": 1,
        "plan": "replicas",
        "doc": (
            "Number of instances, or C(auto) for one per instance of the plan; more than one are named "
            "C(<name>-<i>) on ports port+i."
        ),
    },
    "health_timeout": {
        "type": "int",
        "doc": "Seconds the health gate waits; default base + per-GiB time for the model's size.",
    },
}
# Every spelling of the flags this role renders itself, and the instance field to use instead.
CONTROLLED_FLAGS = {
    "model / model_path": ["-m", "--model", "-mu", "--model-url", "-hf", "-hfr", "--hf-repo"],
    "host": ["--host"],
    "port": ["--port"],
    "alias": ["-a", "--alias"],
    "context": ["-c", "--ctx-size"],
    "parallel": ["-np", "--parallel"],
    "kv_unified": ["-kvu", "--kv-unified", "-no-kvu", "--no-kv-unified"],
    "cache_type_k": ["-ctk", "--cache-type-k"],
    "cache_type_v": ["-ctv", "--cache-type-v"],
    "flash_attn": ["-fa", "--flash-attn"],
    "mtp": ["--spec-type"],
    "draft_n_max": ["--spec-draft-n-max"],
    "draft_cache_type_k": ["-ctkd", "--spec-draft-type-k", "--cache-type-k-draft"],
    "draft_cache_type_v": ["-ctvd", "--spec-draft-type-v", "--cache-type-v-draft"],
    "devices (CUDA_VISIBLE_DEVICES)": ["-dev", "--device"],
    "n_gpu_layers": ["-ngl", "--gpu-layers", "--n-gpu-layers"],
    "split_mode": ["-sm", "--split-mode"],
    "main_gpu": ["-mg", "--main-gpu"],
    "tensor_split": ["-ts", "--tensor-split"],
    "threads": ["-t", "--threads"],
    "threads_batch": ["-tb", "--threads-batch"],
    "batch_size": ["-b", "--batch-size"],
    "ubatch_size": ["-ub", "--ubatch-size"],
    "rope_scaling": ["--rope-scaling", "--rope-scale"],
    "metrics": ["--metrics"],
    "webui": ["--ui", "--webui", "--no-ui", "--no-webui"],
    "api_key": ["--api-key", "--api-key-file"],
}
# the fields that render a flag as it is (FIELDS' "flag"), every spelling
CONTROLLED_FLAGS.update({key: list(spec["flag"]) for key, spec in FIELDS.items() if spec.get("flag")})
CONTROLLED = {flag: field for field, flags in CONTROLLED_FLAGS.items() for flag in flags}
# Environment variables that carry secrets or that the role sets itself.
RESERVED_ENV = {
    "LLAMA_SERVER_ARGS": "the arguments (use the instance fields or extra_args)",
    "LLAMA_API_KEY": "the API key (use api_key: it goes through a root-only credential file)",
    "LLAMA_ARG_API_KEY": "the API key (use api_key: it goes through a root-only credential file)",
    "LLAMA_ARG_API_KEY_FILE": "the API key file (use api_key)",
    "CUDA_VISIBLE_DEVICES": "the GPUs (use devices or the tensor_split plan)",
    "CUDA_DEVICE_ORDER": "the GPU order (always PCI_BUS_ID, to match nvidia-smi's indices)",
}

# Settings the plan decides when the instance leaves them unset (the server then uses the plan's value).
PLANNED = ("context", "mtp")

ANSIBLE_SPEC_KEYS = ("type", "required", "default", "choices", "elements", "no_log")


def served_names(inst, model_path=None):
    """The names an instance answers to, as its --alias renders them: the declared model's name first (an instance
    declared by model_path: the file's name without .gguf and a split part's -0000K-of-0000N), then the names of
    its alias field (comma-separated), each once."""
    first = inst.get("model")
    path = model_path or inst.get("model_path")
    if not first and path:
        first = re.sub(r"(-\d{5}-of-\d{5})?\.gguf$", "", str(path).rstrip("/").rsplit("/", 1)[-1])
    names = [first] if first else []
    for name in str(inst.get("alias") or "").split(","):
        name = name.strip()
        if name and name not in names:
            names.append(name)
    return names


def argument_spec():
    """FIELDS as an Ansible argument spec (suboptions of an ``instances`` option)."""
    return {k: {kk: _copy(v[kk]) for kk in ANSIBLE_SPEC_KEYS if kk in v} for k, v in FIELDS.items()}


_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")


class DeclaredStateError(Exception):
    """Bad declared state; ``problems`` lists every one found."""

    def __init__(self, problems):
        self.problems = list(dict.fromkeys(problems))
        super().__init__(
            "llamafleet: nothing was changed; fix the declared state (inventory) and run again:\n- "
            + "\n- ".join(self.problems)
        )


def where(host, instance=None, field=None):
    """``host h, instance 'i', field 'f'``: the prefix of every message."""
    parts = [f"host {host}"] if host else []
    if instance is not None:
        parts.append(f"instance {instance!r}")
    if field is not None:
        parts.append(f"field {field!r}")
    return ", ".join(parts)


def _copy(value):
    return list(value) if isinstance(value, list) else dict(value) if isinstance(value, dict) else value


def _type_ok(spec, value):
    t = spec["type"]
    if t in ("str", "path"):
        return isinstance(value, str)
    if t == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if t == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t == "bool":
        return isinstance(value, bool)
    if t == "list":
        if not isinstance(value, list):
            return False
        if spec.get("elements") == "int":
            return all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        if spec.get("elements") == "str":
            return all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value)
        return True
    if t == "dict":
        return isinstance(value, dict)
    return True


def _coerce(spec, value):
    """Ansible templating turns ints into strings ("4096"); accept what the role's argument spec would."""
    t = spec["type"]
    if isinstance(value, str):
        v = value.strip()
        if t == "int" and re.match(r"^-?\d+$", v):
            return int(v)
        if t == "float" and re.match(r"^-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$", v):
            return float(v)
        if t == "bool" and v.lower() in ("true", "false", "yes", "no"):
            return v.lower() in ("true", "yes")
    if t == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def in_bounds(spec, value):
    """Whether a number is within a field spec's min/max (a field without bounds takes any)."""
    return ("min" not in spec or value >= spec["min"]) and ("max" not in spec or value <= spec["max"])


def _bounds_text(key, spec, value):
    lo, hi = spec.get("min"), spec.get("max")
    if hi is None:
        want = "a positive integer" if lo == 1 else f"at least {lo}"
        text = f"must be {want}, got {value!r}"
    else:
        text = f"{key} {value!r} must be {lo}-{hi}"
    return text + (f" ({spec['why']})" if spec.get("why") else "")


# systemd splits $LLAMA_SERVER_ARGS at whitespace and has no quoting: a value must hold none of these.
SAFE_WORD = re.compile(r"^[^\s\"'\\$`]+$")


def is_loopback(host):
    """Whether a bind address is loopback only (127.0.0.0/8, ::1, localhost)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def access_problems(inst, host=None):
    """Where an instance listens and who may use it (host, api_key): checked by the resolver, before any host
    changes, and again by llama_server_args for a direct caller. ``inst``: a normalized instance."""
    label, problems = inst.get("name"), []
    bind = str(inst.get("host") or "127.0.0.1")
    if "," in bind or bind.endswith(".sock") or not SAFE_WORD.match(bind):
        problems.append(
            f"{where(host, label, 'host')}: host {bind!r} must be one IP address or host name (no lists, no UNIX "
            "sockets)"
        )
    key = inst.get("api_key")
    has_key = bool(key)
    if key is not None and not has_key:
        problems.append(f"{where(host, label, 'api_key')}: api_key is empty; remove it or set a key")
    if has_key and isinstance(key, str) and ("\n" in key or "\r" in key or "," in key):
        problems.append(
            f"{where(host, label, 'api_key')}: api_key may not contain newlines or commas (one key per instance)"
        )
    if not has_key and not is_loopback(bind) and not inst.get("allow_unauthenticated"):
        problems.append(
            f"{where(host, label, 'host')}: host {bind} is not a loopback address and there is no api_key; anyone "
            "who can reach the port could use the model. Set api_key (vault it), bind 127.0.0.1, or set "
            "allow_unauthenticated: true to accept that"
        )
    return problems


_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NUMBER = re.compile(r"^-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def tensor_split_parts(value):
    """A declared tensor_split ("3,1" or [3, 1]) as its parts (strings), or None when it is not non-negative
    numbers."""
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    parts = [str(p).strip() for p in items]
    if not parts or not all(_NUMBER.match(p) and not p.startswith("-") for p in parts):
        return None
    return parts


def is_flag(token):
    """Whether an extra_args item is a flag (not a value such as -1 or -0.5)."""
    return token.startswith("-") and not _NUMBER.match(token)


def controlled_flag(token):
    """The flag of an extra_args item when it is one the role renders itself (else None)."""
    flag = token.split("=", 1)[0]
    return flag if is_flag(token) and flag in CONTROLLED else None


def _extra_args_problems(inst, host, label):
    problems = []
    for tok in inst.get("extra_args") or []:
        tok = str(tok)
        if not SAFE_WORD.match(tok):
            problems.append(
                f"{where(host, label, 'extra_args')}: item {tok!r} contains whitespace, a quote, a backslash or '$'; "
                "pass the flag and its value as separate items without quoting"
            )
        elif controlled_flag(tok):
            flag = controlled_flag(tok)
            field = CONTROLLED[flag]
            why = (
                "API keys never go on the command line; set api_key (delivered as a root-only credential file)"
                if field == "api_key"
                else f"the role renders it; set the instance's {field} instead"
            )
            problems.append(f"{where(host, label, 'extra_args')}: may not contain {flag}: {why}")
    return problems


def _prompt_cache_off(extra_args):
    """Whether extra_args turns llama-server's host-memory prompt cache off (--cache-ram 0, -cram 0, =0)."""
    tokens = [str(t) for t in extra_args]
    for i, tok in enumerate(tokens):
        flag, eq, value = tok.partition("=")
        if flag in ("--cache-ram", "-cram"):
            value = value if eq else (tokens[i + 1] if i + 1 < len(tokens) else "")
            if value.strip() in ("0", "+0", "-0"):
                return True
    return False


def environment_ok(key, value):
    """Whether an instance may set this environment variable to this value (as text)."""
    return bool(_ENV_KEY.match(key)) and key not in RESERVED_ENV and (not value or bool(SAFE_WORD.match(value)))


def _environment_problems(inst, host, label):
    problems = []
    for key, value in (inst.get("environment") or {}).items():
        key, text = str(key), str(value)
        if environment_ok(key, text):
            continue
        if not _ENV_KEY.match(key):
            problems.append(f"{where(host, label, 'environment')}: {key!r} is not a valid variable name")
        elif key in RESERVED_ENV:
            problems.append(
                f"{where(host, label, 'environment')}: may not set {key}: the role sets {RESERVED_ENV[key]}"
            )
        else:
            problems.append(
                f"{where(host, label, 'environment')}: {key} value contains whitespace, a quote, a backslash or '$'"
            )
    return problems


def value_problems(inst, host=None):
    """The rules of the placement and pass-through fields that need no binary (tensor_split, devices, extra_args,
    environment): checked by the resolver, before any host changes, and again by llama_server_args for a direct
    caller. ``inst``: a normalized instance (fields of the wrong type were reported by normalize)."""
    label, problems = inst.get("name"), []
    split = inst.get("tensor_split")
    if split is not None and tensor_split_parts(split) is None:
        problems.append(f"{where(host, label, 'tensor_split')}: must be non-negative numbers like '3,1' or [3, 1]")
    devices = inst.get("devices")
    if isinstance(devices, list) and all(isinstance(d, int) for d in devices):
        if len(set(devices)) != len(devices) or any(d < 0 for d in devices):
            problems.append(f"{where(host, label, 'devices')}: must be distinct nvidia-smi indices, got {devices}")
        replicas = inst.get("replicas")
        replicas = int(replicas) if isinstance(replicas, str) and replicas.strip().isdigit() else replicas
        if devices and isinstance(replicas, int) and not isinstance(replicas, bool) and replicas > 1:
            problems.append(
                f"{where(host, label, 'devices')}: explicit devices with replicas {replicas} would put every "
                "replica on the same GPUs; drop devices and let the tensor_split plan (replicas: auto) place them"
            )
    if isinstance(inst.get("extra_args"), list):
        problems += _extra_args_problems(inst, host, label)
        if inst.get("slot_prompt_similarity") == 0 and _prompt_cache_off(inst["extra_args"]):
            problems.append(
                f"{where(host, label, 'slot_prompt_similarity')}: 0 (the default) relies on llama-server's "
                "host-memory prompt cache, which extra_args turns off (--cache-ram 0): set slot_prompt_similarity "
                "(llama.cpp's own default is 0.1) or drop --cache-ram 0"
            )
    if isinstance(inst.get("environment"), dict):
        problems += _environment_problems(inst, host, label)
    return problems


def _close(name, known):
    match = difflib.get_close_matches(name.replace("-", "_"), list(known), n=1, cutoff=0.75)
    return match[0] if match else None


def normalize(raw, host=None, fields=None):
    """One instance: defaults applied, types and choices checked; returns ``(instance, problems)``."""
    fields = fields or FIELDS
    if not isinstance(raw, dict):
        return {}, [f"{where(host)}: an instance must be a mapping, got {type(raw).__name__}"]
    label = raw.get("name")
    problems = []
    for key in sorted(set(raw) - set(fields)):
        hint = _close(str(key), fields)
        problems.append(f"{where(host, label, key)}: unknown field" + (f" (did you mean {hint!r}?)" if hint else ""))
    inst = {}
    for key, spec in fields.items():
        value = raw.get(key)
        if value is None:
            if spec.get("required"):
                problems.append(f"{where(host, label, key)}: is required")
            inst[key] = _copy(spec.get("default"))
            continue
        value = _coerce(spec, value)
        if not _type_ok(spec, value):
            what = spec["type"] + (f" of {spec['elements']}" if spec.get("elements") else "")
            problems.append(f"{where(host, label, key)}: must be a {what}, got {value!r}")
        elif spec.get("choices") and value not in spec["choices"]:
            problems.append(f"{where(host, label, key)}: must be one of {', '.join(spec['choices'])}, got {value!r}")
        elif not in_bounds(spec, value):
            problems.append(f"{where(host, label, key)}: {_bounds_text(key, spec, value)}")
        inst[key] = value
    return inst, problems


def _replicas_ok(value):
    if isinstance(value, str):
        v = value.strip().lower()
        return v == "auto" or (v.isdigit() and int(v) >= 1)
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


# The fields playbooks/bench.yml --tags autotune writes (llamafleet_autotune), each applied where the instance
# does not set it.
AUTOTUNED = ("draft_n_max", "spec_draft_p_min")


def _autotuned(value, host, label):
    """One instance's llamafleet_autotune entry as ``({field: value}, problems)``: a mapping of AUTOTUNED fields,
    or a bare draft-n-max (what the benchmark wrote before it tuned p-min); each checked as FIELDS says."""
    if value is None:
        return {}, []
    if not isinstance(value, dict):
        value = {"draft_n_max": value}
    out, problems = {}, []
    for key, v in value.items():
        spec = FIELDS.get(key)
        if key not in AUTOTUNED or spec is None:
            problems.append(
                f"{where(host, label, 'llamafleet_autotune')}: {key!r} is not a tuned field ({', '.join(AUTOTUNED)})"
            )
            continue
        v = _coerce(spec, v)
        if v is None:
            continue
        if not _type_ok(spec, v) or not in_bounds(spec, v):
            problems.append(f"{where(host, label, key)}: llamafleet_autotune gives {v!r}: {_bounds_text(key, spec, v)}")
            continue
        out[key] = v
    return out, problems


def _table_problems(names, host, autotune, model_overrides, instance_overrides):
    """Whether the per-instance tables (autotune, model upgrades, overrides) are mappings that name only declared
    instances."""
    problems = []
    for table, what in ((autotune, "llamafleet_autotune"), (model_overrides, "llamafleet_release_models")):
        if table is not None and not isinstance(table, dict):
            problems.append(f"{where(host)}, field {what!r}: must be a mapping of instance name to a value")
        for n in sorted(set(table or {}) - set(names)) if isinstance(table, dict) else []:
            problems.append(f"{where(host, n)}, field {what!r}: names an instance that is not declared")
    for n in sorted(set(instance_overrides or {}) - set(names)):
        problems.append(f"{where(host, n)}: an override names an instance that is not declared")
    return problems


def _merged(raw, host, autotune, model_overrides, instance_overrides):
    """One declared instance with its model upgrade, its autotune result (where it leaves the field unset) and its
    overrides applied, in that order; returns ``(merged, problems)``."""
    label = raw.get("name")
    merged = dict(raw)
    new_model = (model_overrides or {}).get(label) if isinstance(model_overrides, dict) else None
    if new_model is not None:
        merged["model"] = new_model
        merged.pop("model_path", None)
    best = (autotune or {}).get(label) if isinstance(autotune, dict) else None
    tuned, problems = _autotuned(best, host, label)
    merged.update({k: v for k, v in tuned.items() if raw.get(k) is None})
    merged.update((instance_overrides or {}).get(label) or {})
    return merged, problems


def _model_problems(inst, host, label, models):
    """Whether the instance serves exactly one of model / model_path, and a declared model."""
    if inst.get("model") and inst.get("model_path"):
        return [f"{where(host, label, 'model')}: set either model or model_path, not both"]
    if not inst.get("model") and not inst.get("model_path") and inst:
        return [f"{where(host, label, 'model')}: no model; set model (a llamafleet_models name)"]
    if models is not None and inst.get("model") and inst["model"] not in models:
        return [
            f"{where(host, label, 'model')}: {inst['model']!r} is not in llamafleet_models "
            f"(declared: {', '.join(sorted(models)) or 'none'})"
        ]
    return []


def _instance_problems(inst, host, label, models):
    """The rules of one normalized instance beyond each field's own type, choices and bounds: access, placement and
    pass-through values, name, replicas, model, draft lengths, rope scaling, tensor split with MTP."""
    problems = access_problems(inst, host) + value_problems(inst, host) if inst else []
    if not isinstance(label, str) or not _NAME.match(label or ""):
        problems.append(
            f"{where(host, label, 'name')}: must be 1-63 characters of a-z, 0-9, '.', '_' or '-', starting "
            "with a letter or digit (it becomes the systemd instance llama-server@<name>)"
        )
    if inst and not _replicas_ok(inst.get("replicas")):
        problems.append(f"{where(host, label, 'replicas')}: must be a positive integer or 'auto'")
    problems += _model_problems(inst, host, label, models)
    n_min, n_max = inst.get("spec_draft_n_min"), inst.get("draft_n_max")
    if isinstance(n_min, int) and isinstance(n_max, int) and n_min > n_max:
        problems.append(
            f"{where(host, label, 'spec_draft_n_min')}: {n_min} is above draft_n_max {n_max}: every draft would be "
            "discarded"
        )
    if inst.get("rope_scale") is not None and not inst.get("rope_scaling"):
        problems.append(f"{where(host, label, 'rope_scale')}: set rope_scaling (linear or yarn) with it")
    refused = tensor_split_mtp_problem(
        inst.get("split_mode"), inst.get("mtp"), inst.get("force_split_mode_tensor"), "force_split_mode_tensor"
    )
    if refused:
        problems.append(f"{where(host, label, 'split_mode')}: {refused}")
    return problems


def _unique_problems(out, host):
    """Whether the host's resolved instances have distinct names and distinct ports."""
    problems = []
    seen = {}
    for inst in out:
        n = inst.get("name")
        if n in seen:
            problems.append(f"{where(host, n, 'name')}: is declared twice; names must be unique")
        seen[n] = inst
    ports = {}
    for inst in out:
        p = inst.get("port")
        if isinstance(p, int) and p in ports:
            problems.append(f"{where(host, inst['name'], 'port')}: {p} is also the port of {ports[p]!r}")
        ports.setdefault(p, inst.get("name"))
    return problems


def resolve(
    instances,
    *,
    host=None,
    autotune=None,
    model_overrides=None,
    instance_overrides=None,
    models=None,
):
    """The host's instances, complete and validated; returns ``(instances, problems)``.

    ``autotune``: instance -> ``{draft_n_max, spec_draft_p_min}`` or a bare draft-n-max (each used where the
    instance does not set that field);
    ``model_overrides``: instance -> model name (model upgrades); ``instance_overrides``: instance ->
    {field: value} applied last (benchmark variants); ``models``: the declared model names, or None to
    skip that check.
    """
    if instances is None:
        instances = []
    if not isinstance(instances, list):
        return [], [f"{where(host)}, field 'llamafleet_instances': must be a list of instances"]
    names = [i.get("name") for i in instances if isinstance(i, dict)]
    problems = _table_problems(names, host, autotune, model_overrides, instance_overrides)

    out = []
    for raw in instances:
        if not isinstance(raw, dict):
            problems.append(f"{where(host)}: an instance must be a mapping, got {type(raw).__name__}")
            continue
        merged, p = _merged(raw, host, autotune, model_overrides, instance_overrides)
        problems += p
        inst, p = normalize(merged, host)
        problems += p
        problems += _instance_problems(inst, host, raw.get("name"), models)
        if inst:
            out.append(inst)
    problems += _unique_problems(out, host)
    return out, problems


def planner_kwargs(inst):
    """The tensor_split planner's options for one resolved instance (tensor_plan.plan keyword arguments)."""
    kwargs = {}
    for key, spec in FIELDS.items():
        target = spec.get("plan")
        if target:
            kwargs[target] = inst.get(key)
    if kwargs.get("split_mode") == "row":
        kwargs["split_mode"] = "layer"  # the same memory per device; the planner knows layer
    if kwargs.get("replicas") is not None and str(kwargs["replicas"]).strip().lower() == "auto":
        kwargs["replicas"] = "auto"
    elif kwargs.get("replicas") is not None:
        kwargs["replicas"] = int(kwargs["replicas"])
    return {k: v for k, v in kwargs.items() if v is not None}


def with_plan(inst, plan):
    """The instance with the settings the plan decided where the instance left them unset."""
    out = dict(inst)
    settings = (plan or {}).get("settings") or {}
    for key in PLANNED:
        if out.get(key) is None and settings.get(key) is not None:
            out[key] = settings[key]
    return out


def context_problems(inst, gguf, host=None, n_ctx_seq=None):
    """Refuse a context above the model's training context unless the instance opts into rope scaling."""
    train = (gguf or {}).get("context_length")
    if not train or inst.get("rope_scaling"):
        return []
    ctx = inst.get("context")
    if ctx is None:
        return []
    per_slot = n_ctx_seq or ctx
    if per_slot > train:
        return [
            f"{where(host, inst.get('name'), 'context')}: {ctx} gives {per_slot} tokens per slot, above the "
            f"model's training context {train} ({(gguf or {}).get('path') or 'the model'}); lower it, or opt "
            "into rope scaling with rope_scaling: yarn (and rope_scale)"
        ]
    return []


def memory_problems(host, needs, mem_available_bytes, held_bytes):
    """CPU hosts: the instances' host RAM must fit in MemAvailable plus what their running processes hold.

    ``needs``: instance name -> MiB the plan needs; ``held_bytes``: instance name -> bytes its running
    process(es) hold now (freed when it restarts).
    """
    if mem_available_bytes is None or not needs:
        return []
    budget = int(mem_available_bytes) + sum(int(v or 0) for v in (held_bytes or {}).values())
    total = sum(int(v or 0) for v in needs.values()) * 1024 * 1024
    if total <= budget:
        return []
    detail = ", ".join(f"{n} {m} MiB" for n, m in sorted(needs.items()))
    return [
        f"{where(host, ', '.join(sorted(needs)) if len(needs) > 1 else next(iter(needs)), 'context')}: the "
        f"instances need {total // 1048576} MiB of host RAM ({detail}) but {budget // 1048576} MiB are available "
        f"(MemAvailable {int(mem_available_bytes) // 1048576} MiB + {(budget - int(mem_available_bytes)) // 1048576}"
        " MiB held by the running instances); lower context/parallel or use a quantized KV cache"
    ]


# --------------------------------------------------------------------------------------------
# the build ref: which way is a change?


def ref_order(ref):
    """A sortable position for refs whose order is known: a PR branch (pull/N) is before every release
    tag (bN) and every mainline build; release tags sort by number. None for refs whose order is unknown
    (branches, shas) or that are no ref at all. A mainline build and a release tag are not ordered
    (downgrade_problem): which is newer depends on when each was cut, and both may name one commit (a build
    cached under either ref). The ref grammar is the build's (llamacpp_build.parse_ref: 22673, #22673,
    pull/22673, pr/22673, refs/pull/22673/head are one pull request)."""
    try:
        parsed = parse_ref(ref)
    except BuildInputError:
        return None
    if parsed["kind"] == "pull":
        return (0, parsed["pull"])
    r = parsed["ref"]
    m = re.match(r"^b(\d+)$", r)
    if m:
        return (1, int(m.group(1)))
    if r.startswith("mainline") or r in ("master", "main"):
        return (2, 0)
    return None


def downgrade_problem(host, running, declared_ref, allow=False):
    """A running build (its build-info: ref, name) that the declared ref would replace by an older one."""
    if allow or not running or not declared_ref:
        return None
    running_ref = running.get("ref")
    if not running_ref or str(running_ref) == str(declared_ref):
        return None
    a, b = ref_order(running_ref), ref_order(declared_ref)
    if a is None or b is None or a[0] == 0 and b[0] == 0 or {a[0], b[0]} == {1, 2} or not b < a:
        return None
    return (
        f"{where(host)}, field 'llamacpp_mtp_build_ref': the host runs build {running.get('name')} "
        f"(ref {running_ref}) but the declared ref {declared_ref} is older: a downgrade nobody declared "
        "(is the ref set for this host or group outside group_vars/all/llamafleet_release.yml?). Declare the "
        "ref you want, or set llamafleet_allow_downgrade: true"
    )


def declared_state(
    *,
    host,
    ref,
    instances,
    models,
    autotune=None,
    model_overrides=None,
    running_build=None,
    allow_downgrade=False,
):
    """The host's declared state: ``{ref, instances, models}``; raises DeclaredStateError."""
    problems = []
    model_names = None
    if models is not None:
        if not isinstance(models, list) or not all(isinstance(m, dict) and m.get("name") for m in models):
            problems.append(f"{where(host)}, field 'llamafleet_models': must be a list of models with a name")
            models = [m for m in models if isinstance(m, dict)] if isinstance(models, list) else []
        model_names = [m.get("name") for m in models]
    resolved, p = resolve(instances, host=host, autotune=autotune, model_overrides=model_overrides, models=model_names)
    problems += p
    if ref is None or str(ref).strip() == "":
        ref = DEFAULT_REF
    down = downgrade_problem(host, running_build, ref, allow_downgrade)
    if down:
        problems.append(down)
    if problems:
        raise DeclaredStateError(problems)
    return {"ref": str(ref), "instances": resolved, "models": list(models or [])}


# --------------------------------------------------------------------------------------------
# the plan stage


def _replica_names(name, count):
    return [name] + [f"{name}-{i}" for i in range(count)]


def compact(inst):
    """The instance without unset fields (what an Ansible argument spec accepts for unset options)."""
    return {k: v for k, v in inst.items() if v is not None}


def plan_host(*, host, instances, models, gpu_facts, host_state, declared_models=None, check_mode=False):
    """Plan every resolved instance of a host; returns ``{plan, instances, problems, notes}``.

    ``models``: model_fetch_facts (name -> {gguf, path, ...}); ``host_state``: the llama_host_state fact
    (MemAvailable and what the running instances hold, for CPU plans). Instances that serve a
    ``model_path`` are not planned (their header is read on the host by the server role). A model not on
    the host yet (check mode) is planned from its controller copy (``declared_models``, source
    controller); in check mode one with no header anywhere yet is left unplanned, with a note.
    """
    from ansible_collections.llamafleet.mtp.plugins.module_utils.gguf_header import GGUFError, gguf_info

    on_controller = {
        m.get("name"): m.get("controller_path")
        for m in declared_models or []
        if m.get("source") == "controller" and m.get("controller_path")
    }
    plans, out, problems, notes = {}, [], [], []
    cpu_needs, held = {}, {}
    running = (host_state or {}).get("instances") or {}
    for inst in instances:
        name = inst.get("name")
        if inst.get("model_path"):
            notes.append(f"{where(host, name)}: serves model_path {inst['model_path']}; not planned")
            out.append(compact(inst))
            continue
        entry = (models or {}).get(inst.get("model")) or {}
        gguf = entry.get("gguf")
        if not gguf and inst.get("model") in on_controller:
            try:
                gguf = gguf_info(on_controller[inst["model"]])
            except (GGUFError, OSError) as e:
                problems.append(f"{where(host, name, 'model')}: {on_controller[inst['model']]}: {e}")
                continue
        if not gguf and check_mode:
            notes.append(f"{where(host, name)}: model {inst.get('model')!r} not fetched yet; the real run plans it")
            out.append(compact(inst))
            continue
        if not gguf:
            problems.append(
                f"{where(host, name, 'model')}: model {inst.get('model')!r} has no GGUF header in model_fetch_facts "
                "(run the models stage first)"
            )
            continue
        try:
            p = plan(gpu_facts or {}, gguf, **planner_kwargs(inst))
        except PlanError as e:
            problems.append(f"{where(host, name)}: {e.message}")
            continue
        settings = p.get("settings") or {}
        problems += context_problems(inst, gguf, host, settings.get("n_ctx_seq"))
        plans[name] = p
        out.append(compact(with_plan(inst, p)))
        if p.get("mode") == "cpu":
            cpu_needs[name] = sum(int(i.get("host_mib") or i.get("required_mib") or 0) for i in p["instances"])
            count = len(p.get("instances") or [])
            held[name] = sum(int((running.get(n) or {}).get("rss_bytes") or 0) for n in _replica_names(name, count))
    problems += memory_problems(host, cpu_needs, (host_state or {}).get("mem_available_bytes"), held)
    cpu_problems, cpu_notes = divide_cores(host, instances, plans, host_state or {}, gpu_facts)
    return {"plan": plans, "instances": out, "problems": problems + cpu_problems, "notes": notes + cpu_notes}


def _replicas_planned(inst, p):
    """How many replicas of a planned instance the server runs (as llama_server_args counts them)."""
    n = len(p.get("instances") or [])
    replicas = inst.get("replicas", 1)
    if isinstance(replicas, str) and replicas.strip().lower() == "auto":
        return n
    try:
        return max(1, min(int(replicas), n))
    except (TypeError, ValueError):
        return min(1, n)


def divide_cores(host, instances, plans, host_state, gpu_facts):
    """Give the replicas that share this host's CPUs disjoint whole cores (module_utils/cpu_cores.divide).

    Each planned replica's plan instance gets ``cpus`` (systemd CPUAffinity=) and ``threads`` (--threads and
    --threads-batch where the instance leaves them unset); GPU replicas take cores on their GPUs' NUMA node. An
    instance that pins ``threads`` gets that many cores; one with ``allow_oversubscribe`` gets none and keeps
    llama.cpp's own choice, as does an instance alone on its host unless the host is confined to fewer cores
    than the machine has online (``host_state.cpu_cores_online``). Returns ``(problems, notes)``.
    """
    numa = {g.get("index"): g.get("numa_node") for g in (gpu_facts or {}).get("gpus") or []}
    demands, slots, problems, notes = [], {}, [], []
    for inst in instances:
        name = inst.get("name")
        p = plans.get(name)
        if p is None:
            if not inst.get("allow_oversubscribe"):
                notes.append(f"{where(host, name)}: not planned, so it gets no cores of its own")
            continue
        for i in range(_replicas_planned(inst, p)):
            pinst = p["instances"][i]
            if inst.get("allow_oversubscribe"):
                continue
            nodes = {numa.get(d) for d in pinst.get("devices") or []} - {None}
            label = f"{name}-{i}" if str(inst.get("replicas", 1)).strip() not in ("1", "") else name
            demands.append({"name": label, "cores": inst.get("threads"), "node": min(nodes) if nodes else None})
            slots[label] = pinst
    cpus, online = host_state.get("cpus"), host_state.get("cpu_cores_online")
    if not demands:
        return problems, notes
    if not cpus:
        if len(demands) > 1:
            notes.append(f"{where(host)}: its CPU topology is unknown; the instances share every core")
        return problems, notes
    division, why = cores_divide(cpus, demands, online)
    problems += [f"{where(host)}: {w}" for w in why]
    for label, cores in division.items():
        slots[label]["cpus"] = cores["cpus"]
        slots[label]["threads"] = cores["threads"]
    return problems, notes
