"""The paths the collection manages on a host, written once (issue: defaults in one place).

Modules build their argument specs from ``options()``; the doc fragment ``attributes.host_paths``, the modules'
DOCUMENTATION and the roles' defaults and argument_specs repeat these values as YAML text, and unit tests
(tests/unit/test_role_defaults.py) and ansible-test's validate-modules hold them to these constants.
"""

from __future__ import annotations

INSTALL_ROOT = "/opt/llama.cpp"  # the llamacpp_mtp_build role's builds/, current and previous
CONFIG_DIR = "/etc/llama-server"  # the llama_server_systemd role's <name>.env and <name>.key
UNIT_DIR = "/etc/systemd/system"  # llama-server@.service and its drop-ins
STATE_DIR = "/var/lib/llamafleet"  # what the fleet playbooks keep on a host
APPLIED_PATH = STATE_DIR + "/applied.json"  # the last converge's record (llama_applied_state)
SNAPSHOT_DIR = STATE_DIR + "/rollback"  # the rollback snapshot (llama_server_snapshot)

DEFAULTS = {
    "install_root": INSTALL_ROOT,
    "config_dir": CONFIG_DIR,
    "unit_dir": UNIT_DIR,
    "applied_path": APPLIED_PATH,
    "snapshot_dir": SNAPSHOT_DIR,
}


def options(*names, **renamed) -> dict:
    """Argument-spec entries (type path, the default above) for ``names``, and ``option=path name`` pairs."""
    out = {n: {"type": "path", "default": DEFAULTS[n]} for n in names}
    out.update({option: {"type": "path", "default": DEFAULTS[n]} for option, n in renamed.items()})
    return out
