"""What the fleet's Prometheus scrapes and what it compares against (role llama_monitoring).

Pure logic, no Ansible imports. ``scrape_plan`` turns the instances the llama hosts published in this run
(``llama_server_systemd_facts``), their declared API keys and speed-gate figures (``llamafleet_speed``) into one
scrape target per instance and the baselines the alert rules compare with. A host that published nothing in this
run (unreachable, or left out) keeps the targets the last run recorded for it, so a host that is down stays a
target that is down (and alerts) instead of vanishing from the monitor.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


class MonitoringError(ValueError):
    """Inputs that cannot be monitored; ``problems`` lists every one."""

    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


def key_file_name(host: str, instance: str) -> str:
    """The credentials file of one instance's API key (a file name: unsafe characters become '_')."""
    return _UNSAFE.sub("_", f"{host}__{instance}")


def _number(value):
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def scrape_plan(
    hosts,
    published,
    declared=None,
    speed=None,
    previous=None,
    keys_dir="/etc/prometheus/llamafleet/keys",
    gateway_hosts=None,
    gateways=None,
):
    """The scrape targets of the fleet's monitor: ``{targets, gateways, key_files, kept, missing}``.

    ``hosts``: the llama hosts to scrape, in order. ``published``: host -> its ``llama_server_systemd_facts`` this
    run (None: it published nothing). ``declared``: host -> its resolved instances (``llamafleet_declared.instances``:
    the API keys, by ``config_name``). ``speed``: host -> its ``llamafleet_speed`` (the speed gate's figures, the
    baselines). ``previous``: what the last run recorded (the role's state file, ``{targets, gateways}``).
    ``gateway_hosts``: the gateways to scrape; ``gateways``: host -> its ``llama_gateway_facts`` this run (their
    ``metrics_target``); a gateway without them keeps last run's entry.

    Each target: ``{job, host, instance, address, labels, key_file, baseline_tok_s, baseline_acceptance,
    draft_n_max}`` (``key_file``: the instance's API key as a credentials file, or None). ``key_files``: key_file ->
    key, for the instances with a key in this run (secrets: never log it). ``kept``: hosts whose targets come from the
    previous run; ``missing``: hosts with neither (nothing to scrape yet).
    """
    problems, targets, keys, kept, missing = [], [], {}, [], []
    previous = previous if isinstance(previous, dict) else {}
    before = {}
    for t in previous.get("targets") or []:
        if isinstance(t, dict) and t.get("host"):
            before.setdefault(t["host"], []).append(t)
    for host in hosts or []:
        facts = (published or {}).get(host)
        if not isinstance(facts, dict) or not isinstance(facts.get("instances"), list):
            if before.get(host):
                targets += before[host]
                kept.append(host)
            else:
                missing.append(host)
            continue
        by_name = {
            i.get("name"): i for i in ((declared or {}).get(host) or []) if isinstance(i, dict) and i.get("name")
        }
        figures = (((speed or {}).get(host) or {}).get("instances")) or {}
        for inst in facts["instances"]:
            name = inst.get("name")
            address = urlsplit(inst.get("url") or "").netloc
            if not name or not address:
                problems.append(f"host {host}, instance {name!r}: its published facts have no url to scrape")
                continue
            if not inst.get("args") or "--metrics" not in inst["args"]:
                continue  # metrics: false - nothing to scrape (the instance is checked by the gateway and status)
            config = by_name.get(inst.get("config_name") or name) or {}
            key = config.get("api_key") or None
            if inst.get("api_key") and not key:
                problems.append(
                    f"host {host}, instance {name!r}, field 'api_key': the instance has a key but its declared state "
                    "has none in this run; Prometheus cannot scrape it"
                )
                continue
            key_file = f"{keys_dir}/{key_file_name(host, name)}" if key else None
            if key:
                keys[key_file] = key
            targets.append(_target(host, inst, address, key_file, figures.get(name) or {}))
    if problems:
        raise MonitoringError(problems)
    out_gateways = _gateways(gateway_hosts, gateways, previous.get("gateways"))
    return {"targets": targets, "gateways": out_gateways, "key_files": keys, "kept": kept, "missing": missing}


def _target(host, inst, address, key_file, fig):
    """One instance's scrape target (its labels, its key file, the speed gate's figures as baselines)."""
    name = inst["name"]
    return {
        "job": f"llama/{host}/{name}",
        "host": host,
        "instance": name,
        "address": address,
        "labels": {
            "host": host,
            "llama_instance": name,
            "llama_model": inst.get("model") or (inst.get("model_path") or "").rsplit("/", 1)[-1],
            "llama_mtp": (inst.get("spec_type") or "on") if inst.get("mtp") else "off",
            "llama_slots": str(inst.get("parallel") or 1),
        },
        "key_file": key_file,
        "baseline_tok_s": _number(fig.get("tok_s")),
        "baseline_acceptance": _number(fig.get("acceptance")),
        "draft_n_max": inst.get("draft_n_max") if inst.get("mtp") else None,
    }


def host_states(hosts, read, outcomes, previous=None):
    """Whether each llama host is as declared at the end of this run: ``{host: {as_declared, reason}}``.

    ``read``: the hosts the facts stage read in this run (the others - unreachable, or outside ``--limit`` - keep
    what the last run recorded, from ``previous``, or have no entry). ``outcomes``: host -> ``converged`` (the
    converge recorded its applied state, or there was nothing to do) or ``failed`` (its converge failed; a serving
    host was rolled back). A host read but without an outcome had something to do and was not converged: the
    rollout stopped before it.
    """
    before = previous if isinstance(previous, dict) else {}
    read = set(read or [])
    out = {}
    for host in hosts or []:
        outcome = (outcomes or {}).get(host)
        if host not in read:
            if isinstance(before.get(host), dict):
                out[host] = before[host]
        elif outcome == "converged":
            out[host] = {"as_declared": 1, "reason": ""}
        elif outcome == "failed":
            out[host] = {"as_declared": 0, "reason": "its converge failed (a serving host was rolled back)"}
        else:
            out[host] = {"as_declared": 0, "reason": "not converged: the rollout stopped before this host"}
    return out


def _gateways(hosts, facts, previous):
    """``[{host, target}]``: each gateway's exporter from its ``llama_gateway_facts`` this run, else last run's."""
    before = {g.get("host"): g.get("target") for g in previous or [] if isinstance(g, dict)}
    out = []
    for host in hosts or []:
        target = ((facts or {}).get(host) or {}).get("metrics_target") or before.get(host)
        if target:
            out.append({"host": host, "target": target})
    return out
