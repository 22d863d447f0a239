#!/usr/bin/python
"""Documentation of the action plugin llamafleet.mtp.instance_plan (plugins/action/instance_plan.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: instance_plan
short_description: Plan every llama-server instance of a host and refuse what cannot run, before any restart
version_added: "0.2.0"
description:
  - Runs on the controller (no connection) from facts the earlier stages published - the resolved instances
    (C(llamafleet_declared.instances)), the models' GGUF headers (C(model_fetch_facts)), C(gpu_facts) and
    C(llama_host_state).
  - Calls the tensor_split planner (plugins/module_utils/tensor_plan.py) with each instance's settings as the
    instance resolver derives them, so the plan and the server's arguments always agree.
  - Refuses, listing every problem (host, instance, field) - a plan that does not fit the GPUs; on CPU hosts, host
    RAM (the instances' needs against C(MemAvailable) plus what their running processes hold); a context per slot
    above the model's training context unless the instance sets C(rope_scaling).
  - Instances that serve a C(model_path) are passed through unplanned.
author:
  - llamafleet maintainers (!UNKNOWN)
options:
  instances:
    description: Resolved instances (C(llamafleet_declared.instances)).
    type: list
    elements: dict
    required: true
  models:
    description: C(model_fetch_facts) - model name to its facts, with C(gguf) (the header).
    type: dict
    required: true
  gpu_facts:
    description: C(ansible_facts.gpu_facts).
    type: dict
    required: true
  host_state:
    description: C(ansible_facts.llama_host_state) (memory and running instances).
    type: dict
    default: {}
  declared_models:
    description:
      - The declared models (C(llamafleet_declared.models)). A model kept on the controller (C(source=controller))
        that is not on the host yet (check mode) is planned from its controller copy's header.
    type: list
    elements: dict
    default: []
extends_documentation_fragment:
  - llamafleet.mtp.attributes.controller_action
"""

EXAMPLES = r"""
- name: Plan every instance
  llamafleet.mtp.instance_plan:
    instances: "{{ llamafleet_declared.instances }}"
    models: "{{ model_fetch_facts }}"
    gpu_facts: "{{ ansible_facts.gpu_facts }}"
    host_state: "{{ ansible_facts.llama_host_state }}"
  register: planned
"""

RETURN = r"""
plan:
  description: Instance name -> its tensor_split plan (the tensor_split module's C(plan)); the C(llamafleet_plan) fact.
  returned: always
  type: dict
instances:
  description: The instances with the settings the plan decided (context, MTP) filled in, for the server role.
  returned: success
  type: list
  elements: dict
notes:
  description: Instances not planned, and why.
  returned: success
  type: list
  elements: str
problems:
  description: Every reason an instance cannot run as declared.
  returned: failure
  type: list
  elements: str
"""
