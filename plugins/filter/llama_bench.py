"""Filter plugins over module_utils.llama_bench and roofline: llama_bench_compare, llama_bench_table,
llama_bench_roofline, llama_bench_sweep, llama_bench_sweep_configs, llama_speed_gate."""

import os

from ansible_collections.llamafleet.mtp.plugins.module_utils.llama_bench import (
    compare,
    speed_verdict,
    sweep_configs,
    sweep_gap,
    table,
)
from ansible_collections.llamafleet.mtp.plugins.module_utils.roofline import add_roofline

# Documentation: llama_bench_*.yml beside this file.


def llama_bench_compare(rows):
    return compare([dict(r) for r in rows])


def llama_bench_table(result):
    return table(result)


def llama_bench_roofline(result, decode_bytes, bandwidth=None, source=None):
    return add_roofline(result, dict(decode_bytes), bandwidth, source)


def llama_bench_sweep(rows, default_label, configs=None):
    return sweep_gap([dict(r) for r in rows], default_label, [dict(c) for c in configs or []])


def llama_bench_sweep_configs(kind, physical_cores=0, logical_cpus=0, gpu_count=0):
    return sweep_configs(kind, physical_cores or 0, logical_cpus or 0, gpu_count or 0)


def llama_speed_gate(
    before,
    after,
    margin=0.1,
    build_before=None,
    build_after=None,
    models_before=None,
    models_after=None,
    alpha=0.05,
    carried=None,
):
    """``speed_verdict`` with the builds and models of the message; ``carried``: name -> the verdict entry the last
    converge recorded, kept (as not measured this time: no change, ``carried: true``) for the instances measured
    neither before nor after here (they did not restart)."""
    names = set(before or {}) | set(after or {})
    context = {
        n: {
            "build_before": build_before,
            "build_after": build_after,
            "model_before": os.path.basename((models_before or {}).get(n) or "") or None,
            "model_after": os.path.basename((models_after or {}).get(n) or "") or None,
        }
        for n in names
    }
    verdict = speed_verdict(dict(before or {}), dict(after or {}), margin, context, alpha)
    for name, entry in (carried or {}).items():
        if name not in names and isinstance(entry, dict):
            verdict["instances"][name] = dict(
                entry, change=None, p_value=None, slower=False, tok_s_before=None, carried=True
            )
    return verdict


class FilterModule:
    def filters(self):
        return {
            "llama_bench_compare": llama_bench_compare,
            "llama_bench_table": llama_bench_table,
            "llama_bench_roofline": llama_bench_roofline,
            "llama_bench_sweep": llama_bench_sweep,
            "llama_bench_sweep_configs": llama_bench_sweep_configs,
            "llama_speed_gate": llama_speed_gate,
        }
