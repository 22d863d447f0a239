"""Filter plugin llamafleet.mtp.llama_monitoring_plan (a thin wrapper over module_utils/monitoring.py)."""

from __future__ import annotations

# Documentation: llama_monitoring_plan.yml beside this file.
from ansible.errors import AnsibleFilterError
from ansible_collections.llamafleet.mtp.plugins.module_utils.monitoring import MonitoringError, host_states, scrape_plan


def llama_monitoring_plan(
    published,
    hosts,
    declared=None,
    speed=None,
    previous=None,
    keys_dir=None,
    gateway_hosts=None,
    gateways=None,
    role_instances=None,
    outcomes=None,
):
    try:
        kw = {"keys_dir": keys_dir} if keys_dir else {}
        # a host without a resolved declared state (the role used on its own): the server role's instances
        keyed = {h: v for h, v in dict(role_instances or {}).items() if isinstance(v, list)}
        keyed.update({h: v for h, v in dict(declared or {}).items() if isinstance(v, list)})
        plan = scrape_plan(
            list(hosts or []),
            dict(published or {}),
            keyed,
            dict(speed or {}),
            dict(previous or {}),
            gateway_hosts=list(gateway_hosts or []),
            gateways=dict(gateways or {}),
            **kw,
        )
    except MonitoringError as e:
        raise AnsibleFilterError(str(e)) from None
    # the hosts the facts stage read in this run are those with a resolved declared state
    read = [h for h, v in dict(declared or {}).items() if isinstance(v, list)]
    plan["hosts"] = host_states(list(hosts or []), read, dict(outcomes or {}), dict(previous or {}).get("hosts"))
    return plan


class FilterModule:
    def filters(self):
        return {"llama_monitoring_plan": llama_monitoring_plan}
