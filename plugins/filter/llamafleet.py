"""Filter plugins for the fleet playbooks (thin wrappers over pure functions)."""

# Documentation: llamafleet_apply_autotune.yml and llamafleet_upgrade_instances.yml beside this file.


def llamafleet_apply_autotune(instances, autotune):
    """Fill draft_n_max from the benchmark's autotune result where an instance does not pin it."""
    out = []
    for inst in instances or []:
        inst = dict(inst)
        best = (autotune or {}).get(inst.get("name"))
        if "draft_n_max" not in inst and isinstance(best, int) and best > 0:
            inst["draft_n_max"] = best
        out.append(inst)
    return out


def llamafleet_upgrade_instances(instances, models):
    """Point instances at new model names ({instance name: model name}); others stay as they are."""
    models = models or {}
    unknown = set(models) - {i.get("name") for i in instances or []}
    if unknown:
        raise ValueError(f"llamafleet_upgrade_models names unknown instances: {sorted(unknown)}")
    return [dict(i, model=models[i["name"]]) if i.get("name") in models else dict(i) for i in instances or []]


class FilterModule:
    def filters(self):
        return {
            "llamafleet_apply_autotune": llamafleet_apply_autotune,
            "llamafleet_upgrade_instances": llamafleet_upgrade_instances,
        }
