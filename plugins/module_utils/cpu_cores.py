# MIT License (see LICENSE)
"""A host's CPU cores, and their division between the llama-server instances that share them.

Why: llama-server takes every physical core it sees (``--threads`` defaults to the physical core count) and its
threads spin while they wait. Two instances on the same cores starve each other: on the sandbox, two busy
instances on two shared cores made 1,148 tokens/s together against 8,509 on one core each. So when several
instances run on one host, each gets its own whole physical cores (all their SMT siblings): systemd
``CPUAffinity=`` and ``--threads``/``--threads-batch`` equal to its core count. One instance alone keeps
llama.cpp's own choice (the benchmark's sweep found it the fastest).

``read_cpus`` runs on the managed host (``llama_host_state`` publishes its result as ``cpus``); ``divide`` is
pure and runs in the planner on the controller.
"""

from __future__ import annotations

import glob
import os
import re

_SYS_CPU = "/sys/devices/system/cpu"
_SYS_NODE = "/sys/devices/system/node"


def parse_cpu_list(text):
    """``"0-3,8,10-11"`` -> ``[0, 1, 2, 3, 8, 10, 11]`` (the kernel's and systemd's list syntax)."""
    out = []
    for part in (text or "").strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return sorted(set(out))


def format_cpu_list(cpus):
    """``[0, 1, 2, 3, 8]`` -> ``"0-3 8"`` (systemd's CPUAffinity= syntax: ranges, space separated)."""
    cpus = sorted(set(cpus))
    parts, start, prev = [], None, None
    for c in cpus:
        if start is None:
            start = prev = c
        elif c == prev + 1:
            prev = c
        else:
            parts.append(f"{start}-{prev}" if prev != start else str(start))
            start = prev = c
    if start is not None:
        parts.append(f"{start}-{prev}" if prev != start else str(start))
    return " ".join(parts)


def _read(path):
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except (OSError, ValueError):
        return None


def read_cpus(sys_cpu=_SYS_CPU, sys_node=_SYS_NODE, allowed=None):
    """The logical CPUs this host's processes may run on, each ``{cpu, core, package, node}``.

    ``allowed``: the CPU numbers to report (default: this process's affinity, which inside a container with a
    cpuset is that cpuset). ``core`` and ``package`` come from the CPU's topology (SMT siblings share both);
    ``node`` is its NUMA node (0 without NUMA information). None when the topology cannot be read.
    """
    if allowed is None:
        try:
            allowed = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            allowed = None
    if not allowed:
        return None
    node_of = {}
    for d in sorted(glob.glob(os.path.join(sys_node, "node[0-9]*"))):
        m = re.search(r"node(\d+)$", d)
        for c in parse_cpu_list(_read(os.path.join(d, "cpulist")) or ""):
            node_of[c] = int(m.group(1))
    out = []
    for c in sorted(allowed):
        topo = os.path.join(sys_cpu, f"cpu{c}", "topology")
        core, package = _read(os.path.join(topo, "core_id")), _read(os.path.join(topo, "physical_package_id"))
        out.append(
            {
                "cpu": c,
                "core": int(core) if core and core.lstrip("-").isdigit() else c,
                "package": int(package) if package and package.lstrip("-").isdigit() else 0,
                "node": node_of.get(c, 0),
            }
        )
    return out


def cores_online(sys_cpu=_SYS_CPU):
    """How many physical cores the machine has online (llama.cpp counts these, whatever the affinity)."""
    online = parse_cpu_list(_read(os.path.join(sys_cpu, "online")) or "")
    if not online:
        return None
    cpus = read_cpus(sys_cpu, os.path.join(os.path.dirname(sys_cpu), "node"), allowed=online)
    return len(physical_cores(cpus))


def physical_cores(cpus):
    """``[{key, node, cpus}]``: the whole physical cores among ``cpus``, in (node, package, core) order."""
    cores = {}
    for c in cpus or []:
        key = (int(c.get("package") or 0), int(c["core"]))
        entry = cores.setdefault(key, {"key": key, "node": int(c.get("node") or 0), "cpus": []})
        entry["cpus"].append(int(c["cpu"]))
    return sorted(cores.values(), key=lambda e: (e["node"], e["key"]))


def divide(cpus, demands, cores_online=None):
    """Disjoint whole-core sets for the instances (replicas) of one host.

    ``demands``: ``[{name, cores, node}]`` in order - ``cores``: the physical cores it needs (its pinned
    ``threads``), None for an equal share of what the pinned ones leave; ``node``: the NUMA node it should
    run near (its GPUs'), or None. ``cores_online``: the physical cores the machine has online (what
    llama.cpp counts for its default ``--threads``). Returns ``({name: {cpus, threads}}, problems)``; one
    demand alone keeps llama.cpp's own choice unless its host is confined to fewer cores than are online
    (then it gets those, with as many threads), and nothing is divided when the host has fewer whole cores
    than the demands need (``problems`` says so).
    """
    cores = physical_cores(cpus)
    total = len(cores)
    if len(demands) == 1 and cores_online and total < cores_online:
        # Confined (a container's cpuset, a systemd slice): llama.cpp counts the machine's cores, not these.
        return {demands[0]["name"]: {"cpus": sorted(c for core in cores for c in core["cpus"]), "threads": total}}, []
    if len(demands) < 2:
        return {}, []
    fixed = sum(d["cores"] for d in demands if d.get("cores"))
    flex = [d for d in demands if not d.get("cores")]
    need = fixed + len(flex)
    if need > total:
        parts = ", ".join(f"{d['name']} {d['cores'] or 1}" for d in demands)
        return {}, [
            f"the instances need {need} whole CPU cores ({parts}) and the host has {total} for them; "
            "lower threads, run fewer instances or replicas here, or set allow_oversubscribe: true on "
            "instances that may share cores"
        ]
    share, extra = divmod(total - fixed, len(flex)) if flex else (0, 0)
    want = {}
    for d in demands:
        if d.get("cores"):
            want[d["name"]] = d["cores"]
        else:
            want[d["name"]] = share + (1 if extra > 0 else 0)
            extra -= 1
    free = {}
    for core in cores:
        free.setdefault(core["node"], []).append(core)
    out = {}
    # Instances that should run near a node (GPU instances) choose first, then the rest; each takes its cores
    # from one node where it can (its own, else the one with the most free cores), spilling over in order.
    for d in sorted(demands, key=lambda d: d.get("node") is None):
        n, taken = want[d["name"]], []
        while len(taken) < n:
            nodes = [k for k in free if free[k]]
            pref = d.get("node")
            if pref in nodes:
                node = pref
            else:
                node = max(nodes, key=lambda k: (len(free[k]) >= n - len(taken), len(free[k]), -k))
            taken.append(free[node].pop(0))
        out[d["name"]] = {"cpus": sorted(c for core in taken for c in core["cpus"]), "threads": len(taken)}
    return out, []
