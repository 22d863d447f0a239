# MIT License (see LICENSE)
"""The versioned install tree of llama.cpp builds: <root>/builds/<name>/, <root>/current and <root>/previous.

Pure decisions (what to prune) and the few filesystem steps the llamacpp_install module takes, standard library
only (Python 3.8+, runs on the hosts). `current` and `previous` are symlinks to <root>/builds/<name>, replaced
atomically (a new symlink renamed over the old one), so a reader always sees one build or the other.
"""

from __future__ import annotations

import os


def link_target(link: str) -> str | None:
    """The absolute path a symlink points at, or None when `link` is not a symlink."""
    if not os.path.islink(link):
        return None
    target = os.readlink(link)
    if not os.path.isabs(target):
        target = os.path.normpath(os.path.join(os.path.dirname(link), target))
    return target


def installed_builds(builds_dir: str) -> list[tuple[str, float]]:
    """(name, mtime) of each build directory; hidden entries (.unpack-*) are not builds."""
    try:
        names = os.listdir(builds_dir)
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        path = os.path.join(builds_dir, name)
        if name.startswith(".") or os.path.islink(path) or not os.path.isdir(path):
            continue
        out.append((name, os.stat(path).st_mtime))
    return out


def to_prune(builds: list[tuple[str, float]], keep: int, protected: set[str]) -> list[str]:
    """The builds beyond the `keep` most recent (by mtime), never one in `protected` (current, previous)."""
    ordered = sorted(builds, key=lambda b: (b[1], b[0]), reverse=True)
    return sorted(build[0] for build in ordered[max(keep, 0) :] if build[0] not in protected)


def switch_plan(current: str | None, previous: str | None, to: str) -> dict:
    """What switching `current` to the build path `to` does: the new current and previous targets.

    The build `current` pointed at becomes `previous`; switching to what is already current changes nothing."""
    if current == to:
        return {"changed": False, "current": to, "previous": previous}
    return {"changed": True, "current": to, "previous": current if current else previous}


def replace_symlink(target: str, link: str) -> None:
    """Point `link` at `target` atomically (a new symlink renamed over the old link)."""
    tmp = f"{link}.tmp-{os.getpid()}"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, link)
