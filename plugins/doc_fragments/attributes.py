"""Documentation fragments shared by this collection's modules."""


class ModuleDocFragment:
    # Modules that only read the host (facts, probes, planners): extends_documentation_fragment:
    # [llamafleet.mtp.attributes.read_only]
    DOCUMENTATION = r"""
options: {}
"""

    READ_ONLY = r"""
options: {}
attributes:
  check_mode:
    support: full
    description: Only reads; runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing to diff.
"""

    # Action plugins that only compute on the controller from facts (no connection to the host):
    # extends_documentation_fragment: [llamafleet.mtp.attributes.controller_action]
    CONTROLLER_ACTION = r"""
options: {}
attributes:
  action:
    support: full
    description: Runs on the controller as an action plugin.
  check_mode:
    support: full
    description: Only computes; the same in check mode.
  diff_mode:
    support: none
    description: Nothing to diff.
"""

    # The paths the server and build roles manage on a host, as the modules that read or record them take them:
    # extends_documentation_fragment: [llamafleet.mtp.attributes.host_paths]
    HOST_PATHS = r"""
options:
  config_dir:
    description: The llama_server_systemd role's configuration directory (one C(<name>.env) per instance).
    type: path
    default: /etc/llama-server
  unit_dir:
    description: The systemd unit directory holding C(llama-server@.service) and its drop-ins.
    type: path
    default: /etc/systemd/system
  install_root:
    description: The llamacpp_mtp_build role's install root (C(current) and C(previous) links).
    type: path
    default: /opt/llama.cpp
"""
