#!/usr/bin/python
# MIT License (see LICENSE)
"""Ansible module llamafleet.mtp.host_files: a stage's directories and small files in one call."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_files
short_description: Ensure a set of directories and small text files (content, owner, group, mode) in one call
version_added: "0.4.0"
description:
  - Creates O(directories), then writes each of O(files) and O(private_files) whose content, owner, group or mode
    differ - atomically (a temporary file in the same directory, renamed over the old one), so a reader never
    sees half a file. Files whose content already matches are left alone (only owner, group and mode are set).
  - One round trip for what would otherwise be one M(ansible.builtin.file) or M(ansible.builtin.copy) task per
    path (each of those costs several). The roles use it for the files one stage writes together - the systemd
    template unit and its configuration directory; an instance's drop-in, API key and environment file.
  - O(private_files) take the same keys as O(files); their content is never logged, returned or shown in a diff.
  - With O(daemon_reload), runs C(systemctl daemon-reload) after a change to any of O(files) or O(private_files).
  - Standard library only (Python 3.8+).
author:
  - llamafleet maintainers (!UNKNOWN)
options:
  directories:
    description: Directories to create (parents too). Default mode 0755.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path.
        type: path
        required: true
      owner: &owner
        description: Owner (name); unset leaves it as it is (a new path gets the module's user). A user that does
          not exist fails, except in check mode (an earlier task may create it), where the path reports a change.
        type: str
      group: &group
        description: Group (name); unset leaves it as it is. A missing group is handled as a missing owner is.
        type: str
      mode: &mode
        description: Octal mode, a string such as C("0644").
        type: str
  files:
    description: Files to write. Default mode 0644.
    type: list
    elements: dict
    default: []
    suboptions: &file_entry
      path:
        description: Absolute path; its directory must exist (or be listed in O(directories)).
        type: path
        required: true
      content:
        description: The whole content (UTF-8 text); for O(private_files) never logged or returned.
        type: str
        required: true
      owner: *owner
      group: *group
      mode: *mode
  private_files:
    description: Like O(files), for content that must never be shown (API keys) - the content is C(no_log).
      Default mode 0600.
    type: list
    elements: dict
    default: []
    suboptions: *file_entry
  daemon_reload:
    description: Run C(systemctl daemon-reload) when any file changed (not in check mode).
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Writes nothing; reports what would change.
  diff_mode:
    support: full
    description: Before and after of each changed file of O(files) (never of O(private_files)).
"""

EXAMPLES = r"""
- name: Write an instance's drop-in, API key and environment file
  llamafleet.mtp.host_files:
    directories:
      - {path: /etc/systemd/system/llama-server@main.service.d, mode: "0755"}
    files:
      - {path: /etc/systemd/system/llama-server@main.service.d/10-llamafleet.conf, content: "{{ dropin }}"}
      - {path: /etc/llama-server/main.env, content: "{{ env_file }}"}
    private_files:
      - {path: /etc/llama-server/main.key, content: "{{ api_key }}\n"}
    daemon_reload: true
"""

RETURN = r"""
changed_paths:
  description: The directories and files that were (in check mode, would be) created or changed.
  returned: always
  type: list
  elements: str
reloaded:
  description: Whether C(systemctl daemon-reload) ran.
  returned: always
  type: bool
"""

import grp
import os
import pwd
import tempfile

from ansible_collections.llamafleet.mtp.plugins.module_utils.secret_module import AnsibleModule


def attrs(**more):
    """The keys of a directory or file entry."""
    return {
        "path": {"type": "path", "required": True},
        "owner": {"type": "str"},
        "group": {"type": "str"},
        "mode": {"type": "str"},
        **{k: {**v, "required": True} for k, v in more.items()},
    }


def ids(module, entry):
    """(uid, gid) for the entry's owner and group; -1 leaves one as it is.

    A user or group that does not exist fails - except in check mode, where an earlier task of the same run
    (which check mode did not run) may create it: then it is None, and the path reports a change."""

    def lookup(kind, name, get):
        try:
            return get(name)
        except KeyError:
            if module.check_mode:
                return None
            module.fail_json(msg=f"{entry['path']}: no such {kind} {name!r}")

    uid = gid = -1
    if entry.get("owner") not in (None, ""):
        uid = lookup("user", str(entry["owner"]), lambda n: pwd.getpwnam(n).pw_uid)
    if entry.get("group") not in (None, ""):
        gid = lookup("group", str(entry["group"]), lambda n: grp.getgrnam(n).gr_gid)
    return uid, gid


def mode_of(module, entry, default):
    raw = entry.get("mode")
    try:
        return int(str(raw), 8) if raw not in (None, "") else default
    except ValueError:
        module.fail_json(msg=f"{entry['path']}: mode={raw!r} is not an octal mode such as '0644'")


def attrs_differ(st, uid, gid, mode):
    if uid is None or gid is None:  # check mode: the user or group does not exist yet
        return True
    return (uid != -1 and st.st_uid != uid) or (gid != -1 and st.st_gid != gid) or (st.st_mode & 0o7777) != mode


def ensure_dir(module, entry):
    path = entry["path"]
    uid, gid = ids(module, entry)
    mode = mode_of(module, entry, 0o755)
    if not os.path.isdir(path):
        if os.path.lexists(path):
            module.fail_json(msg=f"{path} exists and is not a directory")
        if not module.check_mode:
            os.makedirs(path, exist_ok=True)
            os.chown(path, uid, gid)
            os.chmod(path, mode)
        return True
    if attrs_differ(os.stat(path), uid, gid, mode):
        if not module.check_mode:
            os.chown(path, uid, gid)
            os.chmod(path, mode)
        return True
    return False


def ensure_file(module, entry, default_mode, secret, diffs):
    path = entry["path"]
    data = entry["content"].encode("utf-8")
    uid, gid = ids(module, entry)
    mode = mode_of(module, entry, default_mode)
    before = None
    if os.path.lexists(path):
        if os.path.islink(path) or not os.path.isfile(path):
            module.fail_json(msg=f"{path} exists and is not a regular file")
        with open(path, "rb") as f:
            before = f.read()
    if before == data:
        st = os.stat(path)
        if not attrs_differ(st, uid, gid, mode):
            return False
        if not module.check_mode:
            os.chown(path, uid, gid)
            os.chmod(path, mode)
        return True
    if not secret and module._diff:
        diffs.append(
            {
                "before_header": path,
                "after_header": path,
                "before": before.decode("utf-8", "replace") if before is not None else "",
                "after": data.decode("utf-8"),
            }
        )
    if module.check_mode:
        return True
    parent = os.path.dirname(path) or "/"
    if not os.path.isdir(parent):
        module.fail_json(msg=f"{path}: directory {parent} does not exist (list it in directories)")
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=parent)
    try:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return True


def main():
    module = AnsibleModule(
        argument_spec={
            "directories": {"type": "list", "elements": "dict", "default": [], "options": attrs()},
            "files": {"type": "list", "elements": "dict", "default": [], "options": attrs(content={"type": "str"})},
            "private_files": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": attrs(content={"type": "str", "no_log": True}),
            },
            "daemon_reload": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    for opt in ("directories", "files", "private_files"):
        for entry in p[opt]:
            if not os.path.isabs(entry["path"]):
                module.fail_json(msg=f"{opt}: path={entry['path']} is not absolute")
            ids(module, entry)  # every owner, group and mode is checked before anything is written
            mode_of(module, entry, 0)

    changed_paths, diffs = [], []
    for entry in p["directories"]:
        if ensure_dir(module, entry):
            changed_paths.append(entry["path"])
    files_changed = False
    for entry, default_mode, secret in [(e, 0o644, False) for e in p["files"]] + [
        (e, 0o600, True) for e in p["private_files"]
    ]:
        if ensure_file(module, entry, default_mode, secret, diffs):
            changed_paths.append(entry["path"])
            files_changed = True

    reloaded = False
    if p["daemon_reload"] and files_changed and not module.check_mode:
        rc, out, err = module.run_command(["systemctl", "daemon-reload"])
        if rc != 0:
            module.fail_json(msg=f"systemctl daemon-reload failed (rc={rc}): {(err or out).strip()}")
        reloaded = True

    result = {"changed": bool(changed_paths), "changed_paths": changed_paths, "reloaded": reloaded}
    if diffs:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
