# MIT License (see LICENSE)
"""AnsibleModule whose invocation log (the managed host's journal or syslog) never holds a no_log value.

Why: AnsibleModule logs every option that is not itself ``no_log`` ("Invoked with ...") to the host's journal.
A list or dict option is logged as ``str(value)`` - Python's repr - and only then are the no_log values
searched for in that text. A no_log suboption whose value's repr differs from the value (a newline, a
backslash, a quote, a non-ASCII character: ``'sk-key\\n'`` for the key file content ``sk-key`` + newline)
is therefore not found and is logged in clear. Every API key file the collection wrote ended in a newline.

The fix removes the no_log values from the options' data structures (``remove_values``, the function
Ansible applies to a module's result) before AnsibleModule stringifies them, so whatever a suboption holds
is masked whatever characters it has. The module's own ``params`` are left as they were. Every module of
the collection that takes a secret (an option or suboption with ``no_log``) uses this class; a unit test
walks every module's argument spec and holds them to it.

ansible-core 2.22 fixed this upstream: its invocation log redacts no_log options by their place in the
argument spec (``AnsibleModule._redact_no_log_params``), suboptions included, and deprecates ``remove_values``
(removal in 2.25; "secret values are now masked automatically"). There the class adds nothing and calls no
deprecated function; on 2.20 and 2.21 it masks as described above.
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule as _AnsibleModule

# ansible-core 2.22+: the invocation log is redacted structurally by AnsibleModule itself.
_REDACTS_STRUCTURALLY = hasattr(_AnsibleModule, "_redact_no_log_params")


class AnsibleModule(_AnsibleModule):
    """ansible.module_utils.basic.AnsibleModule, with the invocation log masked structurally."""

    def _log_invocation(self):
        if _REDACTS_STRUCTURALLY:
            return super()._log_invocation()
        # ansible-core 2.20/2.21, where remove_values is not deprecated (imported here: never on 2.22+)
        from ansible.module_utils.common.parameters import remove_values

        params = self.params
        self.params = remove_values(params, self.no_log_values)
        try:
            return super()._log_invocation()
        finally:
            self.params = params
