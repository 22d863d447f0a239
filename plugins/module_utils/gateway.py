"""The gateway's backend servers, derived from the instances the server role published.

Pure logic, no Ansible imports. Each llama host publishes ``llama_server_systemd_facts.instances`` (the
resolved and rendered instances: every replica, its port, its bind address, its URL); a gateway's servers
are those instances of the hosts it fronts, never declared a second time. ``server_name`` is the one place
the HAProxy server name of an instance is written (the gateway template and the drain both use it).
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


class GatewayError(Exception):
    """Bad gateway input; ``problems`` lists every one found."""

    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__("llama_gateway: nothing was changed:\n- " + "\n- ".join(self.problems))


def server_name(host, instance):
    """HAProxy server name of an instance: ``<inventory host>_<instance>`` ('/' and spaces are not allowed)."""
    return f"{host}_{instance}".replace("/", "_").replace(" ", "_")


def _loopback(addr):
    addr = (addr or "").strip("[]")
    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def servers(published, backend_hosts, gateway_host, instance_names=None, host_states=None, unreachable=None):
    """The servers of a gateway on ``gateway_host``: ``{servers, skipped}``.

    ``published``: host -> that host's ``llama_server_systemd_facts`` (or None when it has none this run).
    ``host_states``: host -> its ``llama_host_state`` as read at the start of the run ({}: not read). A host
    without published facts that did not serve before (a fresh host that failed, or that check mode could not
    deploy) is left out and listed in ``skipped``; one that served, or that this run did not read (``--limit``),
    is an error: dropping it would take a serving host out of the gateway. ``unreachable``: hosts this run could not
    reach (the facts stage left them out): they are left out too and listed in ``skipped`` (a host that cannot be
    reached serves no one through the gateway; the next run that reaches it puts it back).
    Returns a list of ``{name, host, instance, address, port, api_key, target, slots}`` (``target``: the
    instance's advertised ``host:port``, for Prometheus; ``slots``: its ``parallel``, the requests it decodes
    at once, None when the facts predate it), in host then instance order;
    raises GatewayError naming every host and instance that cannot be a backend.
    """
    wanted = set(instance_names or [])
    serving = {h: (st or {}).get("serving") for h, st in (host_states or {}).items()}
    out, problems, skipped = [], [], []
    if not backend_hosts:
        problems.append(f"host {gateway_host}: llama_gateway_backend_hosts is empty; nothing to route to")
    gone = set(unreachable or [])
    for host in backend_hosts:
        if host in gone:
            skipped.append(host)
            continue
        facts = published.get(host)
        if not isinstance(facts, dict) or not isinstance(facts.get("instances"), list):
            if serving.get(host) is False:
                skipped.append(host)
                continue
            problems.append(
                f"host {gateway_host}: backend host {host} has no llama_server_systemd_facts in this run "
                "(it served before: it failed, was left out by --limit, or the server stage was skipped); "
                "run site.yml on it with the server stage"
            )
            continue
        for inst in facts["instances"]:
            base = inst.get("config_name") or inst["name"]
            if wanted and base not in wanted and inst["name"] not in wanted:
                continue
            local = host == gateway_host
            url = inst.get("health_url") if local else inst.get("url")
            parts = urlsplit(url or "")
            address = parts.hostname or ""
            if not local and _loopback(address):
                problems.append(
                    f"host {host}, instance {inst['name']!r}, field 'host': bound to {inst.get('host')} (loopback), so "
                    f"the gateway on {gateway_host} cannot reach it; bind 0.0.0.0 or the host's address (with api_key)"
                )
                continue
            out.append(
                {
                    "name": server_name(host, inst["name"]),
                    "host": host,
                    "instance": inst["name"],
                    "address": f"[{address}]" if ":" in address else address,
                    "port": int(parts.port or inst["port"]),
                    "api_key": bool(inst.get("api_key")),
                    "target": urlsplit(inst.get("url") or "").netloc,
                    "slots": int(inst["parallel"]) if isinstance(inst.get("parallel"), int) else None,
                }
            )
    if wanted and not problems:
        found = {s["instance"] for s in out} | {
            i.get("config_name") for h in backend_hosts for i in (published.get(h) or {}).get("instances", [])
        }
        for name in sorted(wanted - found):
            problems.append(
                f"host {gateway_host}, field 'llama_gateway_instance_names': no instance {name!r} on the backend hosts"
            )
    if not problems and not out and not skipped:
        problems.append(f"host {gateway_host}: the backend hosts {', '.join(backend_hosts)} publish no instances")
    if problems:
        raise GatewayError(problems)
    return {"servers": out, "skipped": skipped}
