#!/usr/bin/python
# MIT License (see LICENSE)
"""Ansible module llamafleet.mtp.model_share: a short-lived, read-only rsync daemon serving model directories."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_share
short_description: Serve model directories to the fleet's other hosts for a while (read-only rsync daemon)
version_added: "0.9.0"
description:
  - With O(state=present), starts the distribution's C(rsync --daemon) as a transient systemd unit
    (C(systemd-run), unit O(unit)) that serves each of O(exports) read-only as an rsync module, bound to
    O(address) on O(port), to the one user C(llamafleet) whose password is O(secret) (a one-time token the
    model_fetch role makes per run). Hidden files (downloads in progress) are not served, listing is off, the
    daemon reads as C(nobody) with the group O(group) in a chroot, and serves at most O(max_connections)
    transfers at once. systemd stops it after O(lifetime) seconds even if the run that started it was
    interrupted. A share already running is replaced.
  - With O(state=absent), stops the unit and removes its configuration, then the files in O(remove) (the
    pieces the share served, which nothing needs once every peer has gathered them).
  - The configuration and the secrets file live in C(/run/llamafleet-model-share), root-only (0600); the token
    is never in an argument list, a log or the journal.
  - The model_fetch role (C(model_fetch_delivery=fanout)) starts a share on each host that serves others in a
    run, and stops them all at the end of its delivery.
author:
  - llamafleet maintainers (!UNKNOWN)
options:
  state:
    description: Whether the share runs.
    type: str
    choices: [present, absent]
    default: present
  exports:
    description: What to serve - one rsync module per entry.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: The module name (the model's name); letters, digits, C(.), C(_), C(-).
        type: str
        required: true
      path:
        description: Absolute directory served.
        type: path
        required: true
  address:
    description:
      - Address to bind, the host's address on the fleet network. Empty - the source address of the host's
        default route (what its peers reach it at on a flat network).
    type: str
    default: ""
  port:
    description: TCP port.
    type: int
    default: 8873
  secret:
    description: Password of the share's one user C(llamafleet).
    type: str
  group:
    description: Group the daemon reads the files as (the model files' group).
    type: str
    default: llama-server
  max_connections:
    description: Transfers served at once; more wait for the next round (they are refused by the daemon).
    type: int
    default: 1
  lifetime:
    description: Seconds after which systemd stops the share whatever happens to the run.
    type: int
    default: 3600
  unit:
    description: Name of the transient systemd unit.
    type: str
    default: llamafleet-model-share
  remove:
    description:
      - With O(state=absent), absolute paths of files to remove once the share is stopped (one module call for
        both, instead of a second task on every host); a path already gone is no change.
    type: list
    elements: path
    default: []
    version_added: "1.1.0"
requirements:
  - rsync and systemd on the host.
attributes:
  check_mode:
    support: full
    description: Reports the address it would bind and that it would start or stop the share; starts nothing.
  diff_mode:
    support: none
    description: Nothing to diff.
"""

EXAMPLES = r"""
- name: Serve the tiny model to this run's peers
  llamafleet.mtp.model_share:
    exports:
      - name: tiny
        path: /var/lib/llama-models/tiny
    secret: "{{ one_time_token }}"
  register: share

- name: Stop serving, and remove the piece this host was sent
  llamafleet.mtp.model_share:
    state: absent
    remove:
      - /var/lib/llama-models/tiny/.tiny.gguf.piece-0
"""

RETURN = r"""
address:
  description: The address the share is bound to (present).
  returned: success
  type: str
port:
  description: Its port.
  returned: success
  type: int
unit:
  description: The systemd unit.
  returned: always
  type: str
removed:
  description: The files of O(remove) that were there and were removed (or would be, in check mode).
  returned: state=absent
  type: list
  elements: str
"""

import os
import re
import shutil
import socket
import time

from ansible_collections.llamafleet.mtp.plugins.module_utils.secret_module import AnsibleModule

RUN_DIR = "/run/llamafleet-model-share"
NAME_RE = re.compile(r"^[A-Za-z0-9._-]+$")


def route_address() -> str:
    """The source address of the default route (IPv4, else IPv6); no packet is sent (a UDP socket only
    picks its route when connected)."""
    for family, probe in ((socket.AF_INET, "192.0.2.1"), (socket.AF_INET6, "2001:db8::1")):
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect((probe, 9))
                return s.getsockname()[0]
        except OSError:
            continue
    return ""


def config_text(exports: list, address: str, port: int, group: str, max_connections: int) -> str:
    """rsyncd.conf: one read-only module per export, one user, no listing, hidden files excluded but the pieces
    the controller sent for the peers to gather (``.NAME.piece-I``; rsyncd's includes override its excludes)."""
    lines = [
        f"address = {address}",
        f"port = {port}",
        f"pid file = {RUN_DIR}/rsyncd.pid",
        "use chroot = yes",
        "uid = nobody",
        f"gid = {group}",
        "read only = yes",
        "list = no",
        f"max connections = {max_connections}",
        f"lock file = {RUN_DIR}/rsyncd.lock",
        "auth users = llamafleet",
        f"secrets file = {RUN_DIR}/secrets",
        "strict modes = yes",
        "include = .*.piece-*",
        "exclude = .*",
        "transfer logging = no",
        "",
    ]
    for e in exports:
        lines += [f"[{e['name']}]", f"path = {e['path']}", ""]
    return "\n".join(lines)


def write_private(path: str, text: str) -> None:
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


_RUN = {}  # "module": the AnsibleModule of this run (its run_command runs every command)


class Done:
    """A command's outcome (rc, stdout, stderr)."""

    def __init__(self, rc: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = rc, stdout, stderr


def run(argv: list[str]) -> Done:
    return Done(*_RUN["module"].run_command(argv))


def systemctl(*args: str) -> Done:
    return run(["systemctl", *args])


def stop(unit: str) -> bool:
    """Stop the unit and remove the configuration; True when anything was running or on disk."""
    was = systemctl("is-active", "--quiet", unit).returncode == 0
    systemctl("stop", unit)
    systemctl("reset-failed", unit)
    existed = os.path.isdir(RUN_DIR)
    shutil.rmtree(RUN_DIR, ignore_errors=True)
    return was or existed


def wait_listening(address: str, port: int, unit: str, seconds: float = 10.0) -> str | None:
    """None once the daemon accepts connections, else why not."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=1):
                return None
        except OSError:
            if systemctl("is-active", "--quiet", unit).returncode != 0:
                break
            time.sleep(0.1)
    status = systemctl("status", "--no-pager", "--lines", "10", unit)
    return f"the share did not start listening on {address}:{port}: {(status.stdout or status.stderr).strip()}"


def problems_of(p: dict, check_mode: bool) -> list[str]:
    out = []
    if p["state"] == "present":
        if not p["secret"]:
            out.append("secret is required with state=present")
        for e in p["exports"]:
            if not NAME_RE.match(e["name"]):
                out.append(f"export name {e['name']!r} must be letters, digits, '.', '_' or '-'")
            if not str(e["path"]).startswith("/"):
                out.append(f"export {e['name']!r}: path {e['path']!r} must be absolute")
        if not 1 <= p["port"] <= 65535:
            out.append(f"port {p['port']} is not a TCP port")
        if p["max_connections"] < 1 or p["lifetime"] < 1:
            out.append("max_connections and lifetime must be at least 1")
        if not shutil.which("rsync") and not check_mode:  # check mode: the role would install it first
            out.append("rsync is not installed on this host (the model_fetch role installs it for fan-out)")
        if p.get("remove"):
            out.append("remove is for state=absent")
    out += [f"remove: {x!r} must be an absolute path" for x in p.get("remove") or [] if not str(x).startswith("/")]
    return out


def start(module, p: dict, address: str) -> None:
    stop(p["unit"])
    os.makedirs(RUN_DIR, mode=0o700, exist_ok=True)
    os.chmod(RUN_DIR, 0o700)
    write_private(f"{RUN_DIR}/secrets", f"llamafleet:{p['secret']}\n")
    write_private(
        f"{RUN_DIR}/rsyncd.conf",
        config_text(p["exports"], address, p["port"], p["group"], p["max_connections"]),
    )
    cmd = [
        "systemd-run",
        f"--unit={p['unit']}",
        "--collect",
        "--quiet",
        f"--property=RuntimeMaxSec={p['lifetime']}",
        "--property=NoNewPrivileges=yes",
        "--property=ProtectHome=yes",
        shutil.which("rsync") or "rsync",
        "--daemon",
        "--no-detach",
        f"--config={RUN_DIR}/rsyncd.conf",
    ]
    res = run(cmd)
    if res.returncode != 0:
        module.fail_json(msg=f"could not start the share: {(res.stderr or res.stdout).strip()}", cmd=cmd)
    why = wait_listening(address, p["port"], p["unit"])
    if why:
        stop(p["unit"])
        module.fail_json(msg=why)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
            "exports": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": {"name": {"type": "str", "required": True}, "path": {"type": "path", "required": True}},
            },
            "address": {"type": "str", "default": ""},
            "port": {"type": "int", "default": 8873},
            "secret": {"type": "str", "no_log": True},
            "group": {"type": "str", "default": "llama-server"},
            "max_connections": {"type": "int", "default": 1},
            "lifetime": {"type": "int", "default": 3600},
            "unit": {"type": "str", "default": "llamafleet-model-share"},
            "remove": {"type": "list", "elements": "path", "default": []},
        },
        supports_check_mode=True,
    )
    _RUN["module"] = module
    p = module.params
    problems = problems_of(p, module.check_mode)
    if problems:
        module.fail_json(msg="model_share: " + "; ".join(problems))
    if p["state"] == "absent":
        running = systemctl("is-active", "--quiet", p["unit"]).returncode == 0 or os.path.isdir(RUN_DIR)
        if running and not module.check_mode:
            stop(p["unit"])
        removed = [x for x in p["remove"] if os.path.lexists(x)]
        if not module.check_mode:
            for x in removed:
                try:
                    os.unlink(x)
                except OSError as e:  # a directory, or a file it may not remove: named, not a traceback
                    module.fail_json(msg=f"model_share: could not remove {x}: {e.strerror}", unit=p["unit"])
        module.exit_json(changed=running or bool(removed), unit=p["unit"], removed=removed)
    address = p["address"] or route_address()
    if not address:
        module.fail_json(msg="model_share: no address given and the host has no default route; set address")
    if not module.check_mode:
        start(module, p, address)
    module.exit_json(changed=True, address=address, port=p["port"], unit=p["unit"])


if __name__ == "__main__":
    main()
