# The sandbox's connection `podman`: containers.podman's podman connection, with pipelining.
#
# The sandbox hosts (scripts/sandbox.sh, molecule) are podman containers that stand in for the
# ssh hosts of a real fleet. Production runs over ssh with `pipelining = True` (ansible.cfg): one
# round trip per module call, the module's code on stdin. containers.podman's connection cannot
# pipeline (`has_pipelining = False`): it runs `podman exec` without `-i`, so nothing reaches the
# module's stdin, and every module call costs six podman processes (mount, home dir, mkdir of the
# remote tmp dir, chmod, run, rm) instead of one. Its comment dates from podman 1.7, whose `exec -i`
# truncated stdin (podman issue #5046, fixed in 1.8, 2020); Debian 12 ships podman 4.3.
#
# This plugin is that connection plus `-i` when Ansible sends data on stdin, `has_pipelining =
# True`, and the container mounted only when a file is copied (put_file/fetch_file), so a sandbox
# host costs one round trip per module call, as an ssh host with pipelining does. It reads the same
# options as containers.podman.podman (ansible_podman_executable, ...). containers.podman 1.19 and
# newer (ansible 13+, with ansible-core 2.20+) rewrote the connection: it pipelines and mounts lazily
# itself, and this plugin only adds the one thing it still lacks: a stopped container is UNREACHABLE.
#
# It is controller-side test harness, not shipped in the collection. It is named `podman` on
# purpose: `ansible_connection: podman` (inventories/sandbox, and what molecule's podman driver
# writes into its inventory, which testinfra also reads) finds this file first where
# connection_plugins points here (ansible.cfg; ANSIBLE_CONNECTION_PLUGINS in
# extensions/molecule/config.yml), and containers.podman.podman (where `podman` redirects) anywhere
# else, so the sandbox still works, only slower, with another ansible.cfg. Pipelining itself is
# switched on by `[connection] pipelining = True` (ANSIBLE_PIPELINING).
from __future__ import annotations

import shlex

from ansible.errors import AnsibleConnectionFailure
from ansible.module_utils.common.text.converters import to_native
from ansible.plugins.connection import ensure_connect
from ansible_collections.containers.podman.plugins.connection import podman as upstream

DOCUMENTATION = """
    name: podman
    short_description: containers.podman.podman with pipelining (podman exec -i), a stopped container UNREACHABLE
    description:
        - The sandbox's connection. containers.podman.podman, plus C(-i) on C(podman exec) when Ansible sends the
          module on stdin, so pipelining works (containers.podman 1.18; 1.19+ does it itself), and a container
          that is not running reported as UNREACHABLE (both).
        - The options of containers.podman.podman 1.21 (a superset of 1.18's).
    options:
      remote_addr:
        description:
          - The ID or name of the container you want to access.
        default: inventory_hostname
        vars:
          - name: inventory_hostname
          - name: ansible_host
          - name: ansible_podman_host
        env:
          - name: ANSIBLE_PODMAN_HOST
        ini:
          - section: defaults
            key: remote_addr
      remote_user:
        description:
          - User specified via name or UID which is used to execute commands inside the container.
          - If you specify the user via UID, you must set C(ANSIBLE_REMOTE_TMP) to a path that exists
            inside the container and is writable by Ansible.
        ini:
          - section: defaults
            key: remote_user
        env:
          - name: ANSIBLE_REMOTE_USER
        vars:
          - name: ansible_user
      podman_extra_args:
        description:
          - Extra arguments to pass to the podman command line.
        default: ''
        type: str
        ini:
          - section: defaults
            key: podman_extra_args
        vars:
          - name: ansible_podman_extra_args
        env:
          - name: ANSIBLE_PODMAN_EXTRA_ARGS
      podman_executable:
        description:
          - Executable for podman command.
        default: podman
        type: str
        vars:
          - name: ansible_podman_executable
        env:
          - name: ANSIBLE_PODMAN_EXECUTABLE
        ini:
          - section: defaults
            key: podman_executable
      container_timeout:
        description:
          - Timeout in seconds for container operations. 0 means no timeout.
        default: 0
        type: int
        vars:
          - name: ansible_podman_timeout
        env:
          - name: ANSIBLE_PODMAN_TIMEOUT
        ini:
          - section: defaults
            key: podman_timeout
      mount_detection:
        description:
          - Enable automatic detection and use of container mount points for file operations.
        default: true
        type: bool
        vars:
          - name: ansible_podman_mount_detection
        env:
          - name: ANSIBLE_PODMAN_MOUNT_DETECTION
      ignore_mount_errors:
        description:
          - Continue with copy operations even if container mounting fails.
        default: true
        type: bool
        vars:
          - name: ansible_podman_ignore_mount_errors
      extra_env_vars:
        description:
          - Additional environment variables to set in the container.
        default: {}
        type: dict
        vars:
          - name: ansible_podman_extra_env
      privilege_escalation_method:
        description:
          - Method to use for privilege escalation inside container.
        default: 'auto'
        choices: ['auto', 'sudo', 'su', 'none']
        type: str
        vars:
          - name: ansible_podman_privilege_escalation
      working_directory:
        description:
          - Working directory for commands executed in the container.
        type: str
        vars:
          - name: ansible_podman_working_directory
    extends_documentation_fragment:
      - ansible.builtin.connection_pipelining
"""


_UNREACHABLE = ("can only create exec sessions on running containers", "no such container", "container state improper")


# containers.podman 1.19+ (the rewrite: _run_podman_command) pipelines and mounts lazily itself.
_NATIVE = hasattr(upstream.Connection, "_run_podman_command")


class Connection(upstream.Connection):
    """containers.podman.podman, with module code sent on stdin (`podman exec -i`)."""

    transport = "podman"
    has_pipelining = True

    if not _NATIVE:

        def _connect(self):
            # No `podman mount` per task: only put_file/fetch_file use the mount point (mounted on first use).
            super(upstream.Connection, self)._connect()
            self._connected = True
            return self

        def _ensure_mount(self):
            if not self._mount_tried:
                self._mount_tried = True
                upstream.Connection._connect(self)

        _mount_tried = False

        def put_file(self, in_path, out_path):
            self._ensure_mount()
            super().put_file(in_path, out_path)

        def fetch_file(self, in_path, out_path):
            self._ensure_mount()
            super().fetch_file(in_path, out_path)

    @ensure_connect
    def exec_command(self, cmd, in_data=None, sudoable=False):
        if _NATIVE:
            rc, out, err = super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
        else:
            # ConnectionBase's bookkeeping (the upstream override would run `podman exec` without -i).
            super(upstream.Connection, self).exec_command(cmd, in_data=in_data, sudoable=sudoable)
            args = ["exec"]
            if in_data is not None:
                args.append("-i")
            if self.user:
                args.extend(("--user", self.user))
            rc, out, err = self._podman(args, shlex.split(to_native(cmd, errors="surrogate_or_strict")), in_data)
        # podman's own failure to reach the container (exit 125 or 255: stopped, removed) is a host that cannot be
        # reached, as ssh's exit 255 is: UNREACHABLE, not a module whose result cannot be read.
        text = to_native(err or b"", errors="surrogate_or_strict")
        if rc in (125, 255) and any(s in text for s in _UNREACHABLE):
            raise AnsibleConnectionFailure(f"podman: {self._container_id} cannot be reached: {text.strip()}")
        return rc, out, err
