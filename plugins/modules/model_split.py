#!/usr/bin/python
# MIT License (see LICENSE)
"""Ansible module llamafleet.mtp.model_split: cut a verified model file into the pieces a fan-out sends."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_split
short_description: Cut a model file into pieces and hash each, for a fan-out that sends one piece per host
version_added: "1.1.0"
description:
  - Writes each of O(pieces) (a byte range of O(src)) to C(DEST/INDEX), computing its sha256 as it writes, and
    a C(DEST/manifest.json) that records them with O(src)'s pinned O(sha256), size and mtime; a later call that
    finds the same manifest (an interrupted run) reuses the pieces without reading O(src) again.
  - The model_fetch role runs it on the controller (in its cache) for a file that nobody holds and many hosts
    need; it sends each host one piece, and the hosts gather the other pieces from each other
    (llamafleet.mtp.model_peer_fetch), checking each against the sha256 returned here.
  - O(state=absent) removes O(dest).
  - Standard library only.
author:
  - llamafleet maintainers (!UNKNOWN)
options:
  src:
    description: The file to cut (a verified copy).
    type: path
  sha256:
    description: Its pinned sha256 (recorded in the manifest; the pieces of another version are cut again).
    type: str
  dest:
    description: Directory for the pieces.
    type: path
    required: true
  pieces:
    description: The byte ranges - C(index), C(offset), C(size) - that tile O(src).
    type: list
    elements: dict
    default: []
  state:
    description: C(present) cuts, C(absent) removes O(dest).
    type: str
    choices: [present, absent]
    default: present
attributes:
  check_mode:
    support: full
    description: Reports the paths the pieces would have and writes nothing (C(sha256) is then empty).
  diff_mode:
    support: none
    description: Pieces are binary.
"""

EXAMPLES = r"""
- name: Cut the model into three pieces on the controller
  llamafleet.mtp.model_split:
    src: /var/cache/llamafleet/models/qwen/qwen.gguf
    sha256: "{{ pinned }}"
    dest: /var/cache/llamafleet/models/.pieces/qwen/qwen.gguf
    pieces:
      - {index: 0, offset: 0, size: 5242880}
      - {index: 1, offset: 5242880, size: 5242880}
      - {index: 2, offset: 10485760, size: 1048576}
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
paths:
  description: Each piece's path, by index.
  returned: state=present
  type: list
  elements: str
sha256:
  description: Each piece's sha256, by index (empty in check mode).
  returned: state=present
  type: list
  elements: str
"""

import hashlib
import json
import os
import shutil

from ansible.module_utils.basic import AnsibleModule

CHUNK = 8 * 1024 * 1024


def problems_of(p: dict) -> list[str]:
    out = []
    if p["state"] == "present":
        if not p["src"] or not os.path.isfile(p["src"]):
            out.append(f"src {p['src']!r} is not a file")
        pos = 0
        for piece in sorted(p["pieces"], key=lambda x: int(x.get("offset", -1))):
            if not all(k in piece for k in ("index", "offset", "size")) or int(piece["offset"]) != pos:
                out.append(f"the pieces do not tile the file at byte {pos} (each needs index, offset and size)")
                break
            pos += int(piece["size"])
        else:
            if p["src"] and os.path.isfile(p["src"]) and pos != os.path.getsize(p["src"]):
                out.append(f"the pieces cover {pos} bytes of {os.path.getsize(p['src'])}")
        if not p["pieces"]:
            out.append("pieces is empty")
    return out


def manifest_of(p: dict) -> dict:
    st = os.stat(p["src"])
    bounds = [{k: int(x[k]) for k in ("index", "offset", "size")} for x in p["pieces"]]
    return {"sha256": p["sha256"], "size": st.st_size, "mtime_ns": st.st_mtime_ns, "pieces": bounds}


def reusable(dest: str, want: dict) -> list[str] | None:
    """The recorded sums when the manifest matches and every piece is there at its size."""
    try:
        with open(os.path.join(dest, "manifest.json")) as f:
            have = json.load(f)
    except (OSError, ValueError):
        return None
    if {k: have.get(k) for k in want} != want or len(have.get("sums") or []) != len(want["pieces"]):
        return None
    for x in want["pieces"]:
        path = os.path.join(dest, str(x["index"]))
        if not os.path.isfile(path) or os.path.getsize(path) != x["size"]:
            return None
    return have["sums"]


def cut(src: str, dest: str, pieces: list) -> list[str]:
    sums = [""] * len(pieces)
    with open(src, "rb") as f:
        for x in pieces:
            h = hashlib.sha256()
            f.seek(int(x["offset"]))
            left = int(x["size"])
            with open(os.path.join(dest, str(x["index"])), "wb") as out:
                while left > 0:
                    block = f.read(min(CHUNK, left))
                    if not block:
                        raise OSError(f"{src} ended before byte {int(x['offset']) + int(x['size'])}")
                    h.update(block)
                    out.write(block)
                    left -= len(block)
            sums[int(x["index"])] = h.hexdigest()
    return sums


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "src": {"type": "path"},
            "sha256": {"type": "str"},
            "dest": {"type": "path", "required": True},
            "pieces": {"type": "list", "elements": "dict", "default": []},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
        },
        required_if=[("state", "present", ["src", "sha256"])],
        supports_check_mode=True,
    )
    p = module.params
    dest = p["dest"]
    if p["state"] == "absent":
        there = os.path.exists(dest)
        if there and not module.check_mode:
            shutil.rmtree(dest)
        module.exit_json(changed=there)
    problems = problems_of(p)
    if problems:
        module.fail_json(msg="model_split: " + "; ".join(problems))
    paths = [os.path.join(dest, str(i)) for i in sorted(int(x["index"]) for x in p["pieces"])]
    want = manifest_of(p)
    sums = reusable(dest, want)
    if sums is not None:
        module.exit_json(changed=False, paths=paths, sha256=sums)
    if module.check_mode:
        module.exit_json(changed=True, paths=paths, sha256=[])
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest, mode=0o700)
    sums = cut(p["src"], dest, p["pieces"])
    with open(os.path.join(dest, "manifest.json"), "w") as f:
        json.dump({**want, "sums": sums}, f)
    module.exit_json(changed=True, paths=paths, sha256=sums)


if __name__ == "__main__":
    main()
