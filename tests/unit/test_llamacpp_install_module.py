"""llamacpp_install runs for real (``ansible localhost -m llamafleet.mtp.llamacpp_install``) on a scratch install tree.

The artifacts are real .tar.gz files laid out as the role packs them (``<name>/bin/llama-server``,
``<name>/build-info.json``); the llama-server inside is a shell script that answers ``--version`` (a real build
is not needed to test the install tree: the role's molecule scenario and the fleet tests install real ones).
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from pathlib import Path

import pytest
from ansible_collections.llamafleet.mtp.plugins.module_utils.build_install import switch_plan, to_prune
from ansible_run import needs_ansible, run_module

pytestmark = needs_ansible


def artifact(tmp: Path, name: str, runs: bool = True) -> tuple[str, str]:
    src = tmp / "src" / name
    (src / "bin").mkdir(parents=True)
    server = src / "bin" / "llama-server"
    server.write_text("#!/bin/sh\necho 'version: 9180 (0d91d73b)'\n" + ("" if runs else "exit 127\n"))
    server.chmod(0o755)
    (src / "build-info.json").write_text(json.dumps({"name": name}) + "\n")
    out = tmp / f"{name}.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(src, arcname=name)
    return str(out), hashlib.sha256(out.read_bytes()).hexdigest()


def links(root: Path) -> tuple[str | None, str | None]:
    def name(link):
        return os.path.basename(os.readlink(link)) if link.is_symlink() else None

    return name(root / "current"), name(root / "previous")


def install(root: Path, name: str, art: tuple[str, str] | None = None, **kw) -> dict:
    args = {"install_root": str(root), "name": name, **kw}
    if art:
        args.update(artifact=art[0], sha256=art[1])
    return run_module("llamacpp_install", args, check_rc=False)


def test_install_switch_rollback_and_prune(tmp_path):
    root = tmp_path / "opt"
    a, b, c = (artifact(tmp_path, n) for n in ("aaaa-1", "bbbb-2", "cccc-3"))

    r = install(root, "aaaa-1", a, keep=3)
    assert r["changed"] and r["installed"] and r["switched"] and r["previous"] is None, r
    assert r["info"] == {"name": "aaaa-1"}  # the build-info.json of what current points at
    assert links(root) == ("aaaa-1", None)
    assert (root / "current" / "bin" / "llama-server").exists()
    assert sorted(os.listdir(root / "builds")) == ["aaaa-1"]  # no .unpack-* left behind

    r = install(root, "aaaa-1", a, keep=3)
    assert not r["changed"] and not r["installed"] and not r["switched"], r

    r = install(root, "bbbb-2", b, keep=3)
    assert r["changed"] and r["current"] == "bbbb-2" and r["previous"] == "aaaa-1", r
    assert links(root) == ("bbbb-2", "aaaa-1")

    r = run_module("llamacpp_install", {"install_root": str(root), "rollback": True}, check_rc=False)
    assert r["changed"] and r["current"] == "aaaa-1" and r["previous"] == "bbbb-2" and r["info"]["name"] == "aaaa-1", r
    assert links(root) == ("aaaa-1", "bbbb-2")

    # keep 1: the oldest build that is neither current nor previous goes
    install(root, "cccc-3", c, keep=3)
    assert links(root) == ("cccc-3", "aaaa-1")
    os.utime(root / "builds" / "bbbb-2", (1, 1))
    r = install(root, "cccc-3", keep=1)
    assert r["changed"] and r["pruned"] == ["bbbb-2"] and not r["switched"], r
    assert sorted(os.listdir(root / "builds")) == ["aaaa-1", "cccc-3"]


def test_failures_change_nothing(tmp_path):
    root = tmp_path / "opt"
    good = artifact(tmp_path, "aaaa-1")
    install(root, "aaaa-1", good)
    before = (links(root), sorted(os.listdir(root / "builds")))

    bad_sum = artifact(tmp_path, "bbbb-2")
    r = install(root, "bbbb-2", (bad_sum[0], "0" * 64))
    assert r["failed"] and "has sha256" in r["msg"] and "nothing was changed" in r["msg"], r

    broken = artifact(tmp_path, "cccc-3", runs=False)
    r = install(root, "cccc-3", broken)
    assert r["failed"] and "does not run on this host" in r["msg"] and "exited 127" in r["msg"], r

    r = install(root, "dddd-4")
    assert r["failed"] and "no artifact was given" in r["msg"], r

    r = run_module("llamacpp_install", {"install_root": str(root), "rollback": True}, check_rc=False)
    assert r["failed"] and "nothing to roll back to" in r["msg"], r

    assert (links(root), sorted(os.listdir(root / "builds"))) == before


def test_check_mode_predicts_and_changes_nothing(tmp_path):
    root = tmp_path / "opt"
    a, b = artifact(tmp_path, "aaaa-1"), artifact(tmp_path, "bbbb-2")
    install(root, "aaaa-1", a)
    args = {"install_root": str(root), "name": "bbbb-2", "artifact": b[0], "sha256": b[1], "keep": 3}
    r = run_module("llamacpp_install", args, check_mode=True)
    assert r["changed"] and r["installed"] and r["switched"] and r["previous"] == "aaaa-1", r
    assert links(root) == ("aaaa-1", None) and sorted(os.listdir(root / "builds")) == ["aaaa-1"]


@pytest.mark.parametrize(
    "builds, keep, protected, expected",
    [
        ([("a", 1), ("b", 2), ("c", 3), ("d", 4)], 2, {"d"}, ["a", "b"]),
        ([("a", 1), ("b", 2), ("c", 3), ("d", 4)], 2, {"a"}, ["b"]),  # previous is old but kept
        ([("a", 1)], 0, {"a"}, []),
        ([("a", 1), ("b", 2)], 5, set(), []),
    ],
)
def test_to_prune(builds, keep, protected, expected):
    assert to_prune(builds, keep, protected) == expected


def test_switch_plan():
    assert switch_plan("/o/builds/a", None, "/o/builds/a") == {
        "changed": False,
        "current": "/o/builds/a",
        "previous": None,
    }
    assert switch_plan("/o/builds/a", "/o/builds/z", "/o/builds/b")["previous"] == "/o/builds/a"
    assert switch_plan(None, None, "/o/builds/b") == {"changed": True, "current": "/o/builds/b", "previous": None}
