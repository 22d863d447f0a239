#!/usr/bin/python
# Copyright: llamafleet maintainers
# MIT License (see galaxy.yml)
"""Module llama_bench: measure a running llama-server's decode speed and draft acceptance."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llama_bench
short_description: Measure tokens/s and MTP draft acceptance of a running llama-server
version_added: "0.1.0"
author:
  - llamafleet maintainers (!UNKNOWN)
description:
  - Sends the same prompts to a running llama-server's C(/completion) endpoint O(runs) times and
    reports the median decode speed from the answers' C(timings.predicted_per_second).
  - Reads C(/metrics) (the server needs C(--metrics)) before and after, and reports draft
    acceptance as accepted / drafted tokens from the C(spec_decode_*) counters (falling back to the
    answers' C(draft_n) / C(draft_n_accepted)).
  - Read-only as far as the host goes (it only sends requests); it runs in check mode too.
options:
  url:
    description: Base URL of the server, e.g. C(http://127.0.0.1:8080).
    type: str
    required: true
  api_key:
    description: "API key, sent as C(Authorization: Bearer <key>)."
    type: str
  prompts:
    description: Prompts to complete; each run sends all of them.
    type: list
    elements: str
    default: ["Write a short story about a lighthouse keeper who finds a message in a bottle."]
  n_predict:
    description: Tokens to generate per request.
    type: int
    default: 128
  runs:
    description: How many times to send the prompts (median over all requests).
    type: int
    default: 3
  warmup:
    description: Requests sent first and not counted.
    type: int
    default: 1
  label:
    description: Name of this configuration in the result (e.g. C(no-mtp), C(mtp-n3)).
    type: str
    required: true
  draft_n_max:
    description: The draft length the server runs with, for the record; null when MTP is off.
    type: int
  spec_draft_p_min:
    description: The C(--spec-draft-p-min) the server runs with, for the record; null - llama.cpp's default.
    type: float
  concurrency:
    description:
      - Closed-loop clients sending at once. Each of the O(runs) rounds has every client send each prompt once (after
        the warm-up); the row's C(served_tok_s) is the tokens all of them got per second of wall time, the median over
        the rounds, and above 1 it is the row's C(tok_s), the figure C(llamafleet.mtp.llama_bench_compare) compares.
      - Set it to the instance's slots (C(parallel)) to measure at the load the instance is declared for.
    type: int
    default: 1
  request:
    description: Extra /completion request fields (sampling), merged into every request.
    type: dict
    default: {temperature: 0.0, seed: 42, cache_prompt: false}
  timeout:
    description: Seconds to wait for one answer.
    type: int
    default: 600
attributes:
  check_mode:
    support: full
    description: Sends requests only; the same in check mode.
  diff_mode:
    support: none
    description: Changes nothing on the host; there is nothing to diff.
"""

EXAMPLES = r"""
- name: Measure the instance as it runs now
  llamafleet.mtp.llama_bench:
    url: http://127.0.0.1:8080
    label: mtp-n3
    draft_n_max: 3
    runs: 3
  register: row
"""

RETURN = r"""
row:
  description: The measurement.
  type: dict
  returned: success
  contains:
    label:
      description: The configuration name.
      type: str
    mtp:
      description: Whether MTP was on (draft_n_max given).
      type: bool
    draft_n_max:
      description: Draft length, or null.
      type: int
    spec_draft_p_min:
      description: The p-min it ran with, or null (llama.cpp's default; also null without MTP).
      type: float
    concurrency:
      description: Clients that sent at once.
      type: int
    tok_s:
      description: >-
        The figure compared - the median decode tokens/s of one stream, or at a concurrency above 1 the served
        tokens/s.
      type: float
    served_tok_s:
      description: Median over the rounds of the tokens all clients got per second of wall time.
      type: float
    served_tok_s_samples:
      description: Each round's served tokens/s.
      type: list
      elements: float
    runs:
      description: Counted requests.
      type: int
    tokens:
      description: Tokens generated in counted requests.
      type: int
    tok_s_median:
      description: Median decode tokens/s.
      type: float
    tok_s_min:
      description: Slowest request's tokens/s.
      type: float
    tok_s_max:
      description: Fastest request's tokens/s.
      type: float
    tok_s_samples:
      description: Every counted request's tokens/s (the speed gate ranks them).
      type: list
      elements: float
    draft_tokens:
      description: Drafted tokens (from the timings).
      type: int
    draft_accepted:
      description: Accepted draft tokens (from the timings).
      type: int
    acceptance:
      description: Accepted / drafted, or null without drafts.
      type: float
    acceptance_source:
      description: C(metrics) or C(timings).
      type: str
"""

import json
import time
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.urls import fetch_url
from ansible_collections.llamafleet.mtp.plugins.module_utils.llama_bench import (
    BenchError,
    completion_sample,
    metrics_delta,
    summarize,
)
from ansible_collections.llamafleet.mtp.plugins.module_utils.metrics_text import parse_metrics
from ansible_collections.llamafleet.mtp.plugins.module_utils.secret_module import AnsibleModule


def _get(module, url, headers, timeout):
    resp, info = fetch_url(module, url, headers=headers, timeout=timeout)
    body = resp.read().decode() if resp else info.get("body", b"")
    return info["status"], body if isinstance(body, str) else body.decode(errors="replace")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            api_key=dict(type="str", no_log=True),
            prompts=dict(
                type="list",
                elements="str",
                default=["Write a short story about a lighthouse keeper who finds a message in a bottle."],
            ),
            n_predict=dict(type="int", default=128),
            runs=dict(type="int", default=3),
            warmup=dict(type="int", default=1),
            label=dict(type="str", required=True),
            draft_n_max=dict(type="int"),
            spec_draft_p_min=dict(type="float"),
            concurrency=dict(type="int", default=1),
            request=dict(type="dict", default={"temperature": 0.0, "seed": 42, "cache_prompt": False}),
            timeout=dict(type="int", default=600),
        ),
        supports_check_mode=True,
    )
    p = module.params
    base = p["url"].rstrip("/")
    headers = {"Content-Type": "application/json"}
    if p["api_key"]:
        headers["Authorization"] = "Bearer " + p["api_key"]

    if p["concurrency"] < 1:
        module.fail_json(msg=f"concurrency must be at least 1, got {p['concurrency']}")

    def complete(prompt):
        body = dict(p["request"], prompt=prompt, n_predict=p["n_predict"])
        resp, info = fetch_url(
            module, base + "/completion", data=json.dumps(body), headers=headers, method="POST", timeout=p["timeout"]
        )
        if info["status"] != 200:
            # raised, not fail_json: a client thread must not exit the module
            raise BenchError(f"POST {base}/completion answered {info['status']}: {info.get('body') or info.get('msg')}")
        return json.loads(resp.read())

    def client():  # one closed-loop client: each prompt once, in order
        return [completion_sample(complete(prompt)) for prompt in p["prompts"]]

    def metrics():
        status, text = _get(module, base + "/metrics", headers, 30)
        if status != 200:
            module.fail_json(msg=f"GET {base}/metrics answered {status}: start the server with --metrics")
        return parse_metrics(text)

    try:
        for _dummy in range(p["warmup"]):
            complete(p["prompts"][0])
        before = metrics()
        samples, rounds = [], []
        with ThreadPoolExecutor(max_workers=p["concurrency"]) as pool:
            for _dummy in range(p["runs"]):
                start = time.monotonic()
                got = [s for f in [pool.submit(client) for _c in range(p["concurrency"])] for s in f.result()]
                rounds.append((sum(s["tokens"] for s in got), time.monotonic() - start))
                samples += got
        after = metrics()
        row = summarize(
            p["label"],
            p["draft_n_max"],
            samples,
            metrics_delta(before, after),
            concurrency=p["concurrency"],
            rounds=rounds,
            spec_draft_p_min=p["spec_draft_p_min"],
        )
    except BenchError as e:
        module.fail_json(msg=str(e))
    module.exit_json(changed=False, row=row)


if __name__ == "__main__":
    main()
