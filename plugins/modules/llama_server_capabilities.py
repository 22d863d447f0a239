#!/usr/bin/python
"""Ansible module llamafleet.mtp.llama_server_capabilities: what a built llama-server binary supports."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llama_server_capabilities
short_description: Probe a built llama-server binary for its version, MTP spelling and flags
version_added: "0.1.0"
description:
  - Runs C(llama-server --version), C(llama-server --help) and C(llama-server --list-devices) (none
    of them needs a model; each exits at once) and returns what the binary supports, so later
    tasks render only flags this build knows.
  - The MTP speculative type is C(draft-mtp) on mainline llama.cpp and C(mtp) on the PR 22673
    branch; C(mtp_spec_type) says which one this binary accepts, or null.
  - With O(confirm=true) the result is proven by the binary, not only by its help text;
    C(llama-server --spec-type <spelling> -h) must exit 0 for the spelling found and exit 1 with
    C(unknown speculative type) for the other one.
  - Read-only; never reports a change. In check mode it runs normally.
  - Fails, quoting the first lines the binary printed, when it is missing or not executable, when
    a probe exits non-zero or runs past O(timeout), or when its output is not recognisable.
author:
  - llamafleet maintainers (!UNKNOWN)
options:
  binary:
    description:
      - Path of the llama-server executable (for example the C(bin/llama-server) of a build).
    type: path
    required: true
  confirm:
    description:
      - Also run the cheap confirmation probe C(--spec-type <spelling> -h) for each MTP spelling.
    type: bool
    default: true
  timeout:
    description:
      - Seconds each probe may run before it is killed (via coreutils C(timeout) when present).
    type: int
    default: 60
extends_documentation_fragment:
  - llamafleet.mtp.attributes.read_only
notes:
  - The probes run with C(LC_ALL=C) and without any C(LLAMA_ARG_*) variables of the environment
    (llama-server reads those as arguments).
"""

EXAMPLES = r"""
- name: What can this build do?
  llamafleet.mtp.llama_server_capabilities:
    binary: /opt/llama.cpp/builds/0d91d73bb065-cuda/bin/llama-server
  register: llama

- name: Render the MTP flag this build understands
  ansible.builtin.set_fact:
    llama_spec_args: "--spec-type {{ llama.capabilities.mtp_spec_type }}"
  when: llama.capabilities.mtp_supported

- name: Only pass --no-webui to builds that know it
  ansible.builtin.set_fact:
    llama_ui_args: "{{ ['--no-webui'] if '--no-webui' in llama.capabilities.flags else [] }}"
"""

RETURN = r"""
capabilities:
  description: What the binary reports about itself.
  returned: success
  type: dict
  contains:
    binary:
      description: The path probed.
      type: str
    version:
      description: llama.cpp version (C(version:) of C(--version)); null for old builds that print only a build number.
      type: str
      sample: 0.5.0-dev
    build_number:
      description: Build number (C(git rev-list --count) at build time, or C(-DLLAMA_BUILD_NUMBER)).
      type: int
      sample: 1
    commit:
      description: Short commit sha the binary was built from.
      type: str
      sample: 0d91d73bb
    build_info:
      description: C(b<build_number>-<commit>), the form /props reports as C(build_info).
      type: str
      sample: b1-0d91d73bb
    built_with:
      description: The C(built with ...) line without its prefix; C(compiler) and C(target) split it at
        the last C( for ).
      type: str
      sample: GNU 12.2.0 for Linux x86_64
    compiler:
      description: Compiler id and version.
      type: str
      sample: GNU 12.2.0
    target:
      description: Build target (system and CPU).
      type: str
      sample: Linux x86_64
    spec_types:
      description: Values C(--spec-type) accepts, in help order; empty when the build has no C(--spec-type).
      type: list
      elements: str
      sample: [none, draft-simple, draft-eagle3, draft-mtp, ngram-cache]
    mtp_spec_type:
      description: The C(--spec-type) spelling of MTP this binary accepts, C(draft-mtp) or C(mtp); null without MTP.
      type: str
      sample: draft-mtp
    mtp_supported:
      description: Whether the binary supports MTP speculative decoding.
      type: bool
    spec_flags:
      description: For each of C(--spec-draft-n-max), C(--spec-draft-n-min), C(--spec-draft-p-min),
        C(--spec-draft-type-k) and C(-ctkd), whether the help lists that exact spelling.
      type: dict
      sample: {"--spec-draft-n-max": true, "--spec-draft-n-min": true, "--spec-draft-p-min": true,
               "--spec-draft-type-k": true, "-ctkd": true}
    split_modes:
      description: Values of C(-sm, --split-mode {...}).
      type: list
      elements: str
      sample: [none, layer, row, tensor]
    fit:
      description: For each of C(--fit) (C(-fit)), C(--fit-target) (C(-fitt)) and C(--fit-ctx) (C(-fitc)),
        whether it exists.
      type: dict
      sample: {"--fit": true, "--fit-target": true, "--fit-ctx": true}
    cache_types:
      description: KV cache types C(-ctk) allows (its C(allowed values:) help line).
      type: list
      elements: str
      sample: [f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1]
    flags:
      description: Every long (C(--)) option name the help lists, sorted; options whose help says
        C(the argument has been removed) are left out (see C(removed_flags)).
      type: list
      elements: str
      sample: [--api-key-file, --kv-unified, --metrics, --no-webui]
    short_flags:
      description: Every single-dash option name the help lists, sorted (C(-ctk), C(-no-kvu), ...).
      type: list
      elements: str
    removed_flags:
      description: Option names the help still lists but that only fail with C(the argument has been removed).
      type: list
      elements: str
      sample: [--draft, --draft-max, --draft-min]
    devices:
      description: Non-CPU devices from C(--list-devices) (name, description, memory_total_mib, memory_free_mib).
      type: list
      elements: dict
      sample: [{"name": CUDA0, "description": NVIDIA H200, "memory_total_mib": 143167, "memory_free_mib": 142600}]
    has_cuda:
      description: Whether the binary has the CUDA backend (C(ggml_cuda_init) logs or C(CUDA<n>) devices);
        false for CPU builds.
      type: bool
    confirmed:
      description: Whether the MTP spelling was also proven with C(--spec-type <spelling> -h) (O(confirm)).
      type: bool
output:
  description: What the failing probe printed (stderr then stdout).
  returned: failed
  type: str
"""

import os
import shlex

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llamafleet.mtp.plugins.module_utils.llama_caps import LlamaCapsError, probe


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "binary": {"type": "path", "required": True},
            "confirm": {"type": "bool", "default": True},
            "timeout": {"type": "int", "default": 60},
        },
        supports_check_mode=True,
    )
    binary = module.params["binary"]
    timeout = module.params["timeout"]
    if not os.path.exists(binary):
        module.fail_json(msg=f"binary={binary} does not exist; build llama-server first or give the path of its bin/")
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        module.fail_json(msg=f"binary={binary} is not an executable file; give the path of a built llama-server")
    if timeout < 1:
        module.fail_json(msg=f"timeout={timeout} must be at least 1 second")

    # llama-server reads LLAMA_ARG_* variables as arguments: keep the host's out of the probes
    for key in [k for k in os.environ if k.startswith("LLAMA_ARG_")]:
        del os.environ[key]
    prefix = []
    timeout_bin = module.get_bin_path("timeout")
    if timeout_bin:
        prefix = [timeout_bin, "--kill-after=5", str(timeout)]

    def run(argv: list[str]) -> tuple[int, str, str]:
        rc, out, err = module.run_command(prefix + argv, environ_update={"LC_ALL": "C"})
        if prefix and rc in (124, 137):
            raise LlamaCapsError(f"'{shlex.join(argv)}' ran longer than timeout={timeout}s and was killed", err + out)
        return rc, out, err

    try:
        caps = probe(run, binary, confirm=module.params["confirm"])
    except LlamaCapsError as e:
        module.fail_json(msg=str(e), output=e.output)
    module.exit_json(changed=False, capabilities=caps)


if __name__ == "__main__":
    main()
