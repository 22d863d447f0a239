"""llama-server instances as systemd services: their arguments, environment and drop-in, and the health verdict.

Pure logic, no Ansible imports. The ``llama_server_args`` module gathers what lives on the host (the
model files' GGUF headers and sizes, the binary's identity) and calls ``render``; the
``llama_server_health`` module feeds ``health_verdict`` what it polls. Inputs (docs/facts.md):

* instance settings (the role's ``llama_server_systemd_instances``, fields in ``FIELDS``);
* ``capabilities``: the ``llama_server_capabilities`` module's output for the binary that will run
  (``mtp_spec_type`` ``mtp`` on the PR #22673 build, ``draft-mtp`` on mainline; ``flags``,
  ``short_flags``, ``split_modes``, ``cache_types``, ``spec_flags``, ``has_cuda``, ``build_info``);
* ``plans``: ``llamafleet_plan``, instance name -> the ``tensor_split`` module's ``plan``
  (``mode``, ``settings``, ``instances[]`` with ``devices``, ``cuda_visible_devices``,
  ``tensor_split_arg``, ``split_mode``, ``main_gpu``, ``n_gpu_layers``);
* ``model_info``: model path -> ``{size_bytes, mtp, nextn_predict_layers, architecture, paths, identity}``.

Flags are rendered in their long spelling and only when the binary's ``--help`` lists them. The
argument list goes to systemd as one ``LLAMA_SERVER_ARGS=`` line of the instance's environment
file, expanded unquoted in ``ExecStart`` (systemd splits it at whitespace), so no argument may
contain whitespace, quotes, backslashes or ``$``. Secrets never go into the arguments: the API
key reaches the server as a systemd credential (``LoadCredential=``, a root-only 0600 file on
disk) passed with ``--api-key-file``.
"""

from __future__ import annotations

import ipaddress
import math
import re

from ansible_collections.llamafleet.mtp.plugins.module_utils import fleet_instances, host_paths
from ansible_collections.llamafleet.mtp.plugins.module_utils.cpu_cores import format_cpu_list
from ansible_collections.llamafleet.mtp.plugins.module_utils.tensor_plan import tensor_split_mtp_problem

UNIT = "llama-server"
CREDENTIAL = "api-key"
CREDENTIALS_DIR = "/run/credentials"  # systemd's $CREDENTIALS_DIRECTORY is <this>/<unit name>
GIB = 1024**3
DEFAULT_HEALTH_BASE_S = 60
DEFAULT_HEALTH_PER_GIB_S = 30

# The instance fields, their defaults and checks live in fleet_instances (the one instance resolver).
FIELDS = fleet_instances.FIELDS
CACHE_TYPES = fleet_instances.CACHE_TYPES

# Used when neither the instance nor its plan sets them (the seeds' recommendation with MTP: one slot).
# (FIELDS' defaults; MTP on, as in the seeds). Set in the instance, they must agree with its plan.
FALLBACKS = dict(
    {k: v["default"] for k, v in FIELDS.items() if v.get("plan") and v.get("default") is not None}, mtp=True
)
# Instance field -> key of the plan's ``settings`` that must agree with it when both are set.
PLAN_SETTINGS = {
    "context": "context",
    "parallel": "parallel",
    "kv_unified": "kv_unified",
    "cache_type_k": "cache_type_k",
    "cache_type_v": "cache_type_v",
    "mtp": "mtp",
    "draft_n_max": "draft_n_max",
    "draft_cache_type_k": "draft_cache_type_k",
    "draft_cache_type_v": "draft_cache_type_v",
}

# The resolver's tables (the checks that need no binary live there)
CONTROLLED_FLAGS = fleet_instances.CONTROLLED_FLAGS
RESERVED_ENV = fleet_instances.RESERVED_ENV
_CONTROLLED = fleet_instances.CONTROLLED

_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
_SAFE = fleet_instances.SAFE_WORD  # systemd splits $LLAMA_SERVER_ARGS at whitespace; no quoting exists
_FORBIDDEN_MODEL_DIRS = ("/home", "/root", "/run/user", "/tmp", "/var/tmp")


class ServerArgsError(Exception):
    """Bad instance settings; ``problems`` lists every one found (the message joins them)."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__(
            "llama_server_systemd: nothing was changed; fix these and run again:\n- " + "\n- ".join(self.problems)
        )


# --------------------------------------------------------------------------------------------
# small helpers


def unit_name(name: str) -> str:
    """The systemd unit of instance ``name``."""
    return f"{UNIT}@{name}.service"


def credential_path(name: str) -> str:
    """Where systemd exposes the instance's API key to the server ($CREDENTIALS_DIRECTORY/api-key)."""
    return f"{CREDENTIALS_DIR}/{unit_name(name)}/{CREDENTIAL}"


is_loopback = fleet_instances.is_loopback


def _url_host(host: str, advertise: str | None = None) -> str:
    """Host part of a URL for a bind address (wildcards become ``advertise``, or loopback)."""
    h = host.strip("[]")
    if h in ("0.0.0.0", ""):
        h = advertise or "127.0.0.1"
    elif h == "::":
        h = advertise or "::1"
    try:
        if ipaddress.ip_address(h).version == 6:
            return f"[{h}]"
    except ValueError:
        pass
    return h


def _fmt(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def health_timeout(size_bytes: int, base_s: int = DEFAULT_HEALTH_BASE_S, per_gib_s: int = DEFAULT_HEALTH_PER_GIB_S):
    """Seconds to wait for /health 200 after a (re)start: a base plus time to read the model from disk."""
    return int(base_s + math.ceil(max(0, size_bytes or 0) / GIB * per_gib_s))


def normalize_instance(raw: dict) -> tuple[dict, list[str]]:
    """Apply FIELDS' defaults and check types (fleet_instances.normalize); returns ``(instance, problems)``."""
    return fleet_instances.normalize(raw)


def model_path_for(inst: dict, models: dict | None) -> tuple[str | None, str | None]:
    """``(path, problem)``: the instance's model file, from ``model_path`` or ``model_fetch_facts[model].path``."""
    name = inst.get("name")
    if inst.get("model_path") and inst.get("model"):
        return None, f"instance {name!r}: set either model (a model_fetch name) or model_path, not both"
    if inst.get("model_path"):
        return inst["model_path"], None
    if not inst.get("model"):
        return None, f"instance {name!r}: no model; set model (a model_fetch name) or model_path"
    entry = (models or {}).get(inst["model"])
    if not entry:
        known = ", ".join(sorted(models or {})) or "none: run llamafleet.mtp.model_fetch first"
        return None, f"instance {name!r}: model {inst['model']!r} is not in model_fetch_facts (known: {known})"
    path = entry.get("path") or (entry.get("paths") or [None])[0]
    if not path:
        return None, f"instance {name!r}: model_fetch_facts[{inst['model']!r}] has no path"
    return path, None


def model_info_from_gguf(gguf: dict, identity: str) -> dict:
    """The ``model_info`` entry for a model from its ``gguf_info`` result (docs/facts.md)."""
    nextn = int(gguf.get("nextn_predict_layers") or 0)
    return {
        "size_bytes": int(gguf.get("size_bytes") or 0),
        "mtp": bool(gguf.get("mtp", nextn > 0)),
        "nextn_predict_layers": nextn,
        "architecture": gguf.get("architecture"),
        "paths": list((gguf.get("split") or {}).get("paths") or [gguf.get("path")]),
        "identity": identity,
    }


# --------------------------------------------------------------------------------------------
# rendering


class _Flags:
    """The long and short option names a binary's --help lists."""

    def __init__(self, caps: dict):
        self.long = set(caps.get("flags") or [])
        self.short = set(caps.get("short_flags") or [])
        self.removed = set(caps.get("removed_flags") or [])

    def knows(self, flag: str) -> bool:
        return flag in self.long or flag in self.short


def _table_flags(inst: dict, mtp, flags: _Flags, binary: str, problems: list) -> list:
    """The fields FIELDS renders as they are ("flag"), in its order: only those set, the MTP ones only with MTP on,
    each refused (naming the field) where the binary does not list its flag - except a default marked
    "default_if_known", which such a binary simply does not get."""
    out = []
    for key, spec in FIELDS.items():
        if not spec.get("flag") or inst.get(key) is None or (spec.get("with_mtp") and not mtp):
            continue
        flag = spec["flag"][0]
        needs = spec.get("default_if_known")
        if needs and inst[key] == spec.get("default") and not all(flags.knows(f) for f in [flag, *needs]):
            continue  # a default the product chose: a binary without what it needs keeps its own behaviour
        if not flags.knows(flag):
            problems.append(
                f"instance {inst['name']!r}, field {key!r}: it renders {flag}, which {binary} does not know (not in "
                "its --help); unset it or build a llama.cpp that has it"
            )
            continue
        out += [flag, _fmt(inst[key])]
    return out


def _plan_instance(plan: dict, index: int):
    instances = plan.get("instances") or []
    return instances[index] if index < len(instances) else None


def _replica_count(inst, plan, problems):
    label = inst["name"]
    replicas = inst.get("replicas", 1)
    if isinstance(replicas, str) and replicas.strip().lower() == "auto":
        return (len(plan.get("instances") or []) or 1) if plan else 1, True
    if isinstance(replicas, str) and replicas.strip().isdigit():
        replicas = int(replicas)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        problems.append(f"instance {label!r}: replicas must be a positive integer or 'auto', got {replicas!r}")
        return 1, False
    if plan and replicas > len(plan.get("instances") or []):
        problems.append(
            f"instance {label!r}: replicas {replicas} but llamafleet_plan[{label!r}] has "
            f"{len(plan.get('instances') or [])} instance(s); set replicas: auto or plan with replicas={replicas}"
        )
    return replicas, replicas > 1


def _setting(inst, plan, key, problems):
    """The effective value of a setting: the instance's, else the plan's, else FALLBACKS; refuse disagreement."""
    mine = inst.get(key)
    settings = (plan or {}).get("settings") or {}
    planned = settings.get(PLAN_SETTINGS[key]) if key in PLAN_SETTINGS else None
    if mine is not None and planned is not None and mine != planned:
        problems.append(
            f"instance {inst['name']!r}: {key} is {_fmt(mine)} but llamafleet_plan[{inst['name']!r}] was planned "
            f"with {_fmt(planned)}; re-run the tensor_split planner with the same setting, or drop {key} from the "
            "instance to use the plan's"
        )
    if mine is not None:
        return mine
    if planned is not None:
        return planned
    return FALLBACKS.get(key)


def _tensor_split_arg(value):
    """The -ts argument of a declared tensor_split (None when unset or not numbers: value_problems said so)."""
    parts = fleet_instances.tensor_split_parts(value) if value is not None else None
    return ",".join(parts) if parts else None


def _placement(inst, plan_inst, plan_mode, caps, problems):
    """Devices, env and GPU args: explicit instance settings, else the plan's instance, else CPU."""
    label = inst["name"]
    if inst.get("split_mode") == "auto":  # the planner's choice, not a llama-server value
        inst = dict(inst, split_mode=None)
    explicit = inst.get("devices") is not None
    if explicit:
        devices = list(inst["devices"])  # distinct, non-negative: value_problems
        src = {
            "devices": devices,
            "cuda_visible_devices": ",".join(str(d) for d in devices) if devices else None,
            "tensor_split_arg": _tensor_split_arg(inst.get("tensor_split")),
            "split_mode": inst.get("split_mode") or (("layer" if len(devices) > 1 else "none") if devices else None),
            "main_gpu": inst.get("main_gpu"),
            "n_gpu_layers": inst.get("n_gpu_layers"),
        }
        mode = "gpu" if devices else "cpu"
        if not devices:
            src["n_gpu_layers"] = 0
    elif plan_inst is not None:
        src = dict(plan_inst)
        mode = plan_mode or ("gpu" if plan_inst.get("devices") else "cpu")
        for key in ("split_mode", "main_gpu", "n_gpu_layers"):
            if inst.get(key) is not None and src.get(key) is not None and inst[key] != src[key]:
                problems.append(
                    f"instance {label!r}: {key} is {inst[key]} but the plan chose {src[key]}; drop {key} from the "
                    "instance or re-plan"
                )
        if inst.get("tensor_split") is not None:  # a forced -ts over the plan's GPUs
            forced = _tensor_split_arg(inst["tensor_split"])
            if forced and len(forced.split(",")) != len(src.get("devices") or []):
                problems.append(
                    f"instance {label!r}: tensor_split {forced} has {len(forced.split(','))} part(s) but the plan "
                    f"uses {len(src.get('devices') or [])} GPU(s) ({src.get('devices')}); set devices with it"
                )
            src["tensor_split_arg"] = forced
    else:  # no plan, no devices: CPU
        src = {
            "devices": [],
            "cuda_visible_devices": None,
            "tensor_split_arg": None,
            "split_mode": None,
            "main_gpu": None,
            "n_gpu_layers": 0,
        }
        mode = "cpu"
        for key in ("split_mode", "tensor_split", "main_gpu"):
            if inst.get(key) is not None:
                problems.append(f"instance {label!r}: {key} needs GPUs; set devices or give the instance a plan")

    env = {}
    args = []
    if mode == "gpu":
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = src.get("cuda_visible_devices") or ",".join(str(d) for d in src["devices"])
        if caps.get("has_cuda") is False:
            problems.append(
                f"instance {label!r}: it runs on GPUs {env['CUDA_VISIBLE_DEVICES']} but the binary "
                f"{caps.get('binary', '')} has no CUDA backend; install a CUDA build or plan for CPU"
            )
    elif caps.get("has_cuda"):
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU instance of a CUDA build: hide the GPUs
    # A CPU build ignores --n-gpu-layers (with a warning); a CUDA build running a CPU instance needs 0.
    if src.get("n_gpu_layers") is not None and (mode == "gpu" or caps.get("has_cuda")):
        args += ["--n-gpu-layers", str(src["n_gpu_layers"])]
    if mode == "gpu":
        if src.get("split_mode"):
            args += ["--split-mode", src["split_mode"]]
        if src.get("main_gpu") is not None:
            args += ["--main-gpu", str(src["main_gpu"])]
        if src.get("tensor_split_arg"):
            args += ["--tensor-split", src["tensor_split_arg"]]
    split_mode = src.get("split_mode") if mode == "gpu" else None
    return mode, list(src.get("devices") or []), split_mode, env, args


def _gpu_device_allow(devices: list[int]) -> list[str]:
    # /dev/nvidia<N> uses the driver's minor number, which equals the nvidia-smi index on common
    # hosts (both follow PCI bus order); nvidiactl and the UVM nodes are needed by every CUDA process.
    return ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"] + [f"/dev/nvidia{d}" for d in devices]


def _extra_args(inst, flags: _Flags, problems):
    """The pass-through arguments; refused here only what depends on the binary (flags it removed or does not
    know): unsafe items and flags the role renders were refused by fleet_instances.value_problems."""
    label = inst["name"]
    out = []
    for tok in inst.get("extra_args") or []:
        tok = str(tok)
        if not _SAFE.match(tok) or fleet_instances.controlled_flag(tok):
            continue  # value_problems refused it
        if fleet_instances.is_flag(tok):
            flag = tok.split("=", 1)[0]
            if flag in flags.removed:
                problems.append(f"instance {label!r}: extra_args flag {flag} has been removed from this llama-server")
                continue
            if not flags.knows(flag):
                problems.append(
                    f"instance {label!r}: extra_args flag {flag} is not an option of this llama-server "
                    "(its --help does not list it)"
                )
                continue
        out.append(tok)
    return out


def _environment(inst, base_env):
    """The unit's environment: the role's, then the instance's (names and values value_problems accepted)."""
    env = dict(base_env)
    for key, value in (inst.get("environment") or {}).items():
        key, value = str(key), _fmt(value)
        if fleet_instances.environment_ok(key, value):
            env[key] = value
    return env


def render(
    instances: list[dict],
    *,
    capabilities: dict,
    model_info: dict,
    models: dict | None = None,
    plans: dict | None = None,
    binary: str | None = None,
    binary_identity: str | None = None,
    config_dir: str = host_paths.CONFIG_DIR,
    advertise_host: str | None = None,
    health_base_s: int = DEFAULT_HEALTH_BASE_S,
    health_per_gib_s: int = DEFAULT_HEALTH_PER_GIB_S,
) -> list[dict]:
    """Render every instance (replicas expanded) or raise ServerArgsError listing every problem.

    Each result: name, config_name, replica, unit, host, port, url, health_url, mode (gpu|cpu),
    devices, split_mode, mtp, spec_type, model, model_path, model_size_bytes, api_key (bool),
    key_file, args, env, health_timeout, env_file (text), dropin (text), notes.
    """
    caps = capabilities or {}
    flags = _Flags(caps)
    plans = plans or {}
    binary = binary or caps.get("binary") or "llama-server"
    problems = _binary_problems(binary, caps, flags)
    normalized, p = _normalized(instances)
    problems += p
    ctx = _Context(caps, flags, binary, binary_identity, config_dir, advertise_host, health_base_s, health_per_gib_s)
    rendered: list[dict] = []
    for inst in normalized:
        rendered += _render_instance(inst, plans, models, model_info, ctx, problems)
    problems += _collisions(rendered)
    if problems:
        # Keep the order, drop repeats (a setting checked once per replica).
        raise ServerArgsError(list(dict.fromkeys(problems)))
    return rendered


class _Context:
    """What every instance of one render shares: the binary, its capabilities, where files go."""

    def __init__(self, caps, flags, binary, binary_identity, config_dir, advertise_host, base_s, per_gib_s):
        self.caps, self.flags, self.binary, self.binary_identity = caps, flags, binary, binary_identity
        self.config_dir, self.advertise_host, self.base_s, self.per_gib_s = (
            config_dir,
            advertise_host,
            base_s,
            per_gib_s,
        )
        self.binary_text = f"the binary {binary} ({caps.get('build_info')})"


def _binary_problems(binary, caps, flags):
    problems = []
    if not _SAFE.match(binary) or not binary.startswith("/"):
        problems.append(f"the llama-server binary path {binary!r} must be absolute, without whitespace or quotes")
    for required in ("--model", "--host", "--port"):
        if not flags.knows(required):
            problems.append(
                f"the binary {binary} does not list {required} in its --help; is this llama-server? "
                f"(capabilities: {caps.get('build_info')})"
            )
    return problems


def _normalized(instances):
    """The instances normalized, with the settings they leave unset left to their plan; and the problems."""
    problems, normalized = [], []
    for raw in instances or []:
        inst, p = normalize_instance(raw)
        problems += p
        if inst:
            # Settings the instance leaves unset come from its plan (else FALLBACKS), not FIELDS' defaults.
            for key in PLAN_SETTINGS:
                if raw.get(key) is None:
                    inst[key] = None
            normalized.append(inst)
    names = [i["name"] for i in normalized if i.get("name")]
    for n in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"instance name {n!r} is used {names.count(n)} times; names must be unique")
    return normalized, problems


def _instance_plan(label, plans, problems):
    plan = plans.get(label)
    if plan is not None and not isinstance(plan, dict):
        problems.append(f"llamafleet_plan[{label!r}] must be a tensor_split plan (a mapping)")
        plan = None
    if plan and plan.get("fits") is False:
        problems.append(f"llamafleet_plan[{label!r}] does not fit (fits: false); fix the plan first")
    return plan


def _model(label, inst, models, model_info, problems):
    """(path, info) of the model the instance serves, or (None, None) with the problem said."""
    path, p = model_path_for(inst, models)
    if p:
        problems.append(p)
        return None, None
    info = model_info.get(path)
    if info is None:
        problems.append(f"instance {label!r}: no information about model {path} (not read)")
        return None, None
    if not path.startswith("/") or not _SAFE.match(path):
        problems.append(
            f"instance {label!r}: model path {path!r} must be absolute, without whitespace, quotes or '$' "
            "(rename it or point a symlink at it)"
        )
        return None, None
    for d in _FORBIDDEN_MODEL_DIRS:
        if any(q == d or q.startswith(d + "/") for q in info.get("paths") or [path]):
            problems.append(
                f"instance {label!r}: model {path} is under {d}, which the hardened unit hides "
                "(ProtectHome / PrivateTmp); move it, e.g. under /var/lib/llama-models or /srv"
            )
            break
    return path, info


def _mtp(label, inst, plan, path, info, ctx, problems):
    """(mtp, draft_n_max, spec_type): MTP as the instance and its plan set it, in the binary's spelling."""
    mtp = _setting(inst, plan, "mtp", problems)
    draft_n_max = _setting(inst, plan, "draft_n_max", problems)
    spec_type = None
    if mtp:
        if not info.get("mtp"):
            problems.append(
                f"instance {label!r}: mtp is on but model {path} has no MTP (nextn) layers "
                f"(nextn_predict_layers {info.get('nextn_predict_layers', 0)}); set mtp: false for this instance "
                "or use a model with MTP layers"
            )
        spec_type = ctx.caps.get("mtp_spec_type")
        if not spec_type:
            problems.append(
                f"instance {label!r}: mtp is on but {ctx.binary_text} has no MTP speculative type (--spec-type "
                f"lists: {', '.join(ctx.caps.get('spec_types') or []) or 'nothing'}); build llama.cpp with MTP or set "
                "mtp: false"
            )
        spec = FIELDS["draft_n_max"]  # the plan's value is held to the field's bounds too
        if (
            isinstance(draft_n_max, bool)
            or not isinstance(draft_n_max, int)
            or not fleet_instances.in_bounds(spec, draft_n_max)
        ):
            problems.append(f"instance {label!r}: draft_n_max must be {spec['min']}-{spec['max']}, got {draft_n_max!r}")
    return mtp, draft_n_max, spec_type


def _shared_args(label, inst, plan, mtp, spec_type, draft_n_max, ctx, problems):
    """The arguments every replica of the instance shares: (common, tuning)."""
    common = ["--parallel", str(_setting(inst, plan, "parallel", problems))]
    if _setting(inst, plan, "kv_unified", problems):
        common += ["--kv-unified"]
    for key, flag in (("cache_type_k", "--cache-type-k"), ("cache_type_v", "--cache-type-v")):
        value = _setting(inst, plan, key, problems)
        if value is not None:
            if ctx.caps.get("cache_types") and value not in ctx.caps["cache_types"]:
                problems.append(f"instance {label!r}: {key} {value} is not a cache type this binary allows")
            common += [flag, value]
    if inst.get("flash_attn"):
        common += ["--flash-attn", inst["flash_attn"]]
    tuning = []
    for key, flag in (("batch_size", "--batch-size"), ("ubatch_size", "--ubatch-size")):
        if inst.get(key) is not None:
            tuning += [flag, str(inst[key])]
    if mtp and spec_type:
        tuning += ["--spec-type", spec_type, "--spec-draft-n-max", str(draft_n_max)]
        for key, flag in (("draft_cache_type_k", "--spec-draft-type-k"), ("draft_cache_type_v", "--spec-draft-type-v")):
            value = _setting(inst, plan, key, problems)
            if value is not None:
                tuning += [flag, value]
    if inst.get("rope_scaling"):
        tuning += ["--rope-scaling", inst["rope_scaling"]]
        if inst.get("rope_scale") is not None:
            tuning += ["--rope-scale", _fmt(inst["rope_scale"])]
    tuning += _table_flags(inst, mtp, ctx.flags, ctx.binary_text, problems)
    return common, tuning


def _render_instance(inst, plans, models, model_info, ctx, problems):
    """One declared instance: its replicas rendered (empty when it cannot be; the problems are said)."""
    label = inst.get("name")
    if not isinstance(label, str) or not _NAME.match(label):
        problems.append(
            f"instance name {label!r} must be 1-63 characters of a-z, 0-9, '.', '_' or '-', starting with a "
            "letter or digit (it becomes the systemd instance llama-server@<name>)"
        )
        return []
    plan = _instance_plan(label, plans, problems)
    path, info = _model(label, inst, models, model_info, problems)
    if path is None:
        return []
    # the resolver's checks, for a direct caller
    problems += fleet_instances.access_problems(inst) + fleet_instances.value_problems(inst)
    if inst.get("api_key") and not ctx.flags.knows("--api-key-file"):
        problems.append(
            f"instance {label!r}: api_key is set but the binary has no --api-key-file; the key would have "
            "to go on the command line, which this role refuses. Use a newer llama-server"
        )
    mtp, draft_n_max, spec_type = _mtp(label, inst, plan, path, info, ctx, problems)
    shared = _shared_args(label, inst, plan, mtp, spec_type, draft_n_max, ctx, problems)
    settings = {
        "ctx": _setting(inst, plan, "context", problems),
        "slots": _setting(inst, plan, "parallel", problems),
        "mtp": mtp,
        "draft_n_max": draft_n_max,
        "spec_type": spec_type,
        "shared": shared,
        "extra": _extra_args(inst, ctx.flags, problems),
    }
    count, suffixed = _replica_count(inst, plan, problems)
    return [_replica(inst, label, i, suffixed, plan, path, info, settings, ctx, problems) for i in range(count)]


def _replica(inst, label, i, suffixed, plan, path, info, settings, ctx, problems):
    """Replica ``i`` of an instance: its placement, arguments, environment and files."""
    name = f"{label}-{i}" if suffixed else label
    mtp, spec_type, draft_n_max = settings["mtp"], settings["spec_type"], settings["draft_n_max"]
    plan_inst = _plan_instance(plan, i) if plan else None
    mode, devices, split_mode, env, place_args = _placement(
        inst, plan_inst, (plan or {}).get("mode"), ctx.caps, problems
    )
    # the plan's split mode (the resolver refused the declared one already)
    refused = tensor_split_mtp_problem(split_mode, mtp, inst.get("force_split_mode_tensor"), "force_split_mode_tensor")
    if refused:
        problems.append(f"instance {name!r}: {refused}")
    if split_mode and ctx.caps.get("split_modes") and split_mode not in ctx.caps["split_modes"]:
        problems.append(
            f"instance {name!r}: split mode {split_mode} is not one this binary knows "
            f"({', '.join(ctx.caps['split_modes'])})"
        )
    host = str(inst.get("host") or "127.0.0.1")
    port = inst.get("port")
    if not isinstance(port, int) or not fleet_instances.in_bounds(FIELDS["port"], port):
        port = None  # normalize reported it
    rport = port + i if port is not None else None
    if rport is not None and rport > 65535:
        problems.append(f"instance {name!r}: port {rport} (port + replica index) is above 65535")
    cpus = (plan_inst or {}).get("cpus") or None
    args, notes = _replica_args(inst, name, path, host, rport, settings, plan_inst, cpus, place_args, ctx, problems)
    env = _environment(inst, env)
    timeout = inst.get("health_timeout") or health_timeout(info.get("size_bytes") or 0, ctx.base_s, ctx.per_gib_s)
    has_key = bool(inst.get("api_key"))
    out = {
        "name": name,
        "config_name": label,
        "replica": i if suffixed else None,
        "unit": unit_name(name),
        "host": host,
        "port": rport,
        "url": f"http://{_url_host(host, ctx.advertise_host)}:{rport}",
        "health_url": f"http://{_url_host(host)}:{rport}/health",
        "mode": mode,
        "devices": devices,
        "split_mode": split_mode,
        "mtp": bool(mtp and spec_type),
        "spec_type": spec_type if mtp else None,
        "draft_n_max": draft_n_max if mtp else None,
        "parallel": settings["slots"],
        "cpus": cpus,
        "model": inst.get("model"),
        "model_path": path,
        "model_size_bytes": int(info.get("size_bytes") or 0),
        "read_only_paths": sorted({q.rsplit("/", 1)[0] or "/" for q in info.get("paths") or [path]}),
        "api_key": has_key,
        "key_file": f"{ctx.config_dir}/{name}.key" if has_key else None,
        "args": args,
        "env": env,
        "health_timeout": int(timeout),
        "notes": notes,
    }
    out["env_file"] = env_file(
        out, binary=ctx.binary, binary_identity=ctx.binary_identity, model_identity=info.get("identity")
    )
    out["dropin"] = dropin(out)
    return out


def _replica_args(inst, name, path, host, rport, settings, plan_inst, cpus, place_args, ctx, problems):
    """(args, notes): the replica's command line, every flag one the binary lists, every token env-file safe."""
    args = ["--model", path, "--host", host, "--port", str(rport)]
    # The declared model's name always (never llama-server's own default: a file name or path), where the binary
    # lists --alias (every llama-server since 2023; an explicit alias on one that does not is refused as before)
    names = fleet_instances.served_names(inst, path)
    if names and (inst.get("alias") or ctx.flags.knows("--alias")):
        args += ["--alias", ",".join(names)]
    if settings["ctx"] is not None:
        args += ["--ctx-size", str(settings["ctx"])]
    # Cores of its own (the plan divides a shared host's cores): as many threads as cores, unless pinned.
    threads = inst.get("threads") or (plan_inst or {}).get("threads") if cpus else inst.get("threads")
    threads_batch = inst.get("threads_batch") or (threads if cpus else None)
    for flag, n in (("--threads", threads), ("--threads-batch", threads_batch)):
        if n is not None:
            args += [flag, str(n)]
    common, tuning = settings["shared"]
    args += common + place_args + tuning
    notes = []
    if inst.get("metrics"):
        if ctx.flags.knows("--metrics"):
            args.append("--metrics")
        else:
            notes.append("this llama-server has no --metrics; /metrics is off")
    if not inst.get("webui"):
        if ctx.flags.knows("--no-webui"):
            args.append("--no-webui")
        else:
            notes.append("this llama-server has no --no-webui; its web UI stays on")
    if inst.get("api_key"):
        args += ["--api-key-file", credential_path(name)]
    # Every flag rendered so far must be one the binary lists (values are never flags).
    for tok in args:
        if tok.startswith("--") and not ctx.flags.knows(tok):
            problems.append(f"instance {name!r}: this llama-server does not know {tok} (not in its --help)")
    args += settings["extra"]
    for tok in args:
        if not _SAFE.match(tok):
            problems.append(
                f"instance {name!r}: argument {tok!r} contains whitespace, a quote, a backslash or '$', "
                "which a systemd environment file cannot carry"
            )
    return args, notes


def _collisions(rendered):
    """Replica names and ports that two instances produce."""
    problems, seen_names, seen_ports = [], {}, {}
    for r in rendered:
        if r["name"] in seen_names and seen_names[r["name"]] != r["config_name"]:
            problems.append(
                f"instance name {r['name']!r} is produced twice (by {seen_names[r['name']]!r} and "
                f"{r['config_name']!r}); rename one"
            )
        seen_names.setdefault(r["name"], r["config_name"])
        if r["port"] is not None:
            if r["port"] in seen_ports:
                problems.append(
                    f"port {r['port']} is used by both {seen_ports[r['port']]!r} and {r['name']!r}; give each instance "
                    "its own port (replicas use port, port+1, ...)"
                )
            seen_ports.setdefault(r["port"], r["name"])
    return problems


def env_file(inst: dict, *, binary: str, binary_identity: str | None, model_identity: str | None) -> str:
    """The instance's EnvironmentFile. The comments name the binary and model identities, so a new
    build or a changed model file changes this file, which is what triggers the restart."""
    lines = [
        "# Managed by Ansible (llamafleet.mtp.llama_server_systemd); changes here are overwritten.",
        f"# instance: {inst['name']} ({inst['mode']}"
        + (f", GPUs {','.join(str(d) for d in inst['devices'])}" if inst["devices"] else "")
        + ")",
        f"# binary: {binary} [{binary_identity or 'unknown'}]",
        f"# model: {inst['model_path']} [{model_identity or 'unknown'}]",
        "LLAMA_SERVER_ARGS=" + " ".join(inst["args"]),
    ]
    lines += [f"{k}={v}" for k, v in inst["env"].items()]
    return "\n".join(lines) + "\n"


def dropin(inst: dict) -> str:
    """The instance's drop-in for llama-server@<name>.service: model paths read-only, the API key
    credential, and for GPU instances what CUDA needs relaxed (see the role's README)."""
    lines = [
        "# Managed by Ansible (llamafleet.mtp.llama_server_systemd); changes here are overwritten.",
        "[Service]",
    ]
    lines += [f"ReadOnlyPaths=-{p}" for p in inst["read_only_paths"]]
    if inst["api_key"]:
        lines.append(f"LoadCredential={CREDENTIAL}:{inst['key_file']}")
    if inst.get("cpus"):
        lines.append("# Its own cores on a host it shares (the plan divides them; --threads matches).")
        lines.append(f"CPUAffinity={format_cpu_list(inst['cpus'])}")
    if inst["mode"] == "gpu":
        lines += [
            "# CUDA: the GPU device nodes (DevicePolicy=closed stays), W+X memory for the driver's JIT,",
            "# /proc/driver/nvidia, and the NUMA/affinity syscalls of @resources.",
            "PrivateDevices=no",
        ]
        lines += [f"DeviceAllow={d} rw" for d in _gpu_device_allow(inst["devices"])]
        lines += [
            "MemoryDenyWriteExecute=no",
            "ProcSubset=all",
            "SystemCallFilter=",
            "SystemCallFilter=@system-service",
            "SystemCallFilter=~@privileged",
        ]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# health


def health_verdict(http_status, unit: dict, baseline: dict | None = None) -> tuple[str, str]:
    """``(state, reason)`` with state ``ready``, ``loading``, ``starting`` or ``failed``.

    ``http_status``: the /health status code, or None when nothing answered. ``unit``: systemd
    properties read after that request (ActiveState, SubState, Result, MainPID, NRestarts,
    ExecMainStatus); ``baseline``: MainPID / NRestarts right after the (re)start. llama-server
    answers 503 while the model loads and 200 once ready; a load failure exits the process.
    """
    baseline = baseline or {}
    active = unit.get("ActiveState")
    sub = unit.get("SubState")
    pid = _int(unit.get("MainPID"))
    restarts = _int(unit.get("NRestarts"))
    if active in ("failed", "inactive", "deactivating") or sub == "auto-restart":
        return "failed", (
            f"the service is {active}/{sub} (result {unit.get('Result')}, exit status "
            f"{unit.get('ExecMainStatus')}): llama-server exited"
        )
    base_pid = _int(baseline.get("MainPID"))
    if base_pid and pid and pid != base_pid:
        return "failed", f"llama-server exited and systemd restarted it (pid {base_pid} -> {pid})"
    base_restarts = _int(baseline.get("NRestarts"))
    if base_restarts is not None and restarts is not None and restarts > base_restarts:
        return "failed", f"llama-server exited and systemd restarted it ({restarts - base_restarts} time(s))"
    if active != "active":
        return "starting", f"the service is {active}/{sub}"
    if http_status == 200:
        return "ready", "/health answered 200"
    if http_status == 503:
        return "loading", "/health answered 503 (loading the model)"
    if http_status is None:
        return "starting", "nothing answers on the port yet"
    return "failed", f"/health answered HTTP {http_status}; is another program listening on this port?"


def _int(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
