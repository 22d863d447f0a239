#!/usr/bin/python
# Copyright: llamafleet maintainers
# MIT License (see galaxy.yml)
"""Module mem_bandwidth: the memory bandwidth an instance decodes against (GPU spec figure or a CPU measurement)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: mem_bandwidth
short_description: Memory bandwidth of a host's GPUs (data-sheet figure) or CPUs (a short measurement)
version_added: "0.1.0"
author:
  - llamafleet maintainers (!UNKNOWN)
description:
  - For an instance on GPUs (O(devices) given), looks the GPUs' names up in a table of vendor
    data-sheet peak bandwidths (C(plugins/module_utils/roofline.py), sources in docs/measurements.md)
    and reports the slowest of them, marked C(spec). A GPU missing from the table gives a null
    bandwidth and its name in C(unknown), not an error.
  - For an instance on CPUs, measures on the host - one process pinned per CPU of O(numa_node) (all
    CPUs this process may use when unset) copies a buffer into another (memmove) and scans it
    (memchr), all at once, best of O(rounds). Buffers are sized from the last-level cache so memory,
    not cache, is measured. Takes a few seconds and about 2 x buffer x CPUs of memory.
  - The reported C(bytes_per_s) is the read bandwidth (what a decode step does with the weights), the
    higher of all CPUs at once and the first CPU alone (on a host whose CPUs other processes hold, the
    all-at-once figure waits for the slowest process); the copy bandwidth (STREAM convention, read +
    written bytes) is returned beside it.
  - Changes nothing on the host; runs in check mode too.
options:
  gpus:
    description: C(gpu_facts.gpus) of the host (name and index per GPU).
    type: list
    elements: dict
    default: []
  devices:
    description: GPU indices the instance runs on; empty or unset for a CPU instance.
    type: list
    elements: int
    default: []
  numa_node:
    description: Measure on this NUMA node's CPUs (CPU instances); all allowed CPUs when unset.
    type: int
  buffer_mib:
    description: Buffer per process in MiB; default sized to 4 x the last-level cache over the CPUs (128..1024).
    type: int
  rounds:
    description: Measurement rounds (the best is reported, with the spread).
    type: int
    default: 3
attributes:
  check_mode:
    support: full
    description: Measures only; the same in check mode.
  diff_mode:
    support: none
    description: Changes nothing on the host; there is nothing to diff.
"""

EXAMPLES = r"""
- name: Bandwidth the instance decodes against
  llamafleet.mtp.mem_bandwidth:
    gpus: "{{ ansible_facts.gpu_facts.gpus }}"
    devices: "{{ (llama_server_systemd_facts.instances | first).devices | default([], true) }}"
  register: bw
"""

RETURN = r"""
bandwidth:
  description: The bandwidth and where it came from.
  returned: success
  type: dict
  contains:
    bytes_per_s:
      description: Bandwidth in bytes/s (GPU spec figure, or measured CPU read bandwidth); null for an unknown GPU.
      type: int
    source:
      description: C(spec (<GPU name>)) or C(measured read, CPUs <list>).
      type: str
    kind:
      description: C(gpu) or C(cpu).
      type: str
    unknown:
      description: GPU names not in the table.
      type: list
      elements: str
    cpu:
      description:
        - CPU measurement (null for GPUs) - C(copy_bytes_per_s), C(read_bytes_per_s), C(copy_spread), C(read_spread)
          (min and max over the rounds), C(single_cpu_read_bytes_per_s), C(cpus), C(buffer_mib), C(physical_cores),
          C(logical_cpus),
          C(llc_bytes), C(numa_node).
      type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llamafleet.mtp.plugins.module_utils.roofline import (
    RooflineError,
    buffer_mib,
    gpus_bandwidth,
    last_level_cache_bytes,
    measure_cpu_bandwidth,
    node_cpus,
    physical_cores,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            gpus=dict(type="list", elements="dict", default=[]),
            devices=dict(type="list", elements="int", default=[]),
            numa_node=dict(type="int"),
            buffer_mib=dict(type="int"),
            rounds=dict(type="int", default=3),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        if p["devices"]:
            g = gpus_bandwidth(p["gpus"], p["devices"])
            module.exit_json(changed=False, bandwidth=dict(g, kind="gpu", cpu=None))
        cpus = node_cpus(p["numa_node"])
        llc = last_level_cache_bytes()
        size = p["buffer_mib"] or buffer_mib(len(cpus), llc)
        m = measure_cpu_bandwidth(cpus, size_mib=size, rounds=max(1, p["rounds"]))
        # one CPU alone as well: on a host whose CPUs other processes hold, the all-at-once aggregate
        # waits for the slowest process and can fall below what one CPU reads by itself
        one = measure_cpu_bandwidth(cpus[:1], size_mib=size, rounds=max(1, p["rounds"])) if len(cpus) > 1 else m
    except RooflineError as e:
        module.fail_json(msg=str(e))
    m["single_cpu_read_bytes_per_s"] = one["read_bytes_per_s"]
    m.update(physical_cores=physical_cores(cpus), logical_cpus=len(cpus), llc_bytes=llc, numa_node=p["numa_node"])
    module.exit_json(
        changed=False,
        bandwidth={
            "bytes_per_s": max(m["read_bytes_per_s"], one["read_bytes_per_s"]),
            "source": "measured read, CPUs " + ",".join(str(c) for c in cpus),
            "kind": "cpu",
            "unknown": [],
            "cpu": m,
        },
    )


if __name__ == "__main__":
    main()
