# -*- coding: utf-8 -*-
# MIT License (see LICENSE)
"""The applied-state record: what the last successful converge left on a host, and how it drifted.

A converge that passes its health gate and smoke test records, on the host, the digest of the declared
state it applied (computed on the controller, `declared_digest`) and a scan of everything it left there:
each instance's environment file, key and systemd drop-ins (sha256), the template unit, where `current`
and `previous` point, and the model files (size and mtime). The next run's `llama_host_state` scans again
and lists every difference (`drift`); the controller compares digests. A host whose digest matches and
that shows no drift, with every recorded instance active and healthy, is converged: the run has nothing
to do there and skips the converge. Anything else takes the full converge, which repairs what drifted.

Runs on managed hosts (Python 3.8+) and on the controller; standard library only.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os

UNIT = "llama-server@"
# The drop-in the llama_server_systemd role writes per instance (roles/llama_server_systemd/tasks/instance.yml).
# Other drop-ins are the admin's own: not managed, not drift.
DROPIN = "10-llamafleet.conf"
VERSION = 1


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def declared_digest(obj):
    """A stable sha256 of a JSON-able object (sorted keys, no whitespace)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def _link(path):
    try:
        return os.readlink(path)
    except OSError:
        return None


def configured_instances(config_dir):
    return sorted(os.path.basename(p)[: -len(".env")] for p in glob.glob(os.path.join(config_dir, "*.env")))


def scan(config_dir, unit_dir, install_root, models=()):
    """What the converge manages on this host now: files (sha256, or None when absent), links, models."""
    files = {}
    names = configured_instances(config_dir)
    for name in names:
        for ext in (".env", ".key"):
            path = os.path.join(config_dir, name + ext)
            if os.path.isfile(path):
                files[path] = sha256_file(path)
        path = os.path.join(unit_dir, f"{UNIT}{name}.service.d", DROPIN)
        files[path] = sha256_file(path) if os.path.isfile(path) else None
    unit = os.path.join(unit_dir, f"{UNIT}.service")
    files[unit] = sha256_file(unit) if os.path.isfile(unit) else None
    links = {n: _link(os.path.join(install_root, n)) for n in ("current", "previous")}
    server = os.path.join(install_root, "current", "bin", "llama-server")
    model_stats = {}
    for path in models:
        try:
            st = os.stat(path)
            model_stats[path] = [st.st_size, st.st_mtime_ns]
        except OSError:
            model_stats[path] = None
    return {
        "version": VERSION,
        "instances": names,
        "files": files,
        "links": links,
        "server": os.access(server, os.X_OK),
        "models": model_stats,
    }


def drift(recorded, now):
    """Every difference between the recorded scan and the scan now, as short sentences (empty: none)."""
    out = []
    if (recorded or {}).get("version") != VERSION:
        return ["no applied-state record of this version"]
    if recorded["instances"] != now["instances"]:
        out.append(f"instances configured {now['instances']}, applied {recorded['instances']}")
    for path in sorted(set(recorded["files"]) | set(now["files"])):
        was, cur = recorded["files"].get(path), now["files"].get(path)
        if was == cur:
            continue
        if cur is None:
            out.append(f"{path} is missing")
        elif was is None:
            out.append(f"{path} was added")
        else:
            out.append(f"{path} was changed")
    for name, target in recorded["links"].items():
        if now["links"].get(name) != target:
            out.append(f"{name} points at {now['links'].get(name)}, applied {target}")
    if not now["server"]:
        out.append("current/bin/llama-server is missing")
    for path, stat in recorded["models"].items():
        cur = now["models"].get(path)
        if cur is None:
            out.append(f"model {path} is missing")
        elif stat != cur:
            out.append(f"model {path} changed (size/mtime)")
    return out


def record_paths(record):
    """The model paths a recorded scan covers (what the next scan must stat)."""
    return sorted(((record or {}).get("scan") or {}).get("models") or {})
