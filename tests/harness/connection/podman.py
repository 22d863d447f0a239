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
# options as containers.podman.podman (ansible_podman_executable, ...).
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
    short_description: containers.podman.podman with pipelining (podman exec -i)
    description:
        - The sandbox's connection. containers.podman.podman, plus C(-i) on C(podman exec) when Ansible sends the
          module on stdin, so pipelining works.
        - Same options as containers.podman.podman.
    options:
      remote_addr:
        description:
          - The ID of the container you want to access.
        default: inventory_hostname
        vars:
          - name: ansible_host
          - name: inventory_hostname
          - name: ansible_podman_host
      remote_user:
        description:
          - User specified via name or UID which is used to execute commands inside the container.
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
        vars:
          - name: ansible_podman_executable
        env:
          - name: ANSIBLE_PODMAN_EXECUTABLE
    extends_documentation_fragment:
      - ansible.builtin.connection_pipelining
"""


_UNREACHABLE = ("can only create exec sessions on running containers", "no such container", "container state improper")


class Connection(upstream.Connection):
    """containers.podman.podman, with module code sent on stdin (`podman exec -i`)."""

    transport = "podman"
    has_pipelining = True

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
