#!/usr/bin/python
"""Ansible module: download files of a Hugging Face repo with huggingface_hub, verified and resumable."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: hf_download
short_description: Download model files from Hugging Face (or a mirror), verified, resumable across runs
version_added: "0.1.0"
description:
  - Resolves the selected files of a Hugging Face model repo at a revision (commit, size and sha256 from the
    Hub's metadata), checks the disk space, downloads what is missing with the real huggingface_hub client
    (its C(http_get), or C(xet_get) where the Hub serves the file from Xet and hf_xet is installed), verifies
    size and sha256 and moves each file into place atomically.
  - Must run under a Python that has huggingface_hub (2.x); the model_fetch role sets C(ansible_python_interpreter)
    to the virtual environment it manages for this.
  - A download goes to C(DIR/.NAME.partial); if a run is interrupted, the partial file stays and the next run
    resumes it with an HTTP range request (the client alone resumes only within one process).
  - A file already verified (C(NAME.verified.json) sidecar with the same size and mtime) is not read again.
    With a commit sha as I(revision) the resolved file list is kept in C(DIR/.hf-manifest.json), and a run that
    finds every file verified does not contact the Hub at all.
  - The token is an option with C(no_log); it is handed to huggingface_hub in memory (the HTTP Authorization
    header of Hub requests, dropped for CDN redirects) and never put in an environment variable, a file or an
    argument list.
author:
  - llamafleet maintainers (!UNKNOWN)
options:
  repo:
    description: Repo id, C(owner/name).
    type: str
    required: true
  revision:
    description: Branch, tag or commit sha (a commit pins the download; branches can move).
    type: str
    default: main
  files:
    description: Repo-relative file names to fetch. Exactly one of I(files) and I(include).
    type: list
    elements: str
  include:
    description: Glob patterns over the repo's file list (e.g. C(*Q4_K_M-*-of-*.gguf) for a split set).
    type: list
    elements: str
  sha256:
    description: Expected sha256 per file name; files not listed must match the Hub's LFS sha256.
    type: dict
    default: {}
  dest:
    description: Directory the files go to (created when missing).
    type: path
    required: true
  token:
    description: Hugging Face token for gated or private repos; empty for none.
    type: str
  endpoint:
    description: Hub endpoint (a mirror); default C($HF_ENDPOINT) or C(https://huggingface.co).
    type: str
  model:
    description: A label copied into every returned file entry as C(model) (the role passes the model name).
    type: str
  only:
    description: Download only these of the selected files (the others are still resolved and reported).
    type: list
    elements: str
  resolve_only:
    description: Resolve and check the local files, download nothing.
    type: bool
    default: false
  verify:
    description: C(quick) trusts a sidecar whose size and mtime match; C(full) re-hashes every file.
    type: str
    choices: [quick, full]
    default: quick
  rate_limit_kib:
    description:
      - Average download rate limit per file in KiB/s, 0 for none (the client writes in 10 MiB chunks, so the
        rate is kept on average, not per second). Useful not to saturate a shared link.
    type: int
    default: 0
  xet:
    description: Let huggingface_hub use Xet storage where the Hub offers it (needs hf_xet).
    type: bool
    default: true
  free_space_margin_mb:
    description: Free space to leave on the filesystem on top of what the download needs.
    type: int
    default: 1024
  owner:
    description: Owner of the files, sidecars and created directories.
    type: str
  group:
    description: Group of the files, sidecars and created directories.
    type: str
  mode:
    description: Mode of the files and sidecars (octal string).
    type: str
    default: "0640"
  dir_mode:
    description: Mode of created directories (octal string).
    type: str
    default: "0750"
attributes:
  check_mode:
    support: full
    description: Resolves and checks the files against the Hub's metadata and reports C(would_download) for the
      ones it would fetch; downloads, moves and writes nothing.
  diff_mode:
    support: none
    description: Files are binary model weights; there is nothing to diff.
notes:
  - Fails with a message that says which of these it is, and what to do - 401 gated without token, 403 gated with
    a token not authorized, 401 invalid token, 404 repository, 404 revision, 404 file, not enough disk space,
    sha256 mismatch (the download is deleted, an installed file is left untouched), interrupted transfer.
requirements:
  - huggingface_hub 2.5 (2.5.0 is the version tested, the one the model_fetch role installs; Python 3.10+)
    on the Python that runs the module; hf_xet is optional
"""

EXAMPLES = r"""
- name: Fetch a pinned MTP GGUF
  llamafleet.mtp.hf_download:
    repo: unsloth/Qwen3.6-27B-GGUF
    revision: 0123456789abcdef0123456789abcdef01234567
    files: [Qwen3.6-27B-Q4_K_M.gguf]
    dest: /var/lib/llama-models/qwen36-27b
    token: "{{ hf_token }}"
    owner: root
    group: llama
  vars:
    ansible_python_interpreter: /opt/llamafleet/hf-venv/bin/python

- name: All parts of a split GGUF
  llamafleet.mtp.hf_download:
    repo: unsloth/Qwen3.6-27B-GGUF
    include: ["Q8_0/*-of-*.gguf"]
    dest: /var/lib/llama-models/qwen36-27b-q8
  vars:
    ansible_python_interpreter: /opt/llamafleet/hf-venv/bin/python
"""

RETURN = r"""
commit:
  description: Commit sha the revision resolved to.
  returned: success
  type: str
revision:
  description: The revision asked for.
  returned: success
  type: str
pinned:
  description: Whether the revision is a commit sha.
  returned: success
  type: bool
files:
  description:
    - One entry per selected file - C(name), C(path), C(size), C(sha256) (expected and verified),
      C(sha256_origin) (C(pinned) or C(hub)), C(model) (the I(model) label), C(status) (C(ok), C(downloaded),
      C(missing) with resolve_only, C(would_download) in check mode), C(downloaded_bytes), C(resumed_from)
      (bytes kept from a partial file); for a downloaded file C(transfer) (C(xet) or C(http)) and, when an Xet
      transfer failed and the file came over plain HTTP instead, C(xet_error).
  returned: success
  type: list
  elements: dict
downloaded_bytes:
  description: Bytes fetched from upstream by this run.
  returned: success
  type: int
hub_contacted:
  description: Whether the Hub was asked anything (false when a pinned commit's manifest and sidecars sufficed).
  returned: success
  type: bool
client_version:
  description: huggingface_hub version used.
  returned: success
  type: str
"""

from ansible_collections.llamafleet.mtp.plugins.module_utils.hf_fetch import (
    HubError,
    client_version,
    fetch,
    setup_environment,
)
from ansible_collections.llamafleet.mtp.plugins.module_utils.model_files import VerifyError
from ansible_collections.llamafleet.mtp.plugins.module_utils.secret_module import AnsibleModule


def _octal(module: AnsibleModule, key: str) -> int:
    value = module.params[key]
    try:
        return int(str(value), 8)
    except ValueError:
        module.fail_json(msg=f"{key} must be an octal mode like '0640', got {value!r}")


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "repo": {"type": "str", "required": True},
            "revision": {"type": "str", "default": "main"},
            "files": {"type": "list", "elements": "str"},
            "include": {"type": "list", "elements": "str"},
            "sha256": {"type": "dict", "default": {}},
            "dest": {"type": "path", "required": True},
            "token": {"type": "str", "no_log": True},
            "endpoint": {"type": "str"},
            "model": {"type": "str"},
            "only": {"type": "list", "elements": "str"},
            "resolve_only": {"type": "bool", "default": False},
            "verify": {"type": "str", "choices": ["quick", "full"], "default": "quick"},
            "rate_limit_kib": {"type": "int", "default": 0},
            "xet": {"type": "bool", "default": True},
            "free_space_margin_mb": {"type": "int", "default": 1024},
            "owner": {"type": "str"},
            "group": {"type": "str"},
            "mode": {"type": "str", "default": "0640"},
            "dir_mode": {"type": "str", "default": "0750"},
        },
        required_one_of=[["files", "include"]],
        mutually_exclusive=[["files", "include"]],
        supports_check_mode=True,
    )
    p = module.params
    setup_environment(p["endpoint"], p["xet"])
    try:
        version = client_version()
    except ImportError:
        module.fail_json(
            msg="huggingface_hub is not importable by this Python; run the module with the interpreter of the "
            "virtual environment that has it (the model_fetch role manages one)"
        )
    try:
        result = fetch(
            repo=p["repo"],
            revision=p["revision"],
            dest=p["dest"],
            files=p["files"],
            include=p["include"],
            sha256={k: str(v).lower() for k, v in (p["sha256"] or {}).items()},
            token=p["token"] or None,
            endpoint=(p["endpoint"] or "").rstrip("/") or None,
            only=p["only"],
            resolve_only=p["resolve_only"],
            check_mode=module.check_mode,
            full_verify=p["verify"] == "full",
            rate_limit=max(p["rate_limit_kib"], 0) * 1024,
            margin_bytes=max(p["free_space_margin_mb"], 0) * 1024 * 1024,
            owner=p["owner"],
            group=p["group"],
            mode=_octal(module, "mode"),
            dir_mode=_octal(module, "dir_mode"),
        )
    except HubError as e:
        module.fail_json(msg=str(e), kind=e.kind, status=e.status, changed=False)
    except VerifyError as e:
        module.fail_json(msg=str(e), kind="verify", changed=False)
    except OSError as e:
        module.fail_json(msg=f"{p['repo']} -> {p['dest']}: {e}", kind="os", changed=False)
    for f in result["files"]:
        f["model"] = p["model"]
    result["client_version"] = version
    module.exit_json(**result)


if __name__ == "__main__":
    main()
