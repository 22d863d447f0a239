"""Action plugin llamafleet.mtp.instance_plan: plan every instance of a host on the controller."""

from __future__ import annotations

from ansible.plugins.action import ActionBase
from ansible_collections.llamafleet.mtp.plugins.module_utils.fleet_instances import plan_host


class ActionModule(ActionBase):
    """Pure computation on the controller from facts the earlier stages published."""

    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset(("instances", "models", "gpu_facts", "host_state", "declared_models"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        host = (task_vars or {}).get("inventory_hostname")
        out = plan_host(
            host=host,
            instances=args.get("instances") or [],
            models=args.get("models") or {},
            gpu_facts=args.get("gpu_facts") or {},
            host_state=args.get("host_state") or {},
            declared_models=args.get("declared_models") or [],
            check_mode=bool(self._task.check_mode or self._play_context.check_mode),
        )
        if out["problems"]:
            result.update(
                failed=True,
                msg="llamafleet: nothing was restarted; these instances cannot run as declared:\n- "
                + "\n- ".join(out["problems"]),
                problems=out["problems"],
                plan=out["plan"],
            )
            return result
        result.update(changed=False, plan=out["plan"], instances=out["instances"], notes=out["notes"])
        result["_ansible_no_log"] = True
        return result
