#!/usr/bin/python
"""Ansible module llamafleet.mtp.gpu_facts: NVIDIA GPU inventory and topology from nvidia-smi."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Gather NVIDIA GPU facts (memory, topology, driver) from nvidia-smi
version_added: "0.1.0"
description:
  - Runs C(nvidia-smi --query-gpu=... --format=csv,noheader,nounits), plain C(nvidia-smi) (for the
    driver's CUDA version) and C(nvidia-smi topo -m), and publishes the result as the
    C(gpu_facts) fact in the shape docs/facts.md of the collection specifies.
  - A host without nvidia-smi, or whose nvidia-smi says C(No devices were found), gets
    C(count=0) and C(source=none) unless O(required=true).
  - "Fails, in one line that names the command and quotes at most 200 characters of nvidia-smi's own
    words, when nvidia-smi cannot talk to the driver (for example C(Failed to initialize NVML:
    Driver/library version mismatch)) or when its output cannot be parsed."
  - A GPU that reports an error (a C(Unable to determine the device handle for GPU ...) line, or
    C([Unknown Error]), C([GPU is lost]), C([GPU requires reset]) in its fields, in any letter case),
    or whose memory size or free memory is not available (C([N/A])), is still listed, with
    C(healthy=false) and the reason in C(error); the facts are returned with a warning, so the
    other GPUs can be planned on (M(llamafleet.mtp.tensor_split) skips unhealthy GPUs). Set
    O(require_healthy) to fail instead.
  - nvidia-smi's output is decoded as UTF-8 with replacement characters (a non-UTF-8 byte in a GPU
    name or a localized message does not break the result); ANSI escape codes (with or without
    their ESC byte), CRLF line ends and spaces in place of tabs are accepted.
  - Read-only; never reports a change. In check mode it runs normally.
  - Drivers older than R510 do not know the C(compute_cap) query field; the query is then repeated
    without it and C(compute_capability) is null.
author:
  - llamafleet maintainers (!UNKNOWN)
options:
  nvidia_smi:
    description:
      - Path of the nvidia-smi executable.
      - When not set, nvidia-smi is looked up on E(PATH) (and the usual sbin directories); when
        set, the file must exist and be executable.
    type: path
  required:
    description:
      - Fail when the host has no usable NVIDIA GPU (no nvidia-smi, or no devices).
    type: bool
    default: false
  require_healthy:
    description:
      - What to do when nvidia-smi reports GPUs that are not healthy.
      - C(none) - return the facts (those GPUs with C(healthy=false) and C(error)) and warn.
      - C(any) - fail when no GPU is healthy.
      - C(all) - fail when any GPU is not healthy (for hosts that must have every GPU working).
      - On failure the facts that could be read are returned as C(gpu_facts).
    type: str
    default: none
    choices: [none, any, all]
extends_documentation_fragment:
  - llamafleet.mtp.attributes.read_only
notes:
  - C(topology.matrix) and the NUMA/CPU affinity come from C(nvidia-smi topo -m); link codes are kept
    exactly as nvidia-smi prints them (X, NV4, NV12, NV18, PIX, PXB, PHB, NODE, SYS).
"""

EXAMPLES = r"""
- name: Read the GPUs of every inference host
  llamafleet.mtp.gpu_facts:

- name: A GPU host must have working GPUs
  llamafleet.mtp.gpu_facts:
    required: true

- name: Every GPU of this host must be healthy (a strict group)
  llamafleet.mtp.gpu_facts:
    require_healthy: all

- name: Use a nvidia-smi outside PATH
  llamafleet.mtp.gpu_facts:
    nvidia_smi: /usr/local/nvidia/bin/nvidia-smi

- name: Show the NVLink groups
  ansible.builtin.debug:
    var: ansible_facts.gpu_facts.topology.nvlink_groups
"""

RETURN = r"""
ansible_facts:
  description: Facts published on the host.
  returned: always
  type: dict
  contains:
    gpu_facts:
      description: The GPUs and their topology (docs/facts.md, section gpu_facts).
      returned: always
      type: dict
      contains:
        count:
          description: Number of GPUs nvidia-smi lists (0 on a host without GPUs).
          type: int
          sample: 2
        driver_version:
          description: NVIDIA driver version; null without GPUs.
          type: str
          sample: "535.104.05"
        cuda_driver_version:
          description: Highest CUDA version the driver supports (table header); null when unknown.
          type: str
          sample: "12.2"
        source:
          description: C(nvidia-smi), or C(none) when there is no nvidia-smi or no GPU.
          type: str
          sample: nvidia-smi
        gpus:
          description:
            - One entry per GPU, by nvidia-smi index (index, uuid, name, pci_bus_id, memory_total_mib,
              memory_used_mib, memory_free_mib, compute_capability, mig_mode, numa_node, cpu_affinity,
              healthy, error).
            - A GPU nvidia-smi cannot read has C(healthy=false), C(error) (nvidia-smi's words, one line)
              and null for what could not be read; a device-handle error line stands in the place of
              that GPU, so its position is its index.
          type: list
          elements: dict
          sample:
            - index: 0
              uuid: GPU-5f6b1a52-8f43-4fa6-9ad2-2b5a3c6f1e0d
              name: Tesla V100-PCIE-32GB
              pci_bus_id: "00000000:3B:00.0"
              memory_total_mib: 32768
              memory_used_mib: 0
              memory_free_mib: 32768
              compute_capability: "7.0"
              mig_mode: null
              numa_node: 0
              cpu_affinity: "0,2,4,6,8,10"
              healthy: true
              error: null
        topology:
          description:
            - C(matrix), link codes between GPUs indexed by GPU index; C(nvlink_groups), the connected
              components over NV# links (singletons omitted).
            - C(error), only when C(nvidia-smi topo -m) could not be read because of an unhealthy GPU
              (the matrix is then empty); one line naming the command.
          type: dict
          sample:
            matrix: [["X", "NV4"], ["NV4", "X"]]
            nvlink_groups: [[0, 1]]
gpu_facts:
  description: On failure because of O(require_healthy), what could be read (the GPUs with healthy=false).
  returned: failed because of O(require_healthy)
  type: dict
nvidia_smi_output:
  description: nvidia-smi's output (decoded, ANSI codes removed) when it failed or could not be parsed.
  returned: failed
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llamafleet.mtp.plugins.module_utils.gpu_read import GPU_OPTIONS, read_gpu_facts


def main() -> None:
    module = AnsibleModule(argument_spec=GPU_OPTIONS, supports_check_mode=True)
    facts = read_gpu_facts(module, **module.params)
    module.exit_json(changed=False, ansible_facts={"gpu_facts": facts})


if __name__ == "__main__":
    main()
