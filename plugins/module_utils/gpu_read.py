# MIT License (see LICENSE)
"""Read a host's GPU topology the way llamafleet.mtp.gpu_facts publishes it, for any module to call.

gpu_facts and llama_host_state (with its gpu_facts option: the facts stage reads a host in one call) share it.
It uses the module for what only a module can do (find and run nvidia-smi, warn, fail).
"""

from __future__ import annotations

import os

from ansible_collections.llamafleet.mtp.plugins.module_utils.nvidia_smi import (
    GpuError,
    NoDevicesError,
    NvidiaSmiError,
    collect,
    empty_facts,
)

# The options, written once (gpu_facts' argument spec; llama_host_state's gpu_facts suboptions).
GPU_OPTIONS = {
    "nvidia_smi": {"type": "path"},
    "required": {"type": "bool", "default": False},
    "require_healthy": {"type": "str", "default": "none", "choices": ["none", "any", "all"]},
}


def read_gpu_facts(module, nvidia_smi=None, required=False, require_healthy="none") -> dict:
    """The gpu_facts fact of this host; fails the module on a bad nvidia-smi or an unmet requirement."""
    path = nvidia_smi
    if path:
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            module.fail_json(msg=f"nvidia_smi={path} is not an executable file; give the path of nvidia-smi or omit it")
    else:
        path = module.get_bin_path("nvidia-smi")

    def no_gpu(reason: str) -> dict:
        if required:
            module.fail_json(msg=f"required=true but this host has no usable NVIDIA GPU: {reason}")
        return empty_facts()

    if not path:
        return no_gpu("nvidia-smi is not on PATH (install the NVIDIA driver, or set nvidia_smi)")

    def run(argv: list[str]) -> tuple[int, bytes, bytes]:
        # bytes: collect() decodes them with replacement, so a non-UTF-8 byte cannot break the result
        return module.run_command(argv, environ_update={"LC_ALL": "C"}, encoding=None)

    try:
        facts = collect(run, path, require_healthy)
    except NoDevicesError as e:
        return no_gpu(str(e))
    except GpuError as e:
        module.fail_json(msg=str(e), gpu_facts=e.facts, nvidia_smi_output=e.output)
    except NvidiaSmiError as e:
        module.fail_json(msg=str(e), nvidia_smi_output=e.output)
    for gpu in facts["gpus"]:
        if not gpu["healthy"]:
            module.warn(f"GPU {gpu['index']} ({gpu['pci_bus_id'] or 'bus id unknown'}) is not healthy: {gpu['error']}")
    if facts["topology"].get("error"):
        module.warn(f"no GPU topology: {facts['topology']['error']}")
    return facts
