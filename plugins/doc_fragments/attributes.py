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
