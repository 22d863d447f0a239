#!/usr/bin/python
"""Documentation of the action plugin llamafleet.mtp.fleet_declared (plugins/action/fleet_declared.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fleet_declared
short_description: Resolve and check what a host should run, from the inventory, before anything changes
version_added: "0.2.0"
description:
  - The one instance resolver (plugins/module_utils/fleet_instances.py) run on the controller, no connection to
    the host - the first step of site.yml, upgrade.yml and bench.yml.
  - Applies every instance field's default once, the benchmark's autotune result (C(draft_n_max) where the
    instance does not pin it) and model upgrades (instance -> model), and checks every field - types, choices,
    unknown fields (with a suggestion), unique names and ports, declared model names, C(tensor) split with MTP.
  - Refuses an undeclared downgrade - the host runs a newer build than the declared ref (a PR branch is older than
    every release tag C(bN); tags compare by number) - unless O(allow_downgrade).
  - Fails with one message that lists every problem, each naming the host, the instance and the field.
  - Returns the resolved state; a successful result is kept out of the output (the instances carry API keys).
    Register it (site.yml registers C(llamafleet_declared)).
author:
  - llamafleet maintainers (!UNKNOWN)
options:
  ref:
    description: The llama.cpp ref to run (C(llamacpp_mtp_build_ref), or C(llamafleet_upgrade_ref) in an upgrade).
    type: str
    default: b9180
  instances:
    description: The declared instances (C(llamafleet_instances)); fields as in the llama_server_systemd role.
    type: list
    elements: dict
    default: []
  models:
    description: The declared models (C(llamafleet_models)); instances must name one of them.
    type: list
    elements: dict
  autotune:
    description: Instance name -> best draft-n-max (C(llamafleet_autotune), written by C(bench.yml --tags autotune)).
    type: dict
    default: {}
  model_overrides:
    description: Instance name -> model name (C(llamafleet_release_models) combined with C(llamafleet_upgrade_models)).
    type: dict
    default: {}
  running_build:
    description: The installed build's info (C(llama_host_state.build)), for the downgrade check.
    type: dict
  allow_downgrade:
    description: Accept a declared ref older than the running build (C(llamafleet_allow_downgrade)).
    type: bool
    default: false
  applied:
    description:
      - What the host's last successful converge recorded (C(llama_host_state.applied)), with its drift. When its
        digest equals this run's and nothing drifted, RV(converged) is true and the fleet playbooks skip the converge
        for the host.
    type: dict
  full_converge:
    description: Treat the host as not converged whatever its record says (C(llamafleet_full_converge)).
    type: bool
    default: false
  inputs:
    description: More inputs of the declared state to fold into RV(digest).
    type: dict
    default: {}
extends_documentation_fragment:
  - llamafleet.mtp.attributes.controller_action
"""

EXAMPLES = r"""
- name: Resolve and check the declared state
  llamafleet.mtp.fleet_declared:
    ref: "{{ llamacpp_mtp_build_ref }}"
    instances: "{{ llamafleet_instances }}"
    models: "{{ llamafleet_models }}"
    autotune: "{{ llamafleet_autotune | default({}) }}"
    running_build: "{{ ansible_facts.llama_host_state.build }}"
  register: llamafleet_declared
"""

RETURN = r"""
ref:
  description: The llama.cpp ref to build and run.
  returned: success
  type: str
instances:
  description: The resolved instances (every field present, defaults applied, autotune and model upgrades applied).
  returned: success
  type: list
  elements: dict
models:
  description: The declared models.
  returned: success
  type: list
  elements: dict
digest:
  description: >-
    sha256 of what decides what the host runs - the resolved state above, every role variable the inventory sets
    (the options in the roles' C(meta/argument_specs.yml), templated), the collection's roles, plugins and playbooks,
    the GPUs (without their free and used memory) and the host's total memory.
  returned: success
  type: str
converged:
  description: The host's record has this RV(digest) and nothing drifted since.
  returned: success
  type: bool
drift:
  description: Why the host is not converged (empty when it is).
  returned: success
  type: list
  elements: str
problems:
  description: Every problem found, each naming the host, the instance and the field.
  returned: failure
  type: list
  elements: str
"""
