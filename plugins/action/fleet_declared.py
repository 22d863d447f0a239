"""Action plugin llamafleet.mtp.fleet_declared: resolve and check a host's declared state on the controller."""

from __future__ import annotations

import hashlib
import os

import yaml
from ansible.plugins.action import ActionBase
from ansible_collections.llamafleet.mtp.plugins.module_utils.applied_state import declared_digest
from ansible_collections.llamafleet.mtp.plugins.module_utils.fleet_instances import (
    DeclaredStateError,
    declared_state,
)

COLLECTION = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Volatile GPU readings: not part of what a host is declared to run.
GPU_VOLATILE = ("memory_used_mib", "memory_free_mib")
# Role options the converge sets from the declared state itself (already in the digest as resolved values);
# the inventory's raw pin must not count twice (after an upgrade it names the same ref the upgrade applied).
DECLARED_VARS = ("llamacpp_mtp_build_ref", "model_fetch_models", "llama_server_systemd_instances")
_CACHE: dict = {}
# libyaml's safe loader when PyYAML has it: the pure-Python one takes ~0.1 s for the argument specs, and
# every host's task runs in a fresh worker process (the cache below lives as long as one task on one host).
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def collection_digest():
    """sha256 over the collection's roles, plugins and playbooks: a new collection version re-converges."""
    if "collection" not in _CACHE:
        h = hashlib.sha256()
        for top in ("roles", "plugins", "playbooks"):
            for root, dirs, files in os.walk(os.path.join(COLLECTION, top)):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                for name in sorted(files):
                    if name.endswith((".pyc", ".pyo")):
                        continue
                    path = os.path.join(root, name)
                    h.update(os.path.relpath(path, COLLECTION).encode() + b"\0")
                    with open(path, "rb") as f:
                        h.update(hashlib.sha256(f.read()).digest())
        _CACHE["collection"] = h.hexdigest()
    return _CACHE["collection"]


def role_inputs():
    """Every option of every role's meta/argument_specs.yml: the variables the converge reads."""
    if "inputs" not in _CACHE:
        names = set()
        roles = os.path.join(COLLECTION, "roles")
        for role in sorted(os.listdir(roles)):
            spec = os.path.join(roles, role, "meta", "argument_specs.yml")
            if os.path.isfile(spec):
                with open(spec) as f:
                    doc = yaml.load(f, Loader=SAFE_LOADER) or {}  # noqa: S506  # a safe loader
                for entry in (doc.get("argument_specs") or {}).values():
                    names.update((entry or {}).get("options") or {})
        _CACHE["inputs"] = sorted(names)
    return _CACHE["inputs"]


def gpu_identity(gpu_facts):
    gf = dict(gpu_facts or {})
    gf["gpus"] = [{k: v for k, v in g.items() if k not in GPU_VOLATILE} for g in gf.get("gpus") or []]
    return gf


class ActionModule(ActionBase):
    """Pure computation on the controller: no connection to the host, the same in check mode."""

    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset(
        (
            "ref",
            "instances",
            "models",
            "autotune",
            "model_overrides",
            "running_build",
            "allow_downgrade",
            "applied",
            "inputs",
            "full_converge",
        )
    )

    def _role_vars(self, task_vars):
        out = {}
        for name in role_inputs():
            if name in task_vars and name not in DECLARED_VARS:
                try:
                    out[name] = self._templar.template(task_vars[name])
                except Exception:  # noqa: BLE001  # pylint: disable=broad-except  # unrenderable: hash as written
                    out[name] = task_vars[name]
        return out

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        host = (task_vars or {}).get("inventory_hostname")
        try:
            state = declared_state(
                host=host,
                ref=args.get("ref"),
                instances=args.get("instances"),
                models=args.get("models"),
                autotune=args.get("autotune") or {},
                model_overrides=args.get("model_overrides") or {},
                running_build=args.get("running_build"),
                allow_downgrade=bool(args.get("allow_downgrade")),
            )
        except DeclaredStateError as e:
            result.update(failed=True, msg=str(e), problems=e.problems)
            return result
        task_vars = task_vars or {}
        facts = task_vars.get("ansible_facts") or {}
        # What decides what the host runs: the resolved declared state, the role variables, the collection,
        # the GPUs (not their free memory), the CPUs and what the caller adds (the resolved commit of the ref).
        digest = declared_digest(
            {
                "declared": state,
                "inputs": args.get("inputs") or {},
                "vars": self._role_vars(task_vars),
                "collection": collection_digest(),
                "gpus": gpu_identity(facts.get("gpu_facts")),
                "mem_total_bytes": (facts.get("llama_host_state") or {}).get("mem_total_bytes"),
                # the CPUs the host may use: the plan divides them between its instances
                "cpus": [(facts.get("llama_host_state") or {}).get(k) for k in ("cpus", "cpu_cores_online")],
            }
        )
        applied = args.get("applied")
        if args.get("full_converge"):
            drift = ["a full converge was asked for (llamafleet_full_converge)"]
        elif not applied:
            drift = ["no record of a converge"]
        elif applied.get("digest") != digest:
            drift = ["the declared state differs from the one applied"] + list(applied.get("drift") or [])
        else:
            drift = list(applied.get("drift") or [])
        result.update(changed=False, digest=digest, converged=not drift, drift=drift, **state)
        # The resolved instances carry API keys: keep the successful result out of the output.
        result["_ansible_no_log"] = True
        return result
