#!/usr/bin/python
"""Ansible module: verify model files by sha256 (sidecar-backed) and adopt temp files atomically."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_verify
short_description: Verify model files by size and sha256 (remembered in a sidecar), adopt verified temp files
version_added: "0.1.0"
description:
  - For each file, reports whether it is there and what is expected, hashing it only when its
    C(NAME.verified.json) sidecar does not vouch for its current size and mtime (or I(verify=full)). A file that
    verifies gets its sidecar written.
  - A file with I(incoming) (a complete temp file in the same directory, e.g. from copy or get_url) is adopted -
    its size and sha256 are checked, owner and mode set, then it is renamed over I(path) atomically and the
    sidecar written. On a mismatch the temp file is deleted, I(path) is left untouched and the module fails.
  - Standard library only; runs on the hosts' system Python and on the controller.
author:
  - llamafleet maintainers (!UNKNOWN)
options:
  files:
    description:
      - Files to check or adopt. Keys - C(path) (required, the installed name), C(sha256) (expected; without it a
        file verifies as whatever it hashes to), C(size) (expected bytes), C(incoming) (temp file to adopt),
        C(sidecar) (where the sidecar lives when not beside the file), C(source) (dict recorded in the sidecar),
        and C(model), C(name), C(src), C(via), echoed back as they are to tell the entries apart.
    type: list
    elements: dict
    required: true
  verify:
    description: C(quick) trusts a sidecar whose size and mtime match; C(full) re-hashes.
    type: str
    choices: [quick, full]
    default: quick
  owner:
    description: Owner set on adopted files and written sidecars.
    type: str
  group:
    description: Group set on adopted files and written sidecars.
    type: str
  mode:
    description: Mode (octal string) set on adopted files and written sidecars; also enforced on verified files.
    type: str
  missing_ok:
    description: Report missing or stale files in C(missing) instead of failing.
    type: bool
    default: true
  adopt:
    description:
      - Adopt every file from its temp file - C(incoming) when given, else C(DIR/.NAME.incoming) (the name the
        model_fetch role copies and downloads to).
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Hashes and reports as usual, but writes no sidecar, sets no owner or mode and adopts no temp
      file (those report C(would_adopt)).
  diff_mode:
    support: none
    description: Files are binary model weights; there is nothing to diff.
"""

EXAMPLES = r"""
- name: Which files still need fetching
  llamafleet.mtp.model_verify:
    files:
      - path: /var/lib/llama-models/tiny/tiny.gguf
        sha256: "{{ expected }}"
  register: state

- name: Adopt a copied file once verified
  llamafleet.mtp.model_verify:
    files:
      - path: /var/lib/llama-models/tiny/tiny.gguf
        incoming: /var/lib/llama-models/tiny/.tiny.gguf.incoming
        sha256: "{{ expected }}"
    owner: root
    group: llama
    mode: "0640"
"""

RETURN = r"""
files:
  description:
    - Per file - C(path), C(model), C(name), C(status) (C(ok), C(missing), C(stale) (present but not the expected
      content), C(adopted), C(would_adopt) in check mode), C(sha256), C(size), C(hashed) (whether it was read).
  returned: always
  type: list
  elements: dict
missing:
  description:
    - The entries whose status is missing or stale, as given (C(model), C(name), C(src), C(via), C(path), and
      the expected C(sha256) and C(size)) plus C(reason); they can be passed back as I(files) with I(adopt).
  returned: always
  type: list
  elements: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llamafleet.mtp.plugins.module_utils.model_files import (
    SHA256_RE,
    VerifyError,
    adopt,
    apply_owner,
    check_file,
    incoming_path,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "files": {"type": "list", "elements": "dict", "required": True},
            "verify": {"type": "str", "choices": ["quick", "full"], "default": "quick"},
            "owner": {"type": "str"},
            "group": {"type": "str"},
            "mode": {"type": "str"},
            "missing_ok": {"type": "bool", "default": True},
            "adopt": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    mode = None
    if p["mode"]:
        try:
            mode = int(str(p["mode"]), 8)
        except ValueError:
            module.fail_json(msg=f"mode must be an octal string like '0640', got {p['mode']!r}")
    fs = {"owner": p["owner"], "group": p["group"], "mode": mode}
    out, missing, changed = [], [], False
    for f in p["files"]:
        path = f.get("path")
        if not path or not str(path).startswith("/"):
            module.fail_json(msg=f"each file needs an absolute path, got {f!r}")
        sha = (f.get("sha256") or "").lower() or None
        if sha and not SHA256_RE.match(sha):
            module.fail_json(msg=f"{path}: sha256 must be 64 hex digits, got {f.get('sha256')!r}")
        size = f.get("size")
        size = int(size) if size not in (None, "") else None
        label = {k: f.get(k) for k in ("model", "name", "src", "via")}
        try:
            incoming = f.get("incoming") or (incoming_path(path) if p["adopt"] else None)
            if incoming:
                if module.check_mode:
                    res = {"path": path, "status": "would_adopt", "sha256": sha, "size": size, "hashed": False}
                elif not os.path.exists(incoming):
                    module.fail_json(msg=f"{path}: nothing to adopt, {incoming} does not exist", files=out)
                else:
                    res = adopt(incoming, path, sha, size, source=f.get("source"), **fs)
                changed = True
            else:
                res = check_file(
                    path,
                    sha,
                    size,
                    full=p["verify"] == "full",
                    write=not module.check_mode,
                    source=f.get("source"),
                    sidecar=f.get("sidecar"),
                    **(fs if not f.get("sidecar") else {}),
                )
                changed |= res.pop("changed")
                if res["status"] == "ok" and not f.get("sidecar") and not module.check_mode:
                    changed |= apply_owner(path, **fs)
        except VerifyError as e:
            module.fail_json(msg=str(e), files=out, changed=changed)
        except OSError as e:
            module.fail_json(msg=f"{path}: {e}", files=out, changed=changed)
        res.update(label)
        out.append(res)
        if res["status"] in ("missing", "stale"):
            missing.append({**label, "path": path, "sha256": sha, "size": size, "reason": res.get("reason")})
    if missing and not p["missing_ok"]:
        names = "; ".join(f"{m['path']} ({m['reason'] or 'missing'})" for m in missing)
        module.fail_json(msg=f"not present or not as expected: {names}", files=out, missing=missing, changed=changed)
    module.exit_json(changed=changed, files=out, missing=missing)


if __name__ == "__main__":
    main()
