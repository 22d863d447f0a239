"""Verified model files on disk: sha256, the `.verified.json` sidecar, atomic adoption of a temp file.

No Ansible imports (used by the modules hf_download and model_verify, and unit-tested directly).
Standard library only, Python >= 3.9 (the hosts' system python runs model_verify).

Layout for a model file ``DIR/NAME``:

* ``DIR/NAME.verified.json``  sidecar: sha256, size and mtime_ns of NAME as verified, plus where it came from.
  As long as NAME's size and mtime_ns equal the sidecar's, NAME is taken as verified without reading it again
  (re-hashing a 16 GB model on every run is what the sidecar avoids); ``mode="full"`` always re-hashes.
* ``DIR/.NAME.partial`` (+ ``.json``)  a download in progress (hf_download; kept across runs to resume).
* ``DIR/.NAME.incoming``  a complete file that arrived by copy / get_url and is not verified yet.

A temp file becomes NAME only through :func:`adopt`: size and sha256 checked, owner/mode set, then
``os.replace`` (atomic on one filesystem). On a mismatch the temp file is deleted and NAME is left as it was.
"""

from __future__ import annotations

import contextlib
import fnmatch
import grp
import hashlib
import json
import os
import pwd
import re
import time

SIDECAR_SUFFIX = ".verified.json"
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
SPLIT_RE = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
HASH_CHUNK = 8 * 1024 * 1024
SIDECAR_VERSION = 1


class VerifyError(Exception):
    """A file failed verification (or could not be adopted); the message says what and what to do."""


# -- names ------------------------------------------------------------------------------------------------
def sidecar_path(path: str) -> str:
    return path + SIDECAR_SUFFIX


def hidden_sibling(path: str, suffix: str) -> str:
    """DIR/.NAME<suffix> for DIR/NAME (temp names stay in the same directory, so renames are atomic)."""
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}{suffix}")


def partial_path(path: str) -> str:
    return hidden_sibling(path, ".partial")


def incoming_path(path: str) -> str:
    return hidden_sibling(path, ".incoming")


def check_file_name(name: str) -> str | None:
    """Why a repo-relative file name cannot be stored under a model directory, or None if it can."""
    if not name or name.startswith("/") or "\\" in name:
        return f"{name!r} must be a relative path with '/' separators"
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return f"{name!r} must not contain empty, '.' or '..' segments"
    if any(p.startswith(".") for p in parts):
        return f"{name!r}: names starting with '.' are reserved for temp files and sidecars"
    if name.endswith(SIDECAR_SUFFIX):
        return f"{name!r}: names ending in {SIDECAR_SUFFIX} are reserved for sidecars"
    return None


# -- hashing and sidecars ------------------------------------------------------------------------------------
def sha256_file(path: str, chunk: int = HASH_CHUNK) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def read_sidecar(path: str, sidecar: str | None = None) -> dict | None:
    """The sidecar of path (a dict), or None when missing or unreadable (it is then simply rewritten).
    ``sidecar`` overrides where it lives (for files the role must not write beside, e.g. on the controller)."""
    try:
        with open(sidecar or sidecar_path(path), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not SHA256_RE.match(str(data.get("sha256", ""))):
        return None
    return data


def sidecar_matches(
    sidecar: dict | None, st: os.stat_result, expected_sha256: str | None = None, expected_size: int | None = None
) -> bool:
    """True when the sidecar vouches for the file as it is now (same size and mtime) and for what is expected."""
    if not sidecar:
        return False
    if sidecar.get("size") != st.st_size or sidecar.get("mtime_ns") != st.st_mtime_ns:
        return False
    if expected_size is not None and st.st_size != expected_size:
        return False
    return not (expected_sha256 and sidecar.get("sha256") != expected_sha256)


def write_sidecar(
    path: str,
    sha256: str,
    source: dict | None = None,
    owner: str | None = None,
    group: str | None = None,
    mode: int | None = None,
    sidecar: str | None = None,
) -> dict:
    """Record path as verified (its current size and mtime). Written to a temp name, then renamed."""
    st = os.stat(path)
    data = {
        "version": SIDECAR_VERSION,
        "sha256": sha256,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "verified_at": int(time.time()),
        "source": source or {},
    }
    target = sidecar or sidecar_path(path)
    tmp = hidden_sibling(target, f".{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, sort_keys=True, indent=1)
        f.write("\n")
    try:
        apply_owner(tmp, owner, group, mode)
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return data


# -- ownership ---------------------------------------------------------------------------------------------
def _uid(owner: str | None) -> int:
    if owner is None or owner == "":
        return -1
    if str(owner).isdigit():
        return int(owner)
    try:
        return pwd.getpwnam(owner).pw_uid
    except KeyError:
        raise VerifyError(f"user {owner!r} does not exist on this host; create it or set another owner") from None


def _gid(group: str | None) -> int:
    if group is None or group == "":
        return -1
    if str(group).isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise VerifyError(f"group {group!r} does not exist on this host; create it or set another group") from None


def apply_owner(path: str, owner: str | None, group: str | None, mode: int | None) -> bool:
    """chown/chmod path where it differs; returns whether anything changed."""
    st = os.stat(path)
    changed = False
    uid, gid = _uid(owner), _gid(group)
    if (uid != -1 and st.st_uid != uid) or (gid != -1 and st.st_gid != gid):
        os.chown(path, uid, gid)
        changed = True
    if mode is not None and (st.st_mode & 0o7777) != mode:
        os.chmod(path, mode)
        changed = True
    return changed


# -- checking and adopting ---------------------------------------------------------------------------------
def check_file(
    path: str,
    expected_sha256: str | None = None,
    expected_size: int | None = None,
    *,
    full: bool = False,
    write: bool = True,
    source: dict | None = None,
    owner: str | None = None,
    group: str | None = None,
    mode: int | None = None,
    sidecar: str | None = None,
) -> dict:
    """State of an installed file, hashing it only when the sidecar cannot vouch for it (or ``full``).

    status: ``ok`` (verified, sidecar written when it was missing or stale and ``write``), ``missing``,
    or ``stale`` (present but not what is expected: other size or sha256; the file is NOT touched here).
    """
    result = {"path": path, "status": "missing", "sha256": None, "size": None, "hashed": False, "changed": False}
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return result
    result["size"] = st.st_size
    if expected_size is not None and st.st_size != expected_size:
        result["status"] = "stale"
        result["reason"] = f"size {st.st_size} != expected {expected_size}"
        return result
    known = read_sidecar(path, sidecar)
    if not full and sidecar_matches(known, st, expected_sha256, expected_size):
        result.update(status="ok", sha256=known["sha256"])
        return result
    if not full and known and known.get("size") == st.st_size and known.get("mtime_ns") == st.st_mtime_ns:
        # The sidecar vouches for the file, but for other content than expected: no need to hash.
        result.update(status="stale", sha256=known["sha256"], reason="sha256 differs from the expected one")
        return result
    digest = sha256_file(path)
    result.update(sha256=digest, hashed=True)
    if expected_sha256 and digest != expected_sha256:
        result.update(status="stale", reason=f"sha256 {digest} != expected {expected_sha256}")
        return result
    result["status"] = "ok"
    if write and not sidecar_matches(known, st, digest):
        write_sidecar(path, digest, source, owner, group, mode, sidecar)
        result["changed"] = True
    return result


def mismatch_message(what: str, final: str, expected: str, actual: str, origin: str | None = None) -> str:
    kept = f"{final} was left untouched" if os.path.exists(final) else f"nothing was installed at {final}"
    src = f" from {origin}" if origin else ""
    return (
        f"sha256 mismatch for {what}{src}: expected {expected}, got {actual}. The download was deleted and {kept}. "
        "Check the sha256 you pinned (or the mirror serving the file), then run again."
    )


def adopt(
    incoming: str,
    final: str,
    expected_sha256: str | None = None,
    expected_size: int | None = None,
    *,
    sha256: str | None = None,
    source: dict | None = None,
    owner: str | None = None,
    group: str | None = None,
    mode: int | None = None,
    cleanup: tuple[str, ...] = (),
) -> dict:
    """Verify a complete temp file and move it to ``final`` atomically, then write the sidecar.

    ``sha256`` is the digest when the caller already computed it while writing. On a size or sha256 mismatch
    the temp file (and ``cleanup`` paths) are deleted, ``final`` is left as it was, and VerifyError is raised.
    """
    origin = (source or {}).get("origin")
    name = os.path.basename(final)
    size = os.path.getsize(incoming)
    if expected_size is not None and size != expected_size:
        _remove(incoming, *cleanup)
        kept = f"{final} was left untouched" if os.path.exists(final) else f"nothing was installed at {final}"
        raise VerifyError(
            f"size mismatch for {name}{' from ' + origin if origin else ''}: expected {expected_size} bytes, "
            f"got {size}. The download was deleted and {kept}. Run again (the source may have changed)."
        )
    digest = sha256 or sha256_file(incoming)
    if expected_sha256 and digest != expected_sha256:
        _remove(incoming, *cleanup)
        raise VerifyError(mismatch_message(name, final, expected_sha256, digest, origin))
    apply_owner(incoming, owner, group, mode)
    os.replace(incoming, final)
    _fsync_dir(os.path.dirname(final) or ".")
    _remove(*cleanup)
    write_sidecar(final, digest, source, owner, group, mode)
    return {"path": final, "status": "adopted", "sha256": digest, "size": size, "hashed": sha256 is None}


def _remove(*paths: str) -> None:
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)


def fsync_path(path: str) -> None:
    """Flush a file's (or a directory's) data to its disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: str) -> None:
    with contextlib.suppress(OSError):
        fsync_path(path)


def size_or_zero(path: str) -> int:
    """A file's size, 0 when it is not there (yet)."""
    return os.path.getsize(path) if os.path.exists(path) else 0


# -- planning helpers --------------------------------------------------------------------------------------
def disk_space_problem(needed: int, free: int, margin: int, where: str) -> str | None:
    """Why a download of ``needed`` bytes does not fit in ``free`` with ``margin`` to spare, or None."""
    if needed <= 0 or needed + margin <= free:
        return None
    gib = 1024**3
    return (
        f"not enough disk space in {where}: the download needs {needed / gib:.2f} GiB plus a margin of "
        f"{margin / gib:.2f} GiB, but only {free / gib:.2f} GiB is free. Free some space, point the models "
        "directory at a larger filesystem, or lower the free-space margin."
    )


def gguf_heads(names: list[str]) -> list[str]:
    """The GGUF files llama.cpp is given: single .gguf files and the first part of each split set, sorted,
    with the main model before projector files (mmproj*)."""
    heads = []
    for n in names:
        base = n.rsplit("/", 1)[-1]
        if not base.endswith(".gguf"):
            continue
        m = SPLIT_RE.match(base)
        if m and int(m.group("no")) != 1:
            continue
        heads.append(n)
    return sorted(heads, key=lambda n: (n.rsplit("/", 1)[-1].lower().startswith("mmproj"), n))


def select_files(available: list[str], include: list[str]) -> list[str]:
    """Repo files matching any of the include globs (fnmatch on the whole repo-relative path), sorted."""
    return sorted(f for f in available if any(fnmatch.fnmatchcase(f, g) for g in include))
