"""Action plugin llamafleet.mtp.fleet_declared: resolve and check a host's declared state on the controller."""

from __future__ import annotations

from ansible.plugins.action import ActionBase
from ansible_collections.llamafleet.mtp.plugins.module_utils.fleet_instances import (
    DeclaredStateError,
    declared_state,
)


class ActionModule(ActionBase):
    """Pure computation on the controller: no connection to the host, the same in check mode."""

    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset(
        ("ref", "instances", "models", "autotune", "model_overrides", "running_build", "allow_downgrade")
    )

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
        result.update(changed=False, **state)
        # The resolved instances carry API keys: keep the successful result out of the output.
        result["_ansible_no_log"] = True
        return result
