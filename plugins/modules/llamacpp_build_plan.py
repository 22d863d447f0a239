#!/usr/bin/python
# Copyright: llamafleet maintainers
# MIT License (see galaxy.yml)
"""Module llamacpp_build_plan: resolve the llama.cpp ref and compute this host's build key."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llamacpp_build_plan
short_description: Resolve a llama.cpp ref and compute the build key of this host
version_added: "0.1.0"
author:
  - llamafleet maintainers (!UNKNOWN)
description:
  - Resolves O(ref) (a tag, branch, full commit sha or pull request number) to a commit with
    C(git ls-remote), unless O(commit) is given.
  - Computes the build key from the commit, the CMake arguments (CUDA switch and architectures
    included), the targets, the CUDA toolkit version, the OS release and the compiler package
    version, so that hosts with equal keys can share one artifact.
  - Reports whether the build is already installed under O(install_root) and whether the
    C(current) symlink points at it. Reads only; never changes the host.
  - The compiler identity is the version of the distribution's C(g++) package (installed, else
    the candidate apt would install), so hosts that never compile get the same key as the host
    that builds for them.
options:
  repo_url:
    description: Git URL of llama.cpp (GitHub, an internal mirror, C(git://), C(file://)).
    type: str
    required: true
  ref:
    description:
      - Tag (C(b9180)), branch, full 40-hex commit sha, or pull request (C(22673), C(pull/22673),
        C(refs/pull/22673/head)), which becomes C(refs/pull/N/head).
    type: raw
    required: true
  commit:
    description: The already resolved commit (full sha); skips C(git ls-remote).
    type: str
  resolve_only:
    description: Only resolve the ref (for a controller-side run); skip the key and install state.
    type: bool
    default: false
  cuda:
    description: Build with CUDA. C(auto) means on when O(gpu_facts) lists GPUs.
    type: str
    choices: [auto, "on", "off"]
    default: auto
  cuda_version:
    description: CUDA toolkit version the build uses (part of the key), e.g. C(12.8).
    type: str
  cuda_architectures:
    description: Explicit CUDA architectures (C(86), C(8.6), C(120a-real)); default derived from O(gpu_facts).
    type: list
    elements: str
  gpu_facts:
    description: The gpu_facts fact of this host (see llamafleet.mtp.gpu_facts).
    type: dict
  cmake_flags:
    description: Extra CMake flags, each C(-DNAME=VALUE); flags the role controls are refused.
    type: list
    elements: str
    default: []
  targets:
    description: Build targets.
    type: list
    elements: str
    default: [llama-server]
  ccache:
    description: Compile through ccache (does not change the key).
    type: bool
    default: true
  install_root:
    description: Install root holding C(builds/<sha12>-<key8>/) and the C(current) symlink.
    type: path
    default: /opt/llama.cpp
extends_documentation_fragment:
  - llamafleet.mtp.attributes.read_only
notes:
  - Resolution uses C(git ls-remote) through the git CLI (the ansible.builtin.git module has no
    resolve-only mode that peels annotated tags).
"""

EXAMPLES = r"""
- name: Resolve the ref once, on the controller
  llamafleet.mtp.llamacpp_build_plan:
    repo_url: https://github.com/ggml-org/llama.cpp.git
    ref: b9180
    resolve_only: true
  delegate_to: localhost
  run_once: true
  register: resolved

- name: Compute this host's build key
  llamafleet.mtp.llamacpp_build_plan:
    repo_url: https://github.com/ggml-org/llama.cpp.git
    ref: b9180
    commit: "{{ resolved.commit }}"
    gpu_facts: "{{ ansible_facts.gpu_facts }}"
    cuda_version: "12.8"
  register: build_plan
"""

RETURN = r"""
commit:
  description: The resolved full commit sha.
  type: str
  returned: always
ref:
  description: The ref as classified (kind pull/sha/name, the ref fetched, the pull request number).
  type: dict
  returned: always
requested:
  description: The O(repo_url) and O(ref) as given, so that a later task can tell whether this result resolves
    the same ref (the llamacpp_mtp_build role reuses the facts stage's resolution instead of asking again).
  type: dict
  returned: always
  sample: {"repo_url": "https://github.com/ggml-org/llama.cpp.git", "ref": "b9180"}
cuda:
  description: Whether this is a CUDA build.
  type: bool
  returned: unless resolve_only
cuda_architectures:
  description: CUDA architectures built (empty for CPU builds).
  type: list
  returned: unless resolve_only
cmake_args:
  description: CMake arguments that define the artifact.
  type: list
  returned: unless resolve_only
targets:
  description: Build targets.
  type: list
  returned: unless resolve_only
key:
  description: The full build key (sha256 hex).
  type: str
  returned: unless resolve_only
key8:
  description: First 8 hex digits of the key.
  type: str
  returned: unless resolve_only
name:
  description: Install directory name, C(<sha12>-<key8>).
  type: str
  returned: unless resolve_only
  sample: 0d91d73bb065-3f2a9c1e
key_material:
  description: What the key hashes (commit, cmake_args, targets, cuda_version, os_release, compiler).
  type: dict
  returned: unless resolve_only
install_dir:
  description: Where this build is (or will be) installed.
  type: str
  returned: unless resolve_only
installed:
  description: The build is installed and complete (its build-info.json exists).
  type: bool
  returned: unless resolve_only
current:
  description: Name of the build C(current) points at, or null.
  type: str
  returned: unless resolve_only
up_to_date:
  description: C(current) already points at this build key.
  type: bool
  returned: unless resolve_only
"""

import json
import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llamafleet.mtp.plugins.module_utils import host_paths
from ansible_collections.llamafleet.mtp.plugins.module_utils.llamacpp_build import (
    BuildInputError,
    build_key,
    check_targets,
    cmake_args,
    cuda_architectures,
    os_release_id,
    parse_ref,
)


def resolve(module, repo_url, ref):
    if ref["kind"] == "sha":
        if len(ref["ref"]) != 40:
            module.fail_json(msg=f"commit {ref['ref']!r} is abbreviated: give the full 40-hex sha, or a tag or branch")
        return ref["ref"]
    git = module.get_bin_path("git", required=True)
    if ref["kind"] == "pull":
        patterns = order = [ref["ref"]]
    else:
        name = ref["ref"]
        # An annotated tag's commit is its peeled entry (tag^{}); ask for it explicitly.
        patterns = [f"refs/tags/{name}", f"refs/tags/{name}^{{}}", f"refs/heads/{name}"]
        order = [f"refs/tags/{name}^{{}}", f"refs/tags/{name}", f"refs/heads/{name}"]
    rc, out, err = module.run_command(
        [git, "ls-remote", repo_url, *patterns], environ_update={"GIT_TERMINAL_PROMPT": "0"}
    )
    if rc != 0:
        module.fail_json(msg=f"git ls-remote {repo_url} failed (rc={rc}): {err.strip() or out.strip()}")
    refs = dict(reversed(line.split("\t", 1)) for line in out.splitlines() if "\t" in line)
    for name in order:
        if name in refs:
            return refs[name]
    what = f"pull request #{ref['pull']} ({ref['ref']})" if ref["kind"] == "pull" else f"tag or branch {ref['ref']!r}"
    module.fail_json(msg=f"{what} not found in {repo_url}")


def compiler_identity(module):
    rc, out, _dummy = module.run_command(["dpkg-query", "-W", "-f=${Version}", "g++"])
    if rc == 0 and out.strip():
        return "g++=" + out.strip()
    rc, out, _dummy = module.run_command(["apt-cache", "policy", "g++"])
    m = re.search(r"Candidate:\s*(\S+)", out or "")
    if rc == 0 and m and m.group(1) != "(none)":
        return "g++=" + m.group(1)
    if module.check_mode:
        # A fresh host in check mode: apt's cache was not refreshed (nothing may change). The key then
        # names no compiler, so the plan says "would build and install"; the real run knows the g++.
        return "g++=unknown (check mode, apt cache not read)"
    module.fail_json(msg="cannot tell which g++ this host uses (neither installed nor available from apt)")


def read_build_info(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            repo_url=dict(type="str", required=True),
            ref=dict(type="raw", required=True),
            commit=dict(type="str"),
            resolve_only=dict(type="bool", default=False),
            cuda=dict(type="str", choices=["auto", "on", "off"], default="auto"),
            cuda_version=dict(type="str"),
            cuda_architectures=dict(type="list", elements="str"),
            gpu_facts=dict(type="dict"),
            cmake_flags=dict(type="list", elements="str", default=[]),
            targets=dict(type="list", elements="str", default=["llama-server"]),
            ccache=dict(type="bool", default=True),
            **host_paths.options("install_root"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        ref = parse_ref(p["ref"])
        commit = p["commit"] or resolve(module, p["repo_url"], ref)
        if not re.match(r"^[0-9a-f]{40}$", commit):
            module.fail_json(msg=f"commit {commit!r} is not a full 40-hex sha")
        result = dict(changed=False, commit=commit, ref=ref, requested={"repo_url": p["repo_url"], "ref": p["ref"]})
        if p["resolve_only"]:
            module.exit_json(**result)
        gpu_count = int((p["gpu_facts"] or {}).get("count") or 0)
        cuda = gpu_count > 0 if p["cuda"] == "auto" else p["cuda"] == "on"
        archs = cuda_architectures(p["gpu_facts"], p["cuda_architectures"]) if cuda else []
        if cuda and not p["cuda_version"]:
            module.fail_json(msg="a CUDA build needs cuda_version (from the cuda_toolkit role, or set it)")
        args = cmake_args(cuda, archs, p["cmake_flags"], p["ccache"])
        targets = check_targets(p["targets"])
        try:
            with open("/etc/os-release") as f:
                osr = os_release_id(f.read())
        except OSError:
            osr = "unknown"
        key = build_key(commit, args, targets, p["cuda_version"] if cuda else None, osr, compiler_identity(module))
    except BuildInputError as e:
        module.fail_json(msg=str(e))
    root = p["install_root"]
    install_dir = os.path.join(root, "builds", key["name"])
    current_link = os.path.join(root, "current")
    current = os.path.basename(os.path.realpath(current_link)) if os.path.islink(current_link) else None
    installed = read_build_info(os.path.join(install_dir, "build-info.json")) is not None
    result.update(
        cuda=cuda,
        cuda_architectures=archs,
        cmake_args=args,
        targets=targets,
        key=key["key"],
        key8=key["key8"],
        name=key["name"],
        key_material=key["material"],
        install_dir=install_dir,
        installed=installed,
        current=current,
        up_to_date=installed and current == key["name"],
    )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
