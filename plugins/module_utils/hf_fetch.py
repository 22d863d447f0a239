"""Fetch files of a Hugging Face repo with the real huggingface_hub client, verified and resumable across runs.

No Ansible imports (the hf_download module wraps :func:`fetch`; tests/unit/test_hf_fetch.py drives it against
the Hub stand-in). huggingface_hub is imported lazily, after the environment it reads at import time is set, so
this file can be imported where the client is not installed.

What the client does and what is added here (huggingface_hub 2.5.0):

* metadata: ``get_hf_file_metadata`` (HEAD on ``/resolve/<rev>/<file>``) gives the commit, the size and the ETag
  (the sha256 for LFS files); the include globs are matched against ``HfApi.list_repo_files``. Gated, missing
  repo / revision / file and bad token answers come back as the client's typed errors and are turned into a
  message that says which (model_fetch.hub_error_message).
* transfer: the client's ``http_get`` (or ``xet_get`` where the Hub serves the file from Xet and hf_xet is
  installed; if the Xet transfer fails - Xet storage out of reach behind a proxy that lets only the Hub
  through, a mirror without Xet - the same file comes over plain HTTP, which the Hub still serves for Xet
  files, and the result says so: ``transfer`` ``xet`` / ``http`` and ``xet_error``). Only names the
  installed huggingface_hub exports are used (tests/unit/test_hf_fetch.py imports each one).
  ``hf_hub_download`` itself does not resume across processes (its temp file is per process and
  deleted on failure), so the download goes to ``DIR/.NAME.partial`` (with ``.partial.json`` naming the repo,
  commit, size and ETag it belongs to); a later run passes the partial's length as ``resume_size`` and the
  client continues with ``Range: bytes=N-`` on a freshly resolved URL. A partial of another ETag/size is dropped.
* checks: disk space before downloading (sizes from the metadata vs free space plus a margin), then size and
  sha256 of the complete file (the pinned sha256, else the Hub's LFS sha256), atomic rename, sidecar
  (model_files). A mismatch deletes the partial and leaves an installed file untouched.
* a pinned commit's resolved file list is kept in ``DIR/.hf-manifest.json``: when every file is still verified
  (sidecar), a re-run does not contact the Hub at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from urllib.parse import urlsplit

from ansible_collections.llamafleet.mtp.plugins.module_utils.model_fetch import (
    expected_sha256,
    hub_error_message,
    is_commit,
)
from ansible_collections.llamafleet.mtp.plugins.module_utils.model_files import (
    VerifyError,
    adopt,
    apply_owner,
    check_file,
    disk_space_problem,
    partial_path,
    select_files,
    size_or_zero,
)

MANIFEST_NAME = ".hf-manifest.json"
MANIFEST_VERSION = 1


class HubError(Exception):
    """A Hub answer or transfer failure, with a message that says what happened and what to do."""

    def __init__(self, message: str, kind: str = "http", status: int | None = None):
        super().__init__(message)
        self.kind, self.status = kind, status


def setup_environment(endpoint: str | None, xet: bool = True) -> None:
    """Set what huggingface_hub reads at import time (call before the first import)."""
    if endpoint:
        os.environ["HF_ENDPOINT"] = endpoint.rstrip("/")
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ["HF_HUB_DISABLE_IMPLICIT_TOKEN"] = "1"  # only the token given is ever sent
    if not xet:
        os.environ["HF_HUB_DISABLE_XET"] = "1"


def client_version() -> str:
    import huggingface_hub

    return huggingface_hub.__version__


# -- errors ------------------------------------------------------------------------------------------------
def _classify(exc: Exception, *, repo, revision, filename, token, endpoint, available=None) -> HubError:
    import httpx2
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    server = getattr(exc, "server_message", None) or None
    if server:
        server = " ".join(str(server).split())[:300]
    common = {"repo": repo, "revision": revision, "filename": filename, "status": status, "endpoint": endpoint}
    common.update(token_given=bool(token), server_message=server)
    if isinstance(exc, GatedRepoError):
        kind = "gated"
    elif isinstance(exc, RepositoryNotFoundError):
        kind = "repo"
    elif isinstance(exc, RevisionNotFoundError):
        kind = "revision"
    elif isinstance(exc, RemoteEntryNotFoundError):
        kind = "entry"
        common["available"] = available
    elif isinstance(exc, HfHubHTTPError):
        kind = "auth" if status == 401 else "gated" if status == 403 else "http"
    elif isinstance(exc, (httpx2.TransportError, OSError)):
        kind = "network"
        common["server_message"] = f"{type(exc).__name__}: {exc}"
    else:
        raise exc
    return HubError(hub_error_message(kind, **common), kind, status)


# -- manifest ----------------------------------------------------------------------------------------------
def _manifest_key(repo, revision, files, include) -> dict:
    return {"repo": repo, "revision": revision, "files": files, "include": include}


def _load_manifest(dest: str, key: dict) -> dict | None:
    try:
        with open(os.path.join(dest, MANIFEST_NAME), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("version") != MANIFEST_VERSION or data.get("key") != key:
        return None
    return data


def _save_manifest(dest: str, key: dict, commit: str, entries: list[dict], owner, group, mode) -> None:
    data = {
        "version": MANIFEST_VERSION,
        "key": key,
        "commit": commit,
        "files": [{k: e[k] for k in ("name", "size", "sha256", "sha256_origin", "etag")} for e in entries],
    }
    path = os.path.join(dest, MANIFEST_NAME)
    tmp = path + f".{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    apply_owner(tmp, owner, group, mode)
    os.replace(tmp, path)


# -- resolving ---------------------------------------------------------------------------------------------
def _head(repo: str, name: str, revision: str, token, endpoint: str | None):
    """File metadata; a transient failure (network error, timeout, 429/5xx) is retried with backoff and a longer
    timeout, as hf_hub_download does."""
    import httpx2
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import HfHubHTTPError

    url = hf_hub_url(repo, name, revision=revision, endpoint=endpoint)
    try:
        meta = get_hf_file_metadata(url, token=token or False, endpoint=endpoint)
    except Exception as e:
        transient = isinstance(e, (httpx2.TimeoutException, httpx2.NetworkError, httpx2.RemoteProtocolError)) or (
            isinstance(e, HfHubHTTPError) and e.response.status_code in (408, 429, 500, 502, 503, 504)
        )
        if not transient:
            raise
        meta = get_hf_file_metadata(url, token=token or False, endpoint=endpoint, timeout=60, retry_on_errors=True)
    return url, meta


def _list_files(repo: str, revision: str, token, endpoint: str | None) -> list[str]:
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint, token=token or False).list_repo_files(repo, revision=revision)


def _entry(name: str, url: str, meta, pinned_sha: dict, commit_url: str) -> dict:
    etag = meta.etag
    sha, origin = expected_sha256(pinned_sha, name, etag)
    # Download what the HEAD saw: the redirect target (a CDN URL for the blob), else the file at the commit,
    # never a branch URL that may have moved since.
    location = meta.location if meta.location and meta.location != url else commit_url
    return {
        "name": name,
        "size": meta.size,
        "etag": etag,
        "sha256": sha,
        "sha256_origin": origin,
        "url": commit_url,
        "location": location,
        "xet": meta.xet_file_data,
    }


def _commit_url(repo: str, name: str, commit: str, endpoint: str | None) -> str:
    from huggingface_hub import hf_hub_url

    return hf_hub_url(repo, name, revision=commit, endpoint=endpoint)


def resolve(
    repo: str,
    revision: str,
    *,
    files: list[str] | None = None,
    include: list[str] | None = None,
    sha256: dict | None = None,
    token: str | None = None,
    endpoint: str | None = None,
) -> tuple[str, list[dict]]:
    """(commit, entries): every selected file's size, ETag, expected sha256 and download location."""
    sha256 = sha256 or {}
    ctx = {"repo": repo, "revision": revision, "token": token, "endpoint": endpoint}
    names = list(files or [])
    if include:
        try:
            available = _list_files(repo, revision, token, endpoint)
        except Exception as e:  # typed Hub errors -> message; anything else re-raised by _classify
            raise _classify(e, filename=None, **ctx) from None
        names = select_files(available, include)
        if not names:
            ggufs = [f for f in available if f.endswith(".gguf")] or available
            shown = ", ".join(ggufs[:20]) + (f" and {len(ggufs) - 20} more" if len(ggufs) > 20 else "")
            raise HubError(
                f"404 Not Found: no file of {repo} at revision {revision!r} matches include {include}. "
                f"Files there: {shown or 'none'}.",
                "entry",
                404,
            )
    commit = None
    entries = []
    for name in names:
        rev = commit or revision
        try:
            url, meta = _head(repo, name, rev, token, endpoint)
        except Exception as e:
            available = None
            with contextlib.suppress(Exception):
                from huggingface_hub.errors import RemoteEntryNotFoundError

                if isinstance(e, RemoteEntryNotFoundError):
                    available = [f for f in _list_files(repo, rev, token, endpoint) if f.endswith(".gguf")]
            raise _classify(e, filename=name, available=available, **ctx) from None
        if not meta.commit_hash:
            raise HubError(
                f"{endpoint or 'the Hub'} answered for {repo}/{name} without an X-Repo-Commit header: it does not look "
                "like a Hugging Face Hub endpoint; check model_fetch_hf_endpoint.",
                "http",
            )
        commit = commit or meta.commit_hash
        if meta.size is None:
            raise HubError(f"the Hub gave no size for {repo}/{name} at {commit}; cannot check disk space or resume")
        entry = _entry(name, url, meta, sha256, _commit_url(repo, name, commit, endpoint))
        if entry["sha256"] is None:
            raise HubError(
                f"the Hub gives no sha256 for {repo}/{name} (it is not an LFS file: its ETag {meta.etag!r} is a git "
                "hash); pin the file's sha256 in the model's sha256 mapping.",
                "checksum",
            )
        entries.append(entry)
    return commit, entries


# -- downloading -------------------------------------------------------------------------------------------
def _download(entry: dict, part: str, *, repo: str, commit: str, token, rate_limit: int = 0) -> dict:
    """Bring ``part`` to the entry's full size; returns {bytes, resumed_from}. Raises HubError on failure."""
    from huggingface_hub import file_download
    from huggingface_hub.utils import build_hf_headers

    size = entry["size"]
    meta_path = part + ".json"
    ident = {"repo": repo, "commit": commit, "name": entry["name"], "size": size, "etag": entry["etag"]}
    offset = 0
    if os.path.exists(part):
        try:
            with open(meta_path, encoding="utf-8") as f:
                known = json.load(f)
        except (OSError, ValueError):
            known = None
        current = os.path.getsize(part)
        if known == ident and current <= size:
            offset = current
        else:
            os.unlink(part)
    with open(meta_path, "w", encoding="utf-8") as f:
        json.dump(ident, f, sort_keys=True)
    os.chmod(meta_path, 0o600)

    headers = build_hf_headers(token=token or False)
    location = entry["location"]
    if urlsplit(location).netloc != urlsplit(entry["url"]).netloc:
        headers.pop("authorization", None)  # a signed CDN URL: the token stays with the Hub, as the client does
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError

    used_xet = entry.get("xet") is not None and _xet_available()
    xet_error = None
    if used_xet:
        from pathlib import Path

        try:
            # Xet reconstructs the file from content-addressed chunks; chunks already fetched by an interrupted
            # run are reused from the hf_xet chunk cache (HF_XET_CACHE) rather than by a byte offset.
            file_download.xet_get(
                incomplete_path=Path(part),
                xet_file_data=entry["xet"],
                headers=build_hf_headers(token=token or False),
                expected_size=size,
                displayed_filename=entry["name"],
            )
        except KeyboardInterrupt:
            raise
        except Exception as e:  # noqa: BLE001 - any Xet failure: the plain HTTP download below decides
            xet_error = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
            used_xet = False
            if os.path.exists(part) and os.path.getsize(part) != offset:
                os.unlink(part)  # hf_xet wrote into it: not a prefix the HTTP download can continue
                offset = 0
    try:
        if not used_xet and offset < size:
            fd = os.open(part, os.O_WRONLY | os.O_CREAT, 0o600)
            with os.fdopen(fd, "r+b") as f:
                f.seek(offset)
                f.truncate()
                sink = _Throttled(f, rate_limit) if rate_limit > 0 else f
                file_download.http_get(location, sink, resume_size=offset, headers=headers, expected_size=size)
    except HfHubHTTPError as e:
        raise _classify(e, repo=repo, revision=commit, filename=entry["name"], token=token, endpoint=None) from None
    except (httpx2.TransportError, OSError) as e:
        have = size_or_zero(part)
        raise HubError(
            f"download of {repo}/{entry['name']} at {commit[:12]} was interrupted after {have} of {size} bytes "
            f"({type(e).__name__}: {' '.join(str(e).split())[:300]}). The partial file {part} is kept: run again "
            "to resume from there.",
            "interrupted",
        ) from None
    if used_xet:
        return {"bytes": size, "resumed_from": 0, "transfer": "xet"}
    got = {"bytes": size - offset, "resumed_from": offset, "transfer": "http"}
    if xet_error:
        got["xet_error"] = xet_error
    return got


class _Throttled:
    """File wrapper that keeps the average write rate at or below ``rate`` bytes/s (sleeps after writes)."""

    def __init__(self, f, rate: int):
        self._f, self._rate = f, rate
        self._start, self._count = time.monotonic(), 0

    def write(self, data) -> int:
        n = self._f.write(data)
        self._count += len(data)
        ahead = self._count / self._rate - (time.monotonic() - self._start)
        if ahead > 0:
            time.sleep(ahead)
        return n

    def __getattr__(self, name):
        return getattr(self._f, name)


def _xet_available() -> bool:
    """hf_xet importable and Xet not disabled (HF_HUB_DISABLE_XET, set by ``xet: false``)."""
    if os.environ.get("HF_HUB_DISABLE_XET", "").strip().lower() in ("1", "on", "yes", "true"):
        return False
    try:
        import hf_xet  # noqa: F401
    except ImportError:
        return False
    return True


def _makedirs(path: str, owner, group, dir_mode) -> None:
    missing = []
    p = path
    while p and not os.path.isdir(p):
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        os.mkdir(d, dir_mode if dir_mode is not None else 0o755)
        apply_owner(d, owner, group, dir_mode)


def _source(repo: str, commit: str, name: str) -> dict:
    """Where an installed file came from, as its sidecar records it."""
    return {"repo": repo, "commit": commit, "file": name, "origin": f"{repo}@{commit[:12]}"}


def _known_entries(dest: str, key: dict, *, pinned, writes, sha256, token, endpoint, fs) -> tuple:
    """Where the file list of ``key`` (repo, revision, files, include) comes from: a pinned commit's manifest in
    ``dest`` (no Hub contact), else the Hub, the manifest then written. Returns (commit, entries, live: the entries
    resolved this run by name, from_manifest)."""
    manifest = _load_manifest(dest, key) if pinned else None
    live: dict[str, dict] = {}
    if manifest is not None:
        commit, entries = manifest["commit"], [dict(e) for e in manifest["files"]]
        for e in entries:  # the pinned sha256 may have changed since the manifest was written
            e["sha256"], e["sha256_origin"] = expected_sha256(sha256 or {}, e["name"], e["etag"])
    else:
        commit, entries = resolve(
            key["repo"],
            key["revision"],
            files=key["files"],
            include=key["include"],
            sha256=sha256,
            token=token,
            endpoint=endpoint,
        )
        live = {e["name"]: e for e in entries}
        if writes and os.path.isdir(dest):
            _save_manifest(dest, key, commit, entries, **fs)
    return commit, entries, live, manifest is not None


def _only_entries(entries: list[dict], only, repo: str, commit: str) -> list[dict]:
    """Which entries this run handles: all, or those named in ``only`` (each must be one of them, else HubError)."""
    if only is None:
        return entries
    unknown = sorted(set(only) - {e["name"] for e in entries})
    if unknown:
        raise HubError(f"files {unknown} are not part of {repo} at {commit} as selected", "entry", 404)
    return [e for e in entries if e["name"] in only]


def _check_installed(entries: list[dict], dest: str, *, repo, commit, full_verify, writes, fs) -> tuple:
    """Which files are installed and verified (status ok, ownership applied) and which are missing. Returns
    (results, todo: the (entry, result) pairs to download, changed)."""
    results, todo, changed = [], [], False
    for e in entries:
        path = os.path.join(dest, e["name"])
        state = check_file(
            path,
            e["sha256"],
            e["size"],
            full=full_verify,
            write=writes,
            source=_source(repo, commit, e["name"]),
            **fs,
        )
        changed |= state["changed"]
        res = {
            "name": e["name"],
            "path": path,
            "size": e["size"],
            "sha256": e["sha256"],
            "sha256_origin": e["sha256_origin"],
            "status": "ok" if state["status"] == "ok" else "missing",
            "downloaded_bytes": 0,
            "resumed_from": 0,
        }
        if state["status"] == "ok" and writes:
            changed |= apply_owner(path, fs["owner"], fs["group"], fs["mode"])
        results.append(res)
        if res["status"] != "ok":
            todo.append((e, res))
    return results, todo, changed


def _check_disk_space(todo: list, dest: str, margin_bytes: int) -> None:
    """Whether the missing files (less what their partials already hold) fit on the filesystem of ``dest`` (or
    of its nearest existing parent) with the margin to spare; raises HubError "disk" if not."""
    partial_have = {}
    for e, _res in todo:
        part = partial_path(os.path.join(dest, e["name"]))
        partial_have[e["name"]] = size_or_zero(part)
    needed = sum(max(e["size"] - partial_have[e["name"]], 0) for e, _dummy in todo)
    probe = dest if os.path.isdir(dest) else os.path.dirname(dest.rstrip("/")) or "/"
    while not os.path.isdir(probe):
        probe = os.path.dirname(probe) or "/"
    problem = disk_space_problem(needed, shutil.disk_usage(probe).free, margin_bytes, probe)
    if problem:
        raise HubError(problem, "disk")


def _refresh_entry(e: dict, *, repo, commit, dest, sha256, token, endpoint) -> None:
    """Whether an entry from the cached manifest still matches the Hub: fresh metadata (location, auth check)
    updates its download location; a changed ETag or size raises HubError "checksum"."""
    try:
        url, meta = _head(repo, e["name"], commit, token, endpoint)
    except Exception as exc:
        raise _classify(exc, repo=repo, revision=commit, filename=e["name"], token=token, endpoint=endpoint) from None
    fresh = _entry(e["name"], url, meta, sha256 or {}, url)
    if fresh["etag"] != e["etag"] or fresh["size"] != e["size"]:
        raise HubError(
            f"{repo}/{e['name']} at commit {commit} now has ETag {fresh['etag']} and size {fresh['size']}, "
            f"not {e['etag']} / {e['size']} as recorded in {os.path.join(dest, MANIFEST_NAME)}; delete that "
            "file and run again.",
            "checksum",
        )
    e.update(url=fresh["url"], location=fresh["location"], xet=fresh["xet"])


def _install(e: dict, res: dict, *, repo, commit, token, rate_limit, dir_mode, fs) -> int:
    """Download one missing file into its partial, verify and install it, and record the outcome in ``res``;
    returns the bytes that came from upstream."""
    final = res["path"]
    _makedirs(os.path.dirname(final), fs["owner"], fs["group"], dir_mode)
    part = partial_path(final)
    got = _download(e, part, repo=repo, commit=commit, token=token, rate_limit=rate_limit)
    try:
        adopt(
            part,
            final,
            e["sha256"],
            e["size"],
            source=_source(repo, commit, e["name"]),
            cleanup=(part + ".json",),
            **fs,
        )
    except VerifyError as err:
        raise HubError(str(err), "checksum") from None
    res.update(status="downloaded", downloaded_bytes=got["bytes"], resumed_from=got["resumed_from"])
    res["transfer"] = got["transfer"]
    if got.get("xet_error"):
        res["xet_error"] = got["xet_error"]
    return got["bytes"]


def fetch(
    *,
    repo: str,
    revision: str,
    dest: str,
    files: list[str] | None = None,
    include: list[str] | None = None,
    sha256: dict | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    only: list[str] | None = None,
    resolve_only: bool = False,
    check_mode: bool = False,
    full_verify: bool = False,
    rate_limit: int = 0,
    margin_bytes: int = 1024**3,
    owner: str | None = None,
    group: str | None = None,
    mode: int | None = 0o640,
    dir_mode: int | None = 0o750,
) -> dict:
    """Resolve, check, download, verify and install the selected files of a repo under ``dest``.

    Returns commit, pinned, files (name, path, size, sha256, sha256_origin, status ok|downloaded|missing),
    downloaded_bytes (from upstream, this run), hub_contacted, changed.
    """
    if bool(files) == bool(include):
        raise ValueError("give exactly one of files or include")
    key = _manifest_key(repo, revision, files, include)
    pinned = is_commit(revision)
    writes = not check_mode
    fs = {"owner": owner, "group": group, "mode": mode}
    changed = False
    if writes and not os.path.isdir(dest):
        _makedirs(dest, owner, group, dir_mode)
        changed = True

    commit, entries, live, from_manifest = _known_entries(
        dest, key, pinned=pinned, writes=writes, sha256=sha256, token=token, endpoint=endpoint, fs=fs
    )
    entries = _only_entries(entries, only, repo, commit)
    results, todo, files_changed = _check_installed(
        entries, dest, repo=repo, commit=commit, full_verify=full_verify, writes=writes, fs=fs
    )
    out = {
        "commit": commit,
        "revision": revision,
        "pinned": pinned,
        "files": results,
        "downloaded_bytes": 0,
        "hub_contacted": not from_manifest,
        "changed": changed or files_changed,
    }
    if resolve_only or not todo:
        return out

    _check_disk_space(todo, dest, margin_bytes)
    out["changed"] = True
    if check_mode:
        for _e, res in todo:
            res["status"] = "would_download"
        return out

    for e, res in todo:
        if e["name"] not in live:  # from the cached manifest: fresh metadata (location, auth check) first
            _refresh_entry(e, repo=repo, commit=commit, dest=dest, sha256=sha256, token=token, endpoint=endpoint)
            out["hub_contacted"] = True
        out["downloaded_bytes"] += _install(
            e, res, repo=repo, commit=commit, token=token, rate_limit=rate_limit, dir_mode=dir_mode, fs=fs
        )
    return out
