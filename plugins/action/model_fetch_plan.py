"""Action plugin llamafleet.mtp.model_fetch_plan: plan model_fetch on the controller (no round trip to the host)."""

from __future__ import annotations

from ansible.plugins.action import ActionBase
from ansible_collections.llamafleet.mtp.plugins.module_utils.model_fetch import (
    PLAN_ARGUMENT_SPEC,
    PLAN_CONSTRAINTS,
    ModelFactsError,
    ModelSpecError,
    plan,
)


class ActionModule(ActionBase):
    """Pure computation from the task's arguments: validate the model list, aggregate a fleet, plan, build facts."""

    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        # [1]: the validated parameters (an invalid argument raises before this returns)
        params = self.validate_argument_spec(argument_spec=PLAN_ARGUMENT_SPEC, **PLAN_CONSTRAINTS)[1]
        try:
            out, warnings = plan(params)
        except ModelSpecError as e:
            result.update(failed=True, changed=False, msg=f"model_fetch_models: {e}")
            return result
        except ModelFactsError as e:
            result.update(failed=True, changed=False, msg=f"model_fetch: {e}", problems=e.problems)
            return result
        result.update(out)
        if warnings:
            result["warnings"] = warnings
        return result
