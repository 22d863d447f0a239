#!/usr/bin/python
# MIT License (see LICENSE)
"""Ansible module llamafleet.mtp.llama_applied_state: record what a successful converge left on a host."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llama_applied_state
short_description: Record the declared state a converge applied and what it left on the host
version_added: "0.3.0"
description:
  - The last step of a successful converge (after the health gate and the smoke completion). Writes O(path) on the
    host (root only, mode 0600) - the O(digest) of the declared state that was applied (computed on the controller by
    P(llamafleet.mtp.fleet_declared#module)), the published facts of the stages (for the summary of later runs), the
    instances and their URLs, and a scan of what the converge manages - each instance's environment file, API key
    file and systemd drop-ins (sha256), the template unit, where C(current) and C(previous) point, and the model
    files (size and modification time).
  - The next run's P(llamafleet.mtp.llama_host_state#module) scans the same things and reports every difference
    (drift); a host whose digest matches, with no drift and every instance active and healthy, skips the converge.
    Anything that drifted (a hand-edited environment file, unit or drop-in, a deleted model, a stopped instance, a
    switched C(current) link) sends the host through the full converge, which repairs it.
  - The record is the converge's own bookkeeping, not managed state (like
    P(llamafleet.mtp.llama_server_snapshot#module)), so it never reports a change - a converge that changed
    nothing stays C(changed=0), and C(--check) predicts it exactly. RV(updated) says whether the record was
    (or, in check mode, would be) rewritten with a new digest or scan.
author:
  - llamafleet maintainers (!UNKNOWN)
options:
  digest:
    description: The digest of the declared state the converge applied.
    type: str
    required: true
  facts:
    description: The stages' published facts to keep for the summary of runs that skip the converge.
    type: dict
    default: {}
  instances:
    description: The instances that serve (C(name), C(url); more keys are kept).
    type: list
    elements: dict
    default: []
  models:
    description: The model files the instances read.
    type: list
    elements: path
    default: []
  path:
    description: Where the record lives on the host.
    type: path
    default: /var/lib/llamafleet/applied.json
extends_documentation_fragment:
  - llamafleet.mtp.attributes.host_paths
attributes:
  check_mode:
    support: full
    description: Writes nothing in check mode; reports whether it would change the record.
  diff_mode:
    support: none
    description: Nothing to diff.
"""

EXAMPLES = r"""
- name: Record the applied state (last step of the converge)
  llamafleet.mtp.llama_applied_state:
    digest: "{{ llamafleet_declared.digest }}"
    instances: "{{ llama_server_systemd_facts.instances }}"
    models: "{{ model_fetch_facts.values() | map(attribute='path') | list }}"
"""

RETURN = r"""
updated:
  description: The digest or the scan differ from the previous record (so it was rewritten, or would be in check mode).
  returned: always
  type: bool
path:
  description: The record's path.
  returned: always
  type: str
scan:
  description: What was scanned (files with sha256, links, models with size and mtime).
  returned: always
  type: dict
"""

import json
import os
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llamafleet.mtp.plugins.module_utils import host_paths
from ansible_collections.llamafleet.mtp.plugins.module_utils.applied_state import scan


def main():
    module = AnsibleModule(
        argument_spec={
            "digest": {"type": "str", "required": True},
            "facts": {"type": "dict", "default": {}},
            "instances": {"type": "list", "elements": "dict", "default": []},
            "models": {"type": "list", "elements": "path", "default": []},
            **host_paths.options("config_dir", "unit_dir", "install_root", path="applied_path"),
        },
        supports_check_mode=True,
    )
    p = module.params
    now = scan(p["config_dir"], p["unit_dir"], p["install_root"], sorted(set(p["models"])))
    try:
        with open(p["path"]) as f:
            old = json.load(f)
    except (OSError, ValueError):
        old = {}
    updated = old.get("digest") != p["digest"] or old.get("scan") != now
    if not module.check_mode:
        record = {
            "digest": p["digest"],
            "scan": now,
            "instances": [
                {k: i.get(k) for k in ("name", "unit", "url", "health_url") if k in i} for i in p["instances"]
            ],
            "facts": p["facts"],
            "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        parent = os.path.dirname(p["path"]) or "/"
        os.makedirs(parent, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".applied-", dir=parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(record, f, sort_keys=True)
            os.chmod(tmp, 0o600)
            os.replace(tmp, p["path"])
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    module.exit_json(changed=False, updated=updated, path=p["path"], scan=now)


if __name__ == "__main__":
    main()
