#!/usr/bin/python
# MIT License (see LICENSE)
"""Ansible module llamafleet.mtp.llamacpp_install: install a build, switch current, prune - one call."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llamacpp_install
short_description: Install a llama.cpp build from its artifact, switch current atomically, prune old builds
version_added: "0.4.0"
description:
  - Manages the versioned install tree of the P(llamafleet.mtp.llamacpp_mtp_build#role) role -
    C(<install_root>/builds/<name>/), and the symlinks C(current) and C(previous) - in one call.
  - When C(builds/<name>) is missing, unpacks O(artifact) (a C(.tar.gz) holding C(<name>/)) after checking its
    sha256 against O(sha256), into a hidden directory beside the builds; runs C(<name>/bin/llama-server --version)
    there (O(check_binary)), so a build that cannot run on this host never gets its name; then renames it into
    place. Any failure leaves C(current), C(previous) and the installed builds as they were.
  - Points C(current) at the build (a new symlink renamed over the old one, atomic) and keeps the build it
    pointed at as C(previous), for rollback. With O(rollback), points C(current) at C(previous) instead (and the
    old current becomes C(previous)).
  - Removes the builds beyond the O(keep) most recently installed, never C(current) or C(previous).
  - Replaces a chain of file, unarchive, command and stat tasks (one round trip per step) with one module call.
  - Standard library only (Python 3.8+); uses C(tar) on the host.
author:
  - llamafleet maintainers (!UNKNOWN)
options:
  install_root:
    description: The install tree (holds C(builds/), C(current), C(previous)).
    type: path
    required: true
  name:
    description: The build to make current (C(<sha12>-<key8>)). Required unless O(rollback).
    type: str
  rollback:
    description: Make the build C(previous) points at current. Fails, changing nothing, when there is none.
    type: bool
    default: false
  artifact:
    description: The build's artifact on the host, unpacked when C(builds/<name>) is missing.
    type: path
  sha256:
    description: The artifact's expected sha256. Required with O(artifact).
    type: str
  keep:
    description: Builds to keep under C(builds/) (C(current) and C(previous) are always kept); without it nothing
      is pruned.
    type: int
  check_binary:
    description: Path, relative to the build, of a binary that must run C(--version) before the build is installed.
    type: str
    default: bin/llama-server
attributes:
  check_mode:
    support: full
    description: Changes nothing; reports what it would install, switch and prune.
  diff_mode:
    support: none
    description: Nothing to diff.
"""

EXAMPLES = r"""
- name: Install the artifact and switch current
  llamafleet.mtp.llamacpp_install:
    install_root: /opt/llama.cpp
    name: 0d91d73bb065-3f1c2a9e
    artifact: /var/cache/llama.cpp-build/artifacts/0d91d73bb065-3f1c2a9e.tar.gz
    sha256: "{{ artifact_sha256 }}"
    keep: 3

- name: Roll back to the previous build
  llamafleet.mtp.llamacpp_install:
    install_root: /opt/llama.cpp
    rollback: true
"""

RETURN = r"""
current:
  description: The build C(current) points at afterwards (in check mode, would point at).
  returned: always
  type: str
  sample: 0d91d73bb065-3f1c2a9e
previous:
  description: The build C(previous) points at afterwards; null when there is none.
  returned: always
  type: str
installed:
  description: Whether the build was unpacked now (in check mode, would be).
  returned: always
  type: bool
switched:
  description: Whether C(current) was switched (in check mode, would be).
  returned: always
  type: bool
info:
  description: The C(build-info.json) of the build C(current) points at afterwards (name, ref, commit, key, cuda,
    capabilities...); null in check mode when the build is not installed yet.
  returned: always
  type: dict
pruned:
  description: The builds removed (in check mode, that would be).
  returned: always
  type: list
  elements: str
"""

import json
import os
import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llamafleet.mtp.plugins.module_utils.build_install import (
    installed_builds,
    link_target,
    replace_symlink,
    switch_plan,
    to_prune,
)


def unpack(module, builds, name, artifact, sha256, check_binary):
    """Verify, unpack and check the build in a hidden directory, then rename it into builds/<name>."""
    if not artifact:
        module.fail_json(msg=f"build {name} is not installed under {builds} and no artifact was given")
    if not os.path.isfile(artifact):
        module.fail_json(msg=f"artifact={artifact} does not exist on this host; nothing was changed")
    got = module.sha256(artifact)
    if got != (sha256 or "").lower():
        module.fail_json(
            msg=f"artifact={artifact} has sha256 {got}, expected {sha256} (a corrupt copy, or the controller "
            "cache changed under it); nothing was changed"
        )
    os.makedirs(builds, mode=0o755, exist_ok=True)
    tmp = os.path.join(builds, ".unpack-" + name)
    shutil.rmtree(tmp, ignore_errors=True)
    os.mkdir(tmp, 0o755)
    try:
        rc, out, err = module.run_command(["tar", "-xzf", artifact, "-C", tmp, "--no-same-owner"])
        if rc != 0:
            module.fail_json(msg=f"could not unpack artifact={artifact} (tar rc={rc}): {(err or out).strip()}")
        unpacked = os.path.join(tmp, name)
        if not os.path.isdir(unpacked):
            module.fail_json(msg=f"artifact={artifact} does not hold {name}/; nothing was changed")
        binary = os.path.join(unpacked, check_binary)
        for key in [k for k in os.environ if k.startswith("LLAMA_ARG_")]:
            del os.environ[key]  # llama-server reads LLAMA_ARG_* as arguments
        prefix = [module.get_bin_path("timeout"), "--kill-after=5", "60"] if module.get_bin_path("timeout") else []
        rc, out, err = module.run_command([*prefix, binary, "--version"], environ_update={"LC_ALL": "C"}, cwd="/")
        if rc != 0:
            module.fail_json(
                msg=f"build {name} does not run on this host ({check_binary} --version exited {rc}); nothing was "
                "changed",
                output=((err or "") + (out or ""))[-4000:],
            )
        os.rename(unpacked, os.path.join(builds, name))
        os.utime(os.path.join(builds, name))  # installed now: the most recent build for pruning
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    module = AnsibleModule(
        argument_spec={
            "install_root": {"type": "path", "required": True},
            "name": {"type": "str"},
            "rollback": {"type": "bool", "default": False},
            "artifact": {"type": "path"},
            "sha256": {"type": "str"},
            "keep": {"type": "int"},
            "check_binary": {"type": "str", "default": "bin/llama-server"},
        },
        required_by={"artifact": "sha256"},
        mutually_exclusive=[("name", "rollback")],
        supports_check_mode=True,
    )
    p = module.params
    root = p["install_root"]
    builds = os.path.join(root, "builds")
    current = link_target(os.path.join(root, "current"))
    previous = link_target(os.path.join(root, "previous"))

    if p["rollback"]:
        if not previous or not os.path.isdir(previous):
            module.fail_json(msg=f"no previous build under {root}/previous: nothing to roll back to")
        name = os.path.basename(previous)
    elif p["name"]:
        name = p["name"]
        if "/" in name or name.startswith("."):
            module.fail_json(msg=f"name={name!r} is not a build name")
    else:
        module.fail_json(msg="one of name or rollback is required")
    target = os.path.join(builds, name)

    installed = not os.path.isdir(target)
    if installed and p["rollback"]:
        module.fail_json(msg=f"previous points at {previous}, which is not installed: nothing to roll back to")
    if installed and not module.check_mode:
        unpack(module, builds, name, p["artifact"], p["sha256"], p["check_binary"])

    plan = switch_plan(current, previous, target)
    if plan["changed"] and not module.check_mode:
        if plan["previous"] and plan["previous"] != previous:
            replace_symlink(plan["previous"], os.path.join(root, "previous"))
        replace_symlink(target, os.path.join(root, "current"))

    protected = {os.path.basename(t) for t in (plan["current"], plan["previous"]) if t}
    present = installed_builds(builds)
    if installed and module.check_mode:
        present.append((name, float("inf")))  # would be the newest
    pruned = [] if p["keep"] is None else to_prune(present, p["keep"], protected)
    if not module.check_mode:
        for old in pruned:
            shutil.rmtree(os.path.join(builds, old))

    info = None
    try:
        with open(os.path.join(target, "build-info.json")) as f:
            info = json.load(f)
    except (OSError, ValueError):
        pass  # check mode before the install, or a build without build-info.json
    module.exit_json(
        changed=installed or plan["changed"] or bool(pruned),
        info=info,
        current=name,
        previous=os.path.basename(plan["previous"]) if plan["previous"] else None,
        installed=installed,
        switched=plan["changed"],
        pruned=pruned,
    )


if __name__ == "__main__":
    main()
