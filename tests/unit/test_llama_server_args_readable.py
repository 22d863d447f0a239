"""llama_server_args warns about a model file its service user cannot read, and not on a fresh host where the role
creates that user only after the check (the file's group is the user's group to be: no false warning on the first
converge of every host, README command 1's only module warning before this)."""

from __future__ import annotations

import os

from ansible_collections.llamafleet.mtp.plugins.modules.llama_server_args import _unreadable

NO_USER = "llamafleet-no-such-user"


def _file(tmp_path, mode, gid=0):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    os.chown(f, 0, gid)
    os.chmod(f, mode)
    return str(f)


def test_a_user_still_to_be_created_reads_through_its_group(tmp_path):
    f = _file(tmp_path, 0o640, gid=0)  # root:root 0640, the group the user will join is root here
    assert _unreadable([f], NO_USER, "root") == []


def test_a_file_the_group_cannot_read_is_named(tmp_path):
    f = _file(tmp_path, 0o600, gid=0)
    assert _unreadable([f], NO_USER, "root") == [f]


def test_neither_user_nor_group_yet_is_not_judged(tmp_path):
    f = _file(tmp_path, 0o600)
    assert _unreadable([f], NO_USER, "llamafleet-no-such-group") == []


def test_an_existing_user_is_judged_by_its_own_ids(tmp_path):
    f = _file(tmp_path, 0o640, gid=0)
    assert _unreadable([f], "nobody", "root") == [f]  # nobody is in nogroup, not root's group
    os.chmod(f, 0o644)
    assert _unreadable([f], "nobody", "root") == []
