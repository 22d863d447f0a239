#!/usr/bin/python
"""Documentation of the action plugin llamafleet.mtp.model_fetch_plan (plugins/action/model_fetch_plan.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_fetch_plan
short_description: Plan model_fetch - validate the model list, aggregate a fleet, plan deliveries, build the facts
version_added: "0.1.0"
description:
  - With I(models), checks every model item (name, source C(hf), C(url) or C(controller), repo, file or include,
    revision, sha256, url, controller_path, require_mtp, dir) and returns it normalised, with the directory it
    goes to, and warns about a branch instead of a commit. A bad item fails with a message naming the model,
    the key and the fix.
  - With I(models) and I(manifest), also returns this host's plan - the files delivered by copy or get_url
    (I(expect)), every known file (I(installed)) and the GGUF given to llama.cpp per model (I(heads)).
  - With I(models), I(verified), I(ggufs) and I(heads), returns the C(model_fetch_facts) fact, and fails naming
    the file when a model that requires MTP has no MTP (nextn) layers.
  - With I(hosts) (host name to that host's normalised models), returns the distinct models of the fleet with
    the hosts using each; one name must mean one model on every host.
  - With I(fleet_models) and I(needed) (the hosts' missing files), returns what the controller must fetch
    upstream, each file once.
  - Pure computation on the controller (an action plugin, no round trip to the host); never changes anything.
    Its options are validated with the same argument spec a module would use
    (C(PLAN_ARGUMENT_SPEC) in plugins/module_utils/model_fetch.py).
author:
  - llamafleet maintainers (!UNKNOWN)
options:
  models:
    description: Model items as given to the model_fetch role (C(model_fetch_models)).
    type: list
    elements: raw
  models_dir:
    description: Parent directory; each model goes to C(<models_dir>/<name>/) unless it sets C(dir).
    type: path
    default: /var/lib/llama-models
  require_mtp:
    description: Default of each model's C(require_mtp).
    type: bool
    default: true
  warn:
    description: Emit the warnings about unpinned revisions.
    type: bool
    default: true
  hosts:
    description: Host name to normalised models (the I(models) output of each host) to aggregate.
    type: dict
  manifest:
    description:
      - Files resolved so far, each C(model), C(name), C(sha256), C(size), C(path) (where the file is - the
        controller cache or the controller path for files to copy, the host path for files the host fetched).
        When given (even empty) with I(models), the host's plan is returned.
    type: list
    elements: dict
  cache_dir:
    description: Controller cache directory (fleet mode - url models are copied from C(<cache_dir>/<name>/)).
    type: path
    default: /tmp
  fleet:
    description: Whether hf and url models are fetched once on the controller and copied to the hosts.
    type: bool
    default: false
  fleet_models:
    description: The models the controller handles (entries of I(fleet)).
    type: list
    elements: dict
  needed:
    description: The hosts' missing files (C(missing) of llamafleet.mtp.model_verify), for I(fleet_models).
    type: list
    elements: dict
  verified:
    description: The installed files as llamafleet.mtp.model_verify reports them (C(files)), to build the facts.
    type: list
    elements: dict
  heads:
    description: Model name to the GGUF path llama.cpp is given (the I(heads) of the plan).
    type: dict
  ggufs:
    description: Model name to its llamafleet.mtp.gguf_info result (C(gguf)).
    type: dict
  commits:
    description: Model name to the commit its files were fetched at (hf models).
    type: dict
    default: {}
  fanout_missing:
    description:
      - Plan a fan-out (C(model_fetch_delivery=fanout)) - host of the batch to its llamafleet.mtp.model_verify
        C(missing). Returns C(fanout) - C(seed) (host -> the files the controller sends it), C(rounds) (per round,
        receiver -> its file with C(sources), the hosts to ask in order), C(exports) (host -> the model
        directories it serves), C(connections) (host -> peers its share admits at once), C(pieces) and
        C(seed_pieces) (a file nobody holds that at least O(fanout_pieces_min) hosts need - its pieces and the
        host the controller sends each to; its round gives every receiver the C(pieces) to gather), C(copies)
        and C(lines) (the plan in words, as check mode prints it).
    type: dict
  fanout_files:
    description: Host to its llamafleet.mtp.model_verify C(files) (status ok = it holds that file).
    type: dict
    default: {}
  fanout_facts:
    description: Other hosts of the fleet to their published C(model_fetch_facts) (they hold what those list).
    type: dict
    default: {}
  fanout_concurrency:
    description: Transfers a host serves at once.
    type: int
    default: 1
  fanout_pieces_min:
    description:
      - A file nobody holds that at least this many hosts of the batch need goes out in pieces - one per
        receiver from the controller, then each receiver gathers the others' pieces at once; 0 never (whole
        files in doubling rounds).
    type: int
    default: 0
extends_documentation_fragment:
  - llamafleet.mtp.attributes.controller_action
"""

EXAMPLES = r"""
- name: Normalise this host's models
  llamafleet.mtp.model_fetch_plan:
    models: "{{ model_fetch_models }}"
    models_dir: /var/lib/llama-models
  register: plan

- name: Distinct models of the play
  llamafleet.mtp.model_fetch_plan:
    hosts: "{{ dict(ansible_play_hosts | zip(ansible_play_hosts | map('extract', hostvars, ['plan', 'models']))) }}"
  run_once: true
  delegate_to: localhost
"""

RETURN = r"""
models:
  description:
    - Normalised models - C(name), C(source), C(dir), C(require_mtp), C(repo), C(revision), C(pinned) (revision
      is a commit sha), C(files) (names, null for include), C(include), C(sha256) (file name to sha256),
      C(urls) (C(name), C(url)), C(controller_paths) (C(name), C(path)).
  returned: when models is given
  type: list
  elements: dict
fleet:
  description: Distinct models with C(hosts) (the hosts that use each), sorted by name.
  returned: when hosts is given
  type: list
  elements: dict
expect:
  description:
    - Files the role delivers to this host by copy or get_url - C(model), C(name), C(path), C(sha256), C(size),
      C(via) (C(copy) or C(get_url)), C(src) (controller path or URL).
  returned: when manifest is given
  type: list
  elements: dict
installed:
  description: Every known file of this host's models - C(model), C(name), C(path).
  returned: when manifest is given
  type: list
  elements: dict
heads:
  description: Model name to the GGUF path llama.cpp is given (the first part of a split set), null if not known yet.
  returned: when manifest is given
  type: dict
controller_work:
  description:
    - C(hf) - the hf models with files some host misses, each with C(only) (those file names); C(url) - one
      entry per missing URL file (C(model), C(name), C(path) in the controller cache, C(sha256), C(src) the URL).
  returned: when fleet_models is given
  type: dict
facts:
  description:
    - Model name to C(path), C(paths), C(sha256), C(size_bytes), C(revision), C(repo), C(source), C(require_mtp),
      C(gguf), C(files) (see docs/facts.md, C(model_fetch_facts)).
  returned: when verified is given
  type: dict
fanout:
  description:
    - The fan-out plan (see O(fanout_missing)) - C(items), C(seed), C(rounds), C(exports), C(controller),
      C(copies) (C(controller) and C(peer) copies), C(lines).
  returned: when fanout_missing is given
  type: dict
"""
