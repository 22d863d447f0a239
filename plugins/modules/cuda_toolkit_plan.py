#!/usr/bin/python
# Copyright: llamafleet maintainers
# MIT License (see galaxy.yml)
"""Module cuda_toolkit_plan: decide which CUDA toolkit a host gets, refuse incompatible combinations."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: cuda_toolkit_plan
short_description: Plan the CUDA toolkit of a host and refuse incompatible toolkit, GPU and driver combinations
version_added: "0.1.0"
author:
  - llamafleet maintainers (!UNKNOWN)
description:
  - Reads what is on the host (C(nvcc --version) and C(nvcc --list-gpu-arch) under the install
    prefix, C(apt-cache policy) of the distribution's toolkit and of the running kernel's headers,
    the installed C(cuda-keyring) version, NVIDIA devices on the PCI bus) and decides, with the
    C(gpu_facts) of the host, what the cuda_toolkit role does - C(skip) (no GPU), C(present) (a
    matching toolkit is installed; leave it alone) or C(install).
  - Fails, with every reason at once and before anything is changed, when the toolkit cannot
    target one of the GPUs (CUDA 13+ dropped compute capability < 7.5 such as the V100; Blackwell
    needs 12.8+), when the version is on the known-bad list (13.2), when the driver's CUDA version
    is older than the toolkit (the message names both and the fix), when the distribution ships
    another version than requested, or when a preinstalled toolkit is missing.
  - The rules live in plugins/module_utils/cuda_compat.py. Reads only; never changes the host.
options:
  host:
    description: Name of the host, used in messages (the role passes inventory_hostname).
    type: str
    required: true
  version:
    description: Toolkit version as MAJOR.MINOR, quoted (C("12.8")).
    type: str
    required: true
  source:
    description:
      - C(nvidia) (NVIDIA's apt repository, package C(cuda-toolkit-X-Y)), C(distro) (the
        distribution's C(nvidia-cuda-toolkit)), C(none) (expect it preinstalled).
    type: str
    choices: [nvidia, distro, none]
    default: nvidia
  gpu_facts:
    description: The gpu_facts fact of the host (module llamafleet.mtp.gpu_facts).
    type: dict
    required: true
  distribution:
    description: Distribution name (ansible_facts.distribution, e.g. Debian, Ubuntu).
    type: str
    required: true
  distribution_version:
    description: Distribution version (ansible_facts.distribution_version, e.g. C(12), C(24.04)).
    type: str
    required: true
  distribution_release:
    description: Codename (ansible_facts.distribution_release), for the distro source's suites.
    type: str
    default: ""
  architecture:
    description: Machine architecture (ansible_facts.architecture, e.g. x86_64, aarch64).
    type: str
    required: true
  require_gpus:
    description: Fail on hosts without GPUs instead of skipping them.
    type: bool
    default: false
  install_without_gpus:
    description: Install on hosts without GPUs too (build hosts that compile for others).
    type: bool
    default: false
  prefix:
    description: Install prefix to look for C(bin/nvcc) under; default per source (C(/usr/local/cuda-X.Y), C(/usr)).
    type: str
    default: ""
  package_version:
    description: Exact version of the C(cuda-toolkit-X-Y) package (C(12.8.1-1)); empty = the newest.
    type: str
    default: ""
  known_bad:
    description: Extra known-bad versions (C(version) -> reason), added to the built-in list (13.2).
    type: dict
    default: {}
  allow_known_bad:
    description: Only warn about a known-bad version.
    type: bool
    default: false
  driver_manage:
    description: The role manages the driver (else it only checks it).
    type: bool
    default: false
  driver_min_branch:
    description: Minimum driver branch (C(570)); 0 = the toolkit's minimum from NVIDIA's table.
    type: int
    default: 0
  driver_packages:
    description:
      - Driver packages when managing the driver; empty = per source (C(cuda-drivers-<branch>), C(nvidia-driver)).
    type: list
    elements: str
    default: []
  kernel:
    description: The running kernel (ansible_facts.kernel), whose headers a driver install needs.
    type: str
    default: ""
  nvidia_repo_base_url:
    description: Base URL of NVIDIA's CUDA repositories, or of a mirror with the same layout.
    type: str
    default: https://developer.download.nvidia.com/compute/cuda/repos
  nvidia_repo_distro:
    description: Repository directory (debian12, debian13, ubuntu2204, ubuntu2404); empty = from the distribution.
    type: str
    default: ""
  nvidia_repo_arch:
    description: Repository architecture (x86_64, sbsa); empty = from the machine architecture.
    type: str
    default: ""
  keyring_version:
    description: Version of the cuda-keyring package (pinned).
    type: str
    default: "1.1-1"
  distro_mirror:
    description: Mirror for the distro source's extra components; empty = deb.debian.org or archive/ports.ubuntu.com.
    type: str
    default: ""
  pci_devices_dir:
    description: Where to look for NVIDIA PCI devices when gpu_facts lists none.
    type: path
    default: /sys/bus/pci/devices
extends_documentation_fragment:
  - llamafleet.mtp.attributes.read_only
notes:
  - The driver's CUDA version is the C(CUDA Version) nvidia-smi prints (gpu_facts.cuda_driver_version).
"""

EXAMPLES = r"""
- name: Plan CUDA 12.8 for this host
  llamafleet.mtp.cuda_toolkit_plan:
    host: "{{ inventory_hostname }}"
    version: "12.8"
    gpu_facts: "{{ ansible_facts.gpu_facts }}"
    distribution: "{{ ansible_facts.distribution }}"
    distribution_version: "{{ ansible_facts.distribution_version }}"
    architecture: "{{ ansible_facts.architecture }}"
  register: cuda_plan

- name: Show where the toolkit would come from
  ansible.builtin.debug:
    msg: "{{ cuda_plan.plan.action }} {{ cuda_plan.plan.toolkit.package }} from {{ cuda_plan.plan.repo.url }}"
"""

RETURN = r"""
plan:
  description:
    - The decision - action (skip, present, install), skipped and reason, version, source, gpus,
      toolkit (package, prefix, architectures from NVIDIA's table, min_driver, known_bad), installed
      (the matching toolkit nvcc found - version, release, nvcc, prefix, architectures and
      architectures_source nvcc or table - or null), found (every toolkit seen), repo (nvidia - distro,
      arch, url, keyring_url, keyring_action, source_file, sources as deb822 text, keyring_list; distro -
      package, candidate, ships, enable_components, sources), driver (version, branch, cuda_version,
      min_branch, new_enough, manage, action none/install/upgrade, packages, headers_package,
      headers_available) and warnings.
  type: dict
  returned: always
  sample:
    action: install
    version: "12.8"
    source: nvidia
    skipped: false
    toolkit: {package: cuda-toolkit-12-8, prefix: /usr/local/cuda-12.8, min_driver: "570.26"}
    repo: {distro: debian12, arch: x86_64, url: "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/"}
facts:
  description:
    - The cuda_toolkit_facts the role publishes - version, release, nvcc, prefix, architectures,
      architectures_source, installed, host_compiler, source, requested, skipped, reason, driver.
  type: dict
  returned: always
check_mode:
  description:
    - Whether this task ran in check mode (also when only the task or an included role is in check mode,
      which the C(ansible_check_mode) variable does not show).
  type: bool
  returned: success
reasons:
  description: Every reason for a refusal.
  type: list
  elements: str
  returned: failed
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llamafleet.mtp.plugins.module_utils.cuda_compat import (
    CudaInputError,
    Refused,
    facts_from_plan,
    nvcc_candidates,
    nvidia_pci_gpus,
    parse_version,
    plan,
)


def _names(package) -> str:
    return " ".join(package) if isinstance(package, list) else str(package)


def read_pci(path: str) -> int | None:
    try:
        names = os.listdir(path)
    except OSError:
        return None
    devices = []
    for name in names:
        try:
            with open(os.path.join(path, name, "vendor")) as v, open(os.path.join(path, name, "class")) as c:
                devices.append((v.read(), c.read()))
        except OSError:
            continue
    return nvidia_pci_gpus(devices)


def _argument_spec() -> dict:
    """The module's options (DOCUMENTATION describes them)."""
    return {
        "host": {"type": "str", "required": True},
        "version": {"type": "str", "required": True},
        "source": {"type": "str", "choices": ["nvidia", "distro", "none"], "default": "nvidia"},
        "gpu_facts": {"type": "dict", "required": True},
        "distribution": {"type": "str", "required": True},
        "distribution_version": {"type": "str", "required": True},
        "distribution_release": {"type": "str", "default": ""},
        "architecture": {"type": "str", "required": True},
        "require_gpus": {"type": "bool", "default": False},
        "install_without_gpus": {"type": "bool", "default": False},
        "prefix": {"type": "str", "default": ""},
        "package_version": {"type": "str", "default": ""},
        "known_bad": {"type": "dict", "default": {}},
        "allow_known_bad": {"type": "bool", "default": False},
        "driver_manage": {"type": "bool", "default": False},
        "driver_min_branch": {"type": "int", "default": 0},
        "driver_packages": {"type": "list", "elements": "str", "default": []},
        "kernel": {"type": "str", "default": ""},
        "nvidia_repo_base_url": {
            "type": "str",
            "default": "https://developer.download.nvidia.com/compute/cuda/repos",
        },
        "nvidia_repo_distro": {"type": "str", "default": ""},
        "nvidia_repo_arch": {"type": "str", "default": ""},
        "keyring_version": {"type": "str", "default": "1.1-1", "no_log": False},
        "distro_mirror": {"type": "str", "default": ""},
        "pci_devices_dir": {"type": "path", "default": "/sys/bus/pci/devices"},
    }


def _run(module, argv):
    """Run a command on the host in the C locale: (rc, stdout, stderr)."""
    rc, out, err = module.run_command(argv, environ_update={"LC_ALL": "C"})
    return rc, out, err


def _observe_nvcc(module, candidates: list[str]) -> dict:
    """What nvcc --version and --list-gpu-arch say under each candidate prefix that has an nvcc."""
    seen_by_prefix = {}
    for prefix in candidates:
        nvcc = os.path.join(prefix, "bin", "nvcc")
        if not (os.path.isfile(nvcc) and os.access(nvcc, os.X_OK)):
            continue
        rc, out, err = _run(module, [nvcc, "--version"])
        seen = {"version_output": out if rc == 0 else None, "arch_output": None}
        if rc != 0:
            module.warn(f"{nvcc} --version failed (rc {rc}): {(err or out).strip()[:200]}")
        else:
            rc, out, _dummy = _run(module, [nvcc, "--list-gpu-arch"])
            seen["arch_output"] = out if rc == 0 else None
        seen_by_prefix[prefix] = seen
    return seen_by_prefix


def _observe_host(module, p: dict, candidates: list[str]) -> dict:
    """Everything plan() reads from the host: nvcc outputs, the apt policies it needs, the installed
    cuda-keyring and, without GPUs in gpu_facts, the NVIDIA devices on the PCI bus."""
    observed = {"nvcc": _observe_nvcc(module, candidates)}
    apt_cache = module.get_bin_path("apt-cache")
    if apt_cache and p["source"] == "distro":
        rc, out, _dummy = _run(module, [apt_cache, "policy", "nvidia-cuda-toolkit"])
        observed["distro_policy"] = out if rc == 0 else None
    if apt_cache and p["driver_manage"] and p["kernel"]:
        rc, out, _dummy = _run(module, [apt_cache, "policy", f"linux-headers-{p['kernel']}"])
        observed["headers_policy"] = out if rc == 0 else None
    dpkg_query = module.get_bin_path("dpkg-query")
    if dpkg_query and p["source"] == "nvidia":
        rc, out, _dummy = _run(module, [dpkg_query, "-W", "-f=${Status} ${Version}", "cuda-keyring"])
        words = out.split() if rc == 0 else []
        observed["keyring_installed"] = words[-1] if len(words) == 4 and words[2] == "installed" else None
    if not (p["gpu_facts"] or {}).get("count"):
        observed["pci_nvidia"] = read_pci(p["pci_devices_dir"])
    return observed


def _plan_from_params(p: dict, observed: dict) -> dict:
    """plan() for the module's options (the nvidia_repo_* options drop their prefix)."""
    return plan(
        host=p["host"],
        version=p["version"],
        source=p["source"],
        gpu_facts=p["gpu_facts"],
        distribution=p["distribution"],
        distribution_version=p["distribution_version"],
        distribution_release=p["distribution_release"],
        architecture=p["architecture"],
        require_gpus=p["require_gpus"],
        install_without_gpus=p["install_without_gpus"],
        prefix=p["prefix"],
        package_version=p["package_version"],
        known_bad=p["known_bad"],
        allow_known_bad=p["allow_known_bad"],
        driver_manage=p["driver_manage"],
        driver_min_branch=p["driver_min_branch"],
        driver_packages=p["driver_packages"],
        kernel=p["kernel"],
        base_url=p["nvidia_repo_base_url"],
        repo_distro=p["nvidia_repo_distro"],
        repo_arch=p["nvidia_repo_arch"],
        keyring_version=p["keyring_version"],
        distro_mirror=p["distro_mirror"],
        observed=observed,
    )


def _summary(result: dict) -> str:
    """The one-line msg for the plan's action (skip, present or install)."""
    return {
        "skip": f"skip: {result['reason']}",
        "present": f"CUDA {result['version']} present at {(result['installed'] or {}).get('prefix')}; left alone",
        "install": f"install {_names(result['toolkit']['package'])} (CUDA {result['version']}, {result['source']})",
    }[result["action"]]


def main() -> None:
    module = AnsibleModule(argument_spec=_argument_spec(), supports_check_mode=True)
    p = module.params
    try:
        want = parse_version(p["version"])
        candidates = nvcc_candidates(want, p["source"], p["prefix"])
    except CudaInputError as e:
        module.fail_json(msg=str(e))
    observed = _observe_host(module, p, candidates)
    try:
        result = _plan_from_params(p, observed)
    except Refused as e:
        module.fail_json(msg=str(e), reasons=e.reasons, plan=e.plan)
    except CudaInputError as e:
        module.fail_json(msg=str(e))
    for w in result["warnings"]:
        module.warn(w)
    module.exit_json(
        changed=False, msg=_summary(result), plan=result, facts=facts_from_plan(result), check_mode=module.check_mode
    )


if __name__ == "__main__":
    main()
