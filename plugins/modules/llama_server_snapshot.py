#!/usr/bin/python
"""Ansible module llamafleet.mtp.llama_server_snapshot: keep and restore a host's serving configuration."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llama_server_snapshot
short_description: Save a host's llama-server configuration before a converge, and restore it on failure
version_added: "0.2.0"
description:
  - C(state=saved) copies what decides what a host serves - every instance's environment file and API key file
    under O(config_dir), every C(llama-server@<name>.service.d/) drop-in, the template unit, and where the
    llamacpp_mtp_build role's C(current) and C(previous) links point - into O(dest) (root only, mode 0700), on the
    host itself, so API keys never travel. The old snapshot is replaced atomically. Models are not copied - their
    files stay on disk and the environment files name them.
  - C(state=restored) puts that configuration back - files written, files of instances added since removed,
    links pointed back - and returns which instances the snapshot had (to restart) and which it removed (to stop).
    It does not restart anything; the llama_server_systemd role's C(rollback) task file does.
  - The snapshot is the converge's own bookkeeping, not managed state, so C(saved) never reports a change.
author:
  - llamafleet maintainers (!UNKNOWN)
options:
  state:
    description: Save the current configuration, or restore the saved one.
    type: str
    choices: [saved, restored]
    default: saved
  dest:
    description: Where the snapshot lives on the host.
    type: path
    default: /var/lib/llamafleet/rollback
extends_documentation_fragment:
  - llamafleet.mtp.attributes.host_paths
attributes:
  check_mode:
    support: full
    description: C(saved) writes nothing in check mode; C(restored) reports what it would restore.
  diff_mode:
    support: none
    description: Nothing to diff.
"""

EXAMPLES = r"""
- name: Keep the serving configuration before changing it
  llamafleet.mtp.llama_server_snapshot:
    state: saved

- name: Put it back after a failed health gate
  llamafleet.mtp.llama_server_snapshot:
    state: restored
  register: restored
"""

RETURN = r"""
instances:
  description: Instance names in the snapshot (C(restored)) or saved now (C(saved)).
  returned: always
  type: list
  elements: str
removed:
  description: Instances configured now that the snapshot did not have; their files were removed (C(restored)).
  returned: always
  type: list
  elements: str
links:
  description: Where C(current) and C(previous) pointed (saved) or were pointed back to (restored).
  returned: always
  type: dict
"""

import glob
import json
import os
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llamafleet.mtp.plugins.module_utils import host_paths

UNIT = "llama-server@"


def _configured(config_dir):
    return sorted(os.path.basename(p)[: -len(".env")] for p in glob.glob(os.path.join(config_dir, "*.env")))


def _link(path):
    try:
        return os.readlink(path)
    except OSError:
        return None


def _set_link(path, target):
    if target is None:
        if os.path.islink(path):
            os.unlink(path)
        return
    if _link(path) == target:
        return
    tmp = f"{path}.rollback-tmp"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, path)


def _copy_file(src, dst):
    shutil.copy2(src, dst)


def save(p):
    dest = p["dest"]
    names = _configured(p["config_dir"])
    links = {n: _link(os.path.join(p["install_root"], n)) for n in ("current", "previous")}
    parent = os.path.dirname(dest.rstrip("/")) or "/"
    os.makedirs(parent, mode=0o700, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".snapshot-", dir=parent)
    os.chmod(work, 0o700)
    os.makedirs(os.path.join(work, "config"))
    os.makedirs(os.path.join(work, "dropins"))
    for name in names:
        for ext in (".env", ".key"):
            src = os.path.join(p["config_dir"], name + ext)
            if os.path.isfile(src):
                _copy_file(src, os.path.join(work, "config", name + ext))
        d = os.path.join(p["unit_dir"], f"{UNIT}{name}.service.d")
        if os.path.isdir(d):
            shutil.copytree(d, os.path.join(work, "dropins", f"{UNIT}{name}.service.d"), symlinks=True)
    unit = os.path.join(p["unit_dir"], f"{UNIT}.service")
    if os.path.isfile(unit):
        _copy_file(unit, os.path.join(work, f"{UNIT}.service"))
    with open(os.path.join(work, "snapshot.json"), "w") as f:
        json.dump({"instances": names, "links": links}, f)
    old = dest.rstrip("/") + ".old"
    if os.path.lexists(old):
        shutil.rmtree(old)
    if os.path.isdir(dest):
        os.replace(dest, old)
    os.replace(work, dest)
    if os.path.isdir(old):
        shutil.rmtree(old)
    return names, [], links


def restore(p, check):
    dest = p["dest"]
    try:
        with open(os.path.join(dest, "snapshot.json")) as f:
            snap = json.load(f)
    except (OSError, ValueError) as e:
        raise RuntimeError(f"no snapshot to restore under {dest}: {e}") from e
    names = list(snap.get("instances") or [])
    links = snap.get("links") or {}
    removed = [n for n in _configured(p["config_dir"]) if n not in names]
    if check:
        return names, removed, links
    for name in removed:
        for ext in (".env", ".key"):
            path = os.path.join(p["config_dir"], name + ext)
            if os.path.lexists(path):
                os.unlink(path)
        d = os.path.join(p["unit_dir"], f"{UNIT}{name}.service.d")
        if os.path.isdir(d):
            shutil.rmtree(d)
    for name in names:
        for ext in (".env", ".key"):
            src = os.path.join(dest, "config", name + ext)
            dst = os.path.join(p["config_dir"], name + ext)
            if os.path.isfile(src):
                _copy_file(src, dst)
            elif os.path.lexists(dst):
                os.unlink(dst)
        src = os.path.join(dest, "dropins", f"{UNIT}{name}.service.d")
        dst = os.path.join(p["unit_dir"], f"{UNIT}{name}.service.d")
        if os.path.isdir(dst):
            shutil.rmtree(dst)
        if os.path.isdir(src):
            shutil.copytree(src, dst, symlinks=True)
    unit = os.path.join(dest, f"{UNIT}.service")
    if os.path.isfile(unit):
        _copy_file(unit, os.path.join(p["unit_dir"], f"{UNIT}.service"))
    for n in ("current", "previous"):
        _set_link(os.path.join(p["install_root"], n), links.get(n))
    return names, removed, links


def main():
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["saved", "restored"], "default": "saved"},
            **host_paths.options("config_dir", "unit_dir", "install_root", dest="snapshot_dir"),
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        if p["state"] == "saved":
            if module.check_mode:
                names = _configured(p["config_dir"])
                links = {n: _link(os.path.join(p["install_root"], n)) for n in ("current", "previous")}
                module.exit_json(changed=False, instances=names, removed=[], links=links)
            names, removed, links = save(p)
            module.exit_json(changed=False, instances=names, removed=removed, links=links)
        names, removed, links = restore(p, module.check_mode)
    except (OSError, RuntimeError, shutil.Error) as e:
        module.fail_json(msg=f"llama_server_snapshot ({p['state']}): {e}")
    module.exit_json(changed=True, instances=names, removed=removed, links=links)


if __name__ == "__main__":
    main()
