#!/usr/bin/python
"""Ansible module llamafleet.mtp.llama_host_state: what a host runs now (build, instances, memory)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llama_host_state
short_description: Read what a llama.cpp host runs now - installed build, llama-server instances, free memory
version_added: "0.2.0"
description:
  - One read-only round trip at the start of a converge, before anything changes. Reports the installed
    llama.cpp build (C(<install_root>/current/build-info.json) and where C(current) and C(previous) point),
    every C(llama-server@) instance configured under C(config_dir) (its systemd state, main PID and the memory its
    process holds), the host's C(MemAvailable), and whether python3-apt is importable (apt's check mode needs it).
  - The fleet playbooks use it to tell serving hosts (rolling converge) from fresh ones (parallel), to refuse an
    undeclared downgrade, and to check host RAM for CPU instances (C(MemAvailable) plus what the instance's
    running process already holds).
  - Sets the fact C(llama_host_state).
author:
  - llamafleet maintainers (!UNKNOWN)
options:
  applied_path:
    description:
      - The record the last successful converge wrote (P(llamafleet.mtp.llama_applied_state#module)). When it exists,
        the host is scanned again and every difference is reported in C(llama_host_state.applied.drift),
        with each recorded instance that is not active or does not answer C(/health) with 200.
    type: path
    default: /var/lib/llamafleet/applied.json
  health_timeout:
    description: Seconds to wait for each recorded instance's C(/health).
    type: float
    default: 3
  live:
    description:
      - Also read each instance the last converge recorded as it serves now - its C(/health) status and its
        C(/metrics) (with the API key of C(<config_dir>/<name>.key), read here on the host, so the key never
        leaves it) - into C(llama_host_state.instances[<name>].live). For C(playbooks/status.yml); the
        facts stage does not read it.
    type: bool
    default: false
  set_facts:
    description:
      - Set the facts. C(false) - return the state as RV(state) only (a re-read in the middle of a run, such as
        the rollback's, leaves what the run read at its start in place).
    type: bool
    default: true
  gpu_facts:
    description:
      - Also read the GPU topology, exactly as P(llamafleet.mtp.gpu_facts#module) does with these options, and set
        its fact C(gpu_facts) - so that the facts stage reads a host in one round trip. Read first, so that
        O(gpu_facts.required) fails before anything else is read. Not set - no GPU read.
    type: dict
    suboptions:
      nvidia_smi:
        description: Path of the nvidia-smi executable; looked up on E(PATH) when not set.
        type: path
      required:
        description: Fail when the host has no usable NVIDIA GPU (no nvidia-smi, or no devices).
        type: bool
        default: false
      require_healthy:
        description: What to do when nvidia-smi reports GPUs that are not healthy (as in
          P(llamafleet.mtp.gpu_facts#module)).
        type: str
        default: none
        choices: [none, any, all]
extends_documentation_fragment:
  - llamafleet.mtp.attributes.read_only
  - llamafleet.mtp.attributes.host_paths
"""

EXAMPLES = r"""
- name: Read what the host runs now
  llamafleet.mtp.llama_host_state:

- name: Read the host in one round trip - GPU topology (gpu_facts) and what it runs (llama_host_state)
  llamafleet.mtp.llama_host_state:
    gpu_facts:
      require_healthy: any

- name: Serving hosts roll, fresh hosts converge in parallel
  ansible.builtin.group_by:
    key: "llamafleet_{{ 'serving' if ansible_facts.llama_host_state.serving else 'fresh' }}"
"""

RETURN = r"""
state:
  description: What RV(ansible_facts.llama_host_state) holds, returned instead of set with O(set_facts=false).
  returned: with O(set_facts=false)
  type: dict
ansible_facts:
  description: The fact C(llama_host_state), and C(gpu_facts) with O(gpu_facts) (as
    P(llamafleet.mtp.gpu_facts#module) sets it).
  returned: unless O(set_facts=false)
  type: dict
  contains:
    llama_host_state:
      description: What the host runs now.
      type: dict
      contains:
        build:
          description: The installed build's info (name, ref, commit, key, ...), or null when none is installed.
          type: dict
        current:
          description: The build directory name C(current) points at, or null.
          type: str
        previous:
          description: The build directory name C(previous) points at, or null.
          type: str
        instances:
          description: >-
            Instance name to C(active_state), C(sub_state), C(main_pid), C(rss_bytes) (what its process holds now),
            C(n_restarts) and C(runs_env_file) (its process runs exactly the arguments of its environment file,
            with the binary its path names now; null when there is no process or it cannot be read); with O(live),
            C(live) - C({url, health, metrics, error}) - the C(/health) status (a number, or the error), and the
            C(/metrics) samples (name to value, labelled samples keyed C(name{labels}); null when not readable).
          type: dict
        serving:
          description: At least one instance is active.
          type: bool
        mem_available_bytes:
          description: C(MemAvailable) of /proc/meminfo, or null.
          type: int
        mem_total_bytes:
          description: C(MemTotal) of /proc/meminfo, or null.
          type: int
        python_apt:
          description: Whether the Python that runs modules can import apt (python3-apt).
          type: bool
        cpus:
          description: >-
            The logical CPUs processes may run on here (the module's CPU affinity: a container's cpuset), each
            C({cpu, core, package, node}) (SMT siblings share C(core) and C(package); C(node) is the NUMA node);
            the planner divides them between the instances. Null when the topology cannot be read.
          type: list
          elements: dict
        cpu_cores_online:
          description: >-
            The physical cores the machine has online, which llama.cpp counts for its default C(--threads) whatever
            the affinity; more than C(cpus) holds means the host is confined (a container's cpuset).
          type: int
        applied:
          description: >-
            What the last successful converge recorded (C(digest), C(facts), C(instances), C(written)) and C(drift),
            every difference found now (empty when the host is as the converge left it); null without a record.
          type: dict
"""

import glob
import importlib.util
import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llamafleet.mtp.plugins.module_utils import host_paths
from ansible_collections.llamafleet.mtp.plugins.module_utils.applied_state import drift, record_paths, scan
from ansible_collections.llamafleet.mtp.plugins.module_utils.cpu_cores import cores_online, read_cpus
from ansible_collections.llamafleet.mtp.plugins.module_utils.gpu_read import GPU_OPTIONS, read_gpu_facts
from ansible_collections.llamafleet.mtp.plugins.module_utils.metrics_text import parse_metrics


def _meminfo():
    out = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, dummy, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    out[key] = int(parts[0]) * 1024
    except OSError:
        pass
    return out


def _rss(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _runs_env_file(pid, env_path):
    """Whether the process runs exactly the arguments of its environment file (LLAMA_SERVER_ARGS, split as
    systemd splits $LLAMA_SERVER_ARGS), and a binary that is still the file its path names now (a switched
    build link or a replaced binary is a process that runs something else). None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
        exe = os.readlink(f"/proc/{pid}/exe")
        with open(env_path) as f:
            line = next((x for x in f if x.startswith("LLAMA_SERVER_ARGS=")), None)
    except (OSError, ValueError):
        return None
    if not cmdline or line is None:
        return None
    wanted = line[len("LLAMA_SERVER_ARGS=") :].split()
    return cmdline[1:] == wanted and exe == os.path.realpath(cmdline[0])


def _link(path):
    try:
        return os.path.basename(os.readlink(path).rstrip("/"))
    except OSError:
        return None


def _python_apt():
    # Found, not imported: importing apt (apt_pkg reads the apt configuration) costs about 0.1 s per run.
    try:
        return importlib.util.find_spec("apt") is not None
    except (ImportError, ValueError):
        return False


def _get(url, timeout, headers=None):
    """(status, body) of GET url straight to the instance (no proxy; https without certificate checks); on a
    connection error (the error's first line, None)."""
    # The standard library, not module_utils.urls: this probe reads the host's own llama-server, and the
    # facts stage pays for every import on every host of every run.
    import http.client  # pylint: disable=import-outside-toplevel
    from urllib.parse import urlsplit  # pylint: disable=import-outside-toplevel

    try:
        u = urlsplit(url)
        if u.scheme == "https":
            import ssl  # pylint: disable=import-outside-toplevel

            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            conn = http.client.HTTPSConnection(u.hostname, u.port, timeout=timeout, context=ctx)
        else:
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
        try:
            conn.request("GET", (u.path or "/") + (f"?{u.query}" if u.query else ""), headers=headers or {})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()
    except Exception as e:  # noqa: BLE001  # pylint: disable=broad-except  # any failure means not healthy
        return (str(e).splitlines() or [type(e).__name__])[0][:120], None


def _health(url, timeout):
    """The HTTP status of GET url (a number), or the connection error's first line."""
    return _get(url, timeout)[0]


def _live(inst, config_dir, timeout):
    """What one recorded instance answers now: {url, health, metrics, error}; its API key read from its key file."""
    # The host's own address of the instance (health_url), else the URL it is advertised at.
    health_url = inst.get("health_url") or ((inst.get("url") or "").rstrip("/") + "/health")
    url = health_url[: -len("/health")] if health_url.endswith("/health") else ""
    out = {"url": inst.get("url") or None, "health": None, "metrics": None, "error": None}
    if not url:
        out["error"] = "no url recorded"
        return out
    out["health"] = _health(health_url, timeout)
    headers = {}
    try:
        with open(os.path.join(config_dir, f"{inst['name']}.key")) as f:
            key = f.read().strip()
        if key:
            headers["Authorization"] = "Bearer " + key
    except OSError:
        pass  # no key file: an instance without an API key
    status, body = _get(url + "/metrics", timeout, headers)
    if status == 200:
        out["metrics"] = parse_metrics(body.decode("utf-8", "replace"))
    else:
        out["error"] = f"/metrics answered {status}" + (" (started without --metrics?)" if status == 501 else "")
    return out


def _applied(p, instances):
    try:
        with open(p["applied_path"]) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    now = scan(p["config_dir"], p["unit_dir"], p["install_root"], record_paths(record))
    problems = drift(record.get("scan"), now)
    for inst in record.get("instances") or []:
        name = inst.get("name")
        state = (instances.get(name) or {}).get("active_state")
        if state != "active":
            problems.append(f"instance {name} is {state or 'not configured'}")
        elif (instances.get(name) or {}).get("runs_env_file") is False:
            problems.append(
                f"instance {name} runs other arguments or another binary than its environment file names "
                "(an interrupted run or a rollback left the process behind its files)"
            )
        elif inst.get("health_url") or inst.get("url"):
            code = _health(inst.get("health_url") or inst["url"].rstrip("/") + "/health", p["health_timeout"])
            if code != 200:
                problems.append(f"instance {name} /health answered {code}")
    return {
        "digest": record.get("digest"),
        "facts": record.get("facts") or {},
        "instances": record.get("instances") or [],
        "written": record.get("written"),
        "drift": problems,
    }


def main():
    module = AnsibleModule(
        argument_spec={
            **host_paths.options("install_root", "config_dir", "unit_dir", "applied_path"),
            "health_timeout": {"type": "float", "default": 3},
            "gpu_facts": {"type": "dict", "options": GPU_OPTIONS},
            "set_facts": {"type": "bool", "default": True},
            "live": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    # GPUs first: a host that must have GPUs and has none fails before anything else is read.
    gpu = read_gpu_facts(module, **module.params["gpu_facts"]) if module.params["gpu_facts"] is not None else None
    root = module.params["install_root"]
    build = None
    try:
        with open(os.path.join(root, "current", "build-info.json")) as f:
            info = json.load(f)
        build = {k: info.get(k) for k in ("name", "ref", "commit", "key", "cuda", "build_number")}
        build["mtp_spec_type"] = (info.get("capabilities") or {}).get("mtp_spec_type")
    except (OSError, ValueError):
        pass

    instances = {}
    systemctl = module.get_bin_path("systemctl")
    for env in sorted(glob.glob(os.path.join(module.params["config_dir"], "*.env"))):
        name = os.path.basename(env)[: -len(".env")]
        state = {
            "active_state": None,
            "sub_state": None,
            "main_pid": 0,
            "n_restarts": 0,
            "rss_bytes": 0,
            "runs_env_file": None,
        }
        if systemctl:
            rc, out, dummy = module.run_command(
                [
                    systemctl,
                    "show",
                    f"llama-server@{name}.service",
                    "-p",
                    "ActiveState,SubState,MainPID,NRestarts",
                ]
            )
            props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line) if rc == 0 else {}
            state["active_state"] = props.get("ActiveState")
            state["sub_state"] = props.get("SubState")
            state["main_pid"] = int(props.get("MainPID") or 0)
            state["n_restarts"] = int(props.get("NRestarts") or 0) if (props.get("NRestarts") or "").isdigit() else 0
            if state["main_pid"]:
                state["rss_bytes"] = _rss(state["main_pid"])
                state["runs_env_file"] = _runs_env_file(state["main_pid"], env)
        instances[name] = state

    mem = _meminfo()
    facts = {
        "build": build,
        "current": _link(os.path.join(root, "current")),
        "previous": _link(os.path.join(root, "previous")),
        "instances": instances,
        "serving": any(i["active_state"] == "active" for i in instances.values()),
        "mem_available_bytes": mem.get("MemAvailable"),
        "mem_total_bytes": mem.get("MemTotal"),
        "python_apt": _python_apt(),
        "cpus": read_cpus(),
        "cpu_cores_online": cores_online(),
    }
    facts["applied"] = _applied(module.params, instances)
    if module.params["live"]:
        p = module.params
        for inst in (facts["applied"] or {}).get("instances") or []:
            if inst.get("name") in instances:
                instances[inst["name"]]["live"] = _live(inst, p["config_dir"], p["health_timeout"])
    if not module.params["set_facts"]:
        module.exit_json(changed=False, state=facts)
    published = {"llama_host_state": facts}
    if gpu is not None:
        published["gpu_facts"] = gpu
    module.exit_json(changed=False, ansible_facts=published)


if __name__ == "__main__":
    main()
