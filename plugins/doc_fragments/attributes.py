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
