#!/usr/bin/env python3
"""Hugging Face Hub stand-in: a small HTTP server for tests (test-only code).

STAND-IN: the real Hub (huggingface.co) cannot be reached from the test machines, so this server answers the
part of the Hub HTTP contract that downloads use, well enough for the REAL huggingface_hub client (2.5.0) and
llama.cpp's downloader to fetch real files through it (``HF_ENDPOINT=http://127.0.0.1:PORT``,
``HF_HUB_DISABLE_XET=1``). It is not the Hub: no uploads, no datasets/spaces, no Xet, no pagination.

Stdlib only (runs on a bare Debian ``python3``).

Layout served::

    ROOT/<org>/<repo>/<path...>          files (may be large, and may be symlinks; streamed, never read whole)
    ROOT/<org>/<repo>/.standin.json      optional repo config (never served)

``.standin.json`` keys (all optional):
    gated      bool   downloads (/resolve) need an authorized token; metadata (/api) stays public, as on the Hub
    private    bool   everything needs an authorized token; otherwise answered exactly like a missing repo
    token      str    a token authorized for this repo (``tokens``: a list of them)
    revisions  {name: 40-hex}   refs (branch/tag names, or commit shas) -> commit sha. Default: {"main": <sha1
               derived from the file names, sizes and sha256s>}. Any ref name or any commit listed answers; every
               revision serves the same files (the stand-in does not keep history).
    lfs        [glob]  which files are LFS. Default: ``filter=lfs`` lines of the repo's .gitattributes, else the
               Hub's default LFS globs (plus *.gguf); any file >= 10 MiB is LFS in any case.
    xet        bool   the repo's LFS files are Xet-backed, as most large repos on the Hub now are: their HEAD/GET on
               ``resolve/`` also carries the headers the Hub sends for Xet files (huggingface_hub constants.py
               HUGGINGFACE_HEADER_X_XET_HASH / _REFRESH_ROUTE / LINK_XET_AUTH_KEY): ``X-Xet-Hash``,
               ``X-Xet-Refresh-Route`` and ``Link: <route>; rel="xet-auth"``; the plain GET still serves (or
               redirects to) the bytes, as on the Hub. The stand-in has no Xet storage (CAS): the refresh route
               (``/api/models/{org}/{repo}/xet-read-token/{rev}``) answers 501, so an hf_xet transfer fails there.

Tokens: the server knows every token named in any repo config plus ``--token`` ones. As on the Hub, a request
with an unknown ``Authorization: Bearer`` token gets 401 "Invalid credentials in Authorization header" (client:
plain HfHubHTTPError), even for a public repo.

Endpoints (GET unless said):
    HEAD|GET /{org}/{repo}/resolve/{rev}/{path}   the file. X-Repo-Commit, ETag (LFS: "<sha256>", else the
        git blob sha1), LFS files also X-Linked-Etag "<sha256>" and X-Linked-Size; Accept-Ranges; GET honours
        ``Range: bytes=A-``, ``A-B``, ``-N`` (206 + Content-Range; 416 when unsatisfiable). Direct 200 by default
        (the client accepts it); with ``--cdn-host NAME`` LFS files answer 302 to ``http://NAME:PORT/_cdn/...``
        (another origin, as the Hub's CDN is: the client then drops its Authorization header for the GET).
    /api/models/{org}/{repo}[/revision/{rev}]     model info: sha, gated, private, siblings (rfilename; with
        ``?blobs=true`` also size, blobId, lfs{sha256,size,pointerSize}); ``expand=`` filters keys.
    /api/models/{org}/{repo}/tree/{rev}[/{dir}]   tree listing (``recursive=true``), as list_repo_tree wants.

Errors, as the Hub answers them (X-Error-Code / X-Error-Message headers, JSON body {"error": ...}):
    missing or private repo   401 RepoNotFound without a token, 404 RepoNotFound with one -> RepositoryNotFoundError
    gated, no token           401 GatedRepo                                                 -> GatedRepoError
    gated, known token not authorized for the repo   403 GatedRepo                          -> GatedRepoError
    unknown revision          404 RevisionNotFound                                          -> RevisionNotFoundError
    missing file              404 EntryNotFound (with X-Repo-Commit)                        -> RemoteEntryNotFoundError
    bad .standin.json         500 with the reason

Fault injection: ``--drop-after N`` cuts the body of the first full (no Range) GET of each file after N bytes
(Content-Length still announces the whole file, then the connection is closed), once per file per server.
Note for resume tests: huggingface_hub 2.5.0 reads the body in 10 MiB chunks (DOWNLOAD_CHUNK_SIZE) and writes
only whole chunks before a retry, so it resumes with ``Range: bytes=<k*10MiB>-``; a cut below 10 MiB makes it
start over with a plain GET. It also does not resume across processes (its temp file is per process).

Request log (``--log F``): one JSON object per line: t, method, path (raw, with query), range, status,
bytes (body bytes sent), auth (an Authorization header was sent), dropped.

CLI::

    python3 tests/harness/hf_standin.py --root DIR [--host 127.0.0.1] [--port 0] [--port-file F] [--log F]
        [--drop-after N] [--cdn-host localhost] [--token T ...]

Import: ``serve(root, host, port, ...) -> (server, thread)``; ``server.endpoint`` is the base URL,
``server.hub.requests`` the in-memory log; stop with ``server.shutdown(); server.server_close()``.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import hashlib
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

CONFIG_NAME = ".standin.json"
CONFIG_KEYS = {"gated", "private", "token", "tokens", "revisions", "lfs", "xet"}
# The Hub's default .gitattributes LFS globs, plus *.gguf (what GGUF repos add).
DEFAULT_LFS_GLOBS = [
    "*.7z",
    "*.arrow",
    "*.bin",
    "*.bz2",
    "*.ckpt",
    "*.ftz",
    "*.gz",
    "*.h5",
    "*.joblib",
    "*.lfs.*",
    "*.mlmodel",
    "*.model",
    "*.msgpack",
    "*.npy",
    "*.npz",
    "*.onnx",
    "*.ot",
    "*.parquet",
    "*.pb",
    "*.pickle",
    "*.pkl",
    "*.pt",
    "*.pth",
    "*.rar",
    "*.safetensors",
    "saved_model/**/*",
    "*.tar.*",
    "*.tar",
    "*.tflite",
    "*.tgz",
    "*.wasm",
    "*.xz",
    "*.zip",
    "*.zst",
    "*tfevents*",
    "*.gguf",
]
LFS_MIN_SIZE = 10 * 1024 * 1024  # the Hub refuses non-LFS files this large
SHA_RE = re.compile(r"^[0-9a-f]{40}$")
READ_CHUNK = 1024 * 1024
INVALID_CREDENTIALS = "Invalid credentials in Authorization header"


class HubError(Exception):
    """An error answer: HTTP status, X-Error-Code (or None), message, optional commit for X-Repo-Commit."""

    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


class Repo:
    """One repo as seen by one request: its files, config and resolved hashes."""

    def __init__(self, hub: Hub, repo_id: str, path: Path, config: dict):
        self.hub, self.id, self.path, self.config = hub, repo_id, path, config
        self.files = _list_files(path)  # {relpath: Path}
        self.lfs_globs = config.get("lfs") or _gitattributes_lfs(path) or DEFAULT_LFS_GLOBS
        self._refs: dict[str, str] | None = None

    def entry(self, rel: str) -> dict:
        """size, sha256, blob_id (git oid as the Hub lists it), lfs flag, pointer_size."""
        path = self.files[rel]
        size, sha256, git_sha1 = self.hub.hashes(path)
        lfs = size >= LFS_MIN_SIZE or _matches_any(rel, self.lfs_globs)
        if not lfs:
            return {"size": size, "sha256": sha256, "blob_id": git_sha1, "lfs": False, "pointer_size": None}
        pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()
        blob_id = hashlib.sha1(b"blob %d\0" % len(pointer) + pointer).hexdigest()
        return {"size": size, "sha256": sha256, "blob_id": blob_id, "lfs": True, "pointer_size": len(pointer)}

    def refs(self) -> dict[str, str]:
        if self._refs is None:
            configured = self.config.get("revisions")
            if configured:
                self._refs = dict(configured)
            else:
                h = hashlib.sha1(b"hf-standin-commit\n")
                for rel in sorted(self.files):
                    e = self.entry(rel)
                    h.update(f"{rel}\0{e['size']}\0{e['sha256']}\n".encode())
                self._refs = {"main": h.hexdigest()}
        return self._refs

    def resolve(self, revision: str) -> str:
        refs = self.refs()
        if revision in refs:
            return refs[revision]
        if revision in refs.values():
            return revision
        raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")

    def tokens(self) -> set[str]:
        return _config_tokens(self.config)

    def last_modified(self) -> str:
        mtimes = [p.stat().st_mtime for p in self.files.values()] or [self.path.stat().st_mtime]
        return datetime.fromtimestamp(max(mtimes), tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


class Hub:
    """Server state: root, options, sha256 cache, drop-once bookkeeping, request log."""

    def __init__(
        self,
        root: str | Path,
        log: str | Path | None = None,
        drop_after: int | None = None,
        cdn_host: str | None = None,
        tokens: tuple[str, ...] | list[str] = (),
    ):
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise ValueError(f"hf_standin: --root {root!r} is not a directory; create it and put <org>/<repo>/ in it")
        if drop_after is not None and drop_after < 0:
            raise ValueError(f"hf_standin: --drop-after must be >= 0 bytes, got {drop_after}")
        self.log_path = Path(log) if log else None
        self.drop_after = drop_after
        self.cdn_host = cdn_host
        self.extra_tokens = set(tokens)
        self.requests: list[dict] = []
        self.hash_computations = 0  # how many files were actually read to hash them (the cache's misses)
        self._hash_cache: dict[tuple[str, int, int], tuple[str, str]] = {}
        self._hash_lock = threading.Lock()
        self._log_lock = threading.Lock()
        self._in_flight = 0  # requests between their first byte read and their log entry written
        self._idle = threading.Condition()
        self._dropped: set[str] = set()
        self._drop_lock = threading.Lock()
        for cfg_path in sorted(self.root.glob(f"*/*/{CONFIG_NAME}")):  # fail fast on configs present at start
            _load_config(cfg_path.parent, self.root)

    # -- hashing -------------------------------------------------------------------------------------------
    def hashes(self, path: Path) -> tuple[int, str, str]:
        """(size, sha256, git blob sha1) of a file, hashed once per (real path, size, mtime)."""
        st = path.stat()
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
        cached = self._hash_cache.get(key)
        if cached is None:
            with self._hash_lock:
                cached = self._hash_cache.get(key)
                if cached is None:
                    sha256 = hashlib.sha256()
                    git = hashlib.sha1(b"blob %d\0" % st.st_size)
                    with open(path, "rb") as f:
                        while chunk := f.read(READ_CHUNK):
                            sha256.update(chunk)
                            git.update(chunk)
                    cached = (sha256.hexdigest(), git.hexdigest())
                    self._hash_cache[key] = cached
                    self.hash_computations += 1
        return st.st_size, cached[0], cached[1]

    # -- repos and auth ------------------------------------------------------------------------------------
    def known_tokens(self) -> set[str]:
        known = set(self.extra_tokens)
        for cfg_path in self.root.glob(f"*/*/{CONFIG_NAME}"):
            known |= _config_tokens(_load_config(cfg_path.parent, self.root))
        return known

    def repo(self, org: str, name: str, token: str | None, *, download: bool) -> Repo:
        """The repo, or HubError as the Hub answers for missing/private/gated repos."""
        repo_id = f"{org}/{name}"
        path = self.root / org / name
        not_found = HubError(404 if token else 401, "RepoNotFound", "Repository not found")
        if not _safe_segment(org) or not _safe_segment(name) or not path.is_dir():
            raise not_found
        config = _load_config(path, self.root)
        repo = Repo(self, repo_id, path, config)
        authorized = token is not None and token in repo.tokens()
        if config.get("private") and not authorized:
            raise not_found
        if download and config.get("gated") and not authorized:
            if token is None:
                raise HubError(
                    401,
                    "GatedRepo",
                    f"Access to model {repo_id} is restricted. You must have access to it and be authenticated "
                    "to access it. Please log in.",
                )
            raise HubError(
                403,
                "GatedRepo",
                f"Access to model {repo_id} is restricted and you are not in the authorized list. "
                f"Visit the repo page ({repo_id}) to ask for access.",
            )
        return repo

    # -- fault injection and log ---------------------------------------------------------------------------
    def take_drop(self, key: str, size: int) -> int | None:
        """Bytes to send before cutting this full GET, or None (once per file)."""
        if self.drop_after is None or self.drop_after >= size:
            return None
        with self._drop_lock:
            if key in self._dropped:
                return None
            self._dropped.add(key)
        return self.drop_after

    def begin_request(self) -> None:
        with self._idle:
            self._in_flight += 1

    def end_request(self) -> None:
        with self._idle:
            self._in_flight -= 1
            self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every request that started has written its log entry (a client may have its response
        before the handler logs it: a SIGTERM right after must not lose that entry)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout)

    def record(self, entry: dict) -> None:
        with self._log_lock:
            self.requests.append(entry)
            if self.log_path is not None:
                with open(self.log_path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(entry, sort_keys=True) + "\n")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "hf-standin/1"
    timeout = 120  # idle keep-alive connections do not hold a thread forever

    # -- plumbing ------------------------------------------------------------------------------------------
    @property
    def hub(self) -> Hub:
        return self.server.hub  # type: ignore[attr-defined]

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - BaseHTTPRequestHandler's signature
        if os.environ.get("HF_STANDIN_VERBOSE"):
            super().log_message(format, *args)

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch()

    def do_GET(self) -> None:  # noqa: N802
        self._dispatch()

    def do_POST(self) -> None:  # noqa: N802
        self.close_connection = True  # body not read: do not reuse the connection
        self._begin()
        self._send_error(HubError(405, None, "hf_standin: only GET and HEAD are served"))

    do_PUT = do_DELETE = do_POST  # noqa: N815

    def _begin(self) -> None:
        self._status, self._sent, self._dropped = 0, 0, False

    def _dispatch(self) -> None:
        self.hub.begin_request()
        try:
            self._serve_one()
        finally:
            self.hub.end_request()

    def _serve_one(self) -> None:
        self._begin()
        try:
            self._route()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:  # a bug here must show up as a clear 500, not a hung client
            if self._status:  # headers already out: all we can do is hang up
                self.close_connection = True
                print(f"hf_standin: {self.command} {self.path} failed mid-body: {e!r}", file=sys.stderr)
            elif isinstance(e, HubError):
                self._send_error(e)
            else:
                self._send_error(HubError(500, None, f"hf_standin internal error: {type(e).__name__}: {e}"))
        finally:
            self.hub.record(
                {
                    "t": round(time.time(), 3),
                    "method": self.command,
                    "path": self.path,
                    "range": self.headers.get("Range"),
                    "status": self._status,
                    "bytes": self._sent,
                    "auth": self.headers.get("Authorization") is not None,
                    "dropped": self._dropped,
                }
            )

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization")
        if auth is None:
            return None
        scheme, _, token = auth.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or token not in self.hub.known_tokens():
            raise HubError(401, None, INVALID_CREDENTIALS)
        return token

    def _send_head(self, status: int, headers: dict[str, str | int]) -> None:
        self._status = status
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, str(value))
        self.end_headers()

    def _send_bytes(self, status: int, body: bytes, headers: dict[str, str | int]) -> None:
        self._send_head(status, {**headers, "Content-Length": len(body)})
        if self.command != "HEAD":
            self.wfile.write(body)
            self._sent = len(body)

    def _send_json(self, obj, headers: dict[str, str | int] | None = None) -> None:
        body = json.dumps(obj).encode()
        self._send_bytes(200, body, {"Content-Type": "application/json; charset=utf-8", **(headers or {})})

    def _send_error(self, e: HubError) -> None:
        headers: dict[str, str | int] = {"Content-Type": "application/json; charset=utf-8"}
        if e.code:
            headers["X-Error-Code"] = e.code
        headers["X-Error-Message"] = e.message
        if e.commit:
            headers["X-Repo-Commit"] = e.commit
        if e.status >= 500:
            print(f"hf_standin: {e.status} {self.command} {self.path}: {e.message}", file=sys.stderr)
        try:
            self._send_bytes(e.status, json.dumps({"error": e.message}).encode(), headers)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # -- routes --------------------------------------------------------------------------------------------
    def _route(self) -> None:
        split = urlsplit(self.path)
        segs = [unquote(s) for s in split.path.split("/")[1:]]
        query = parse_qs(split.query)
        if len(segs) >= 3 and segs[0] == "api" and segs[1] == "models":
            token = self._token()
            if len(segs) == 4:
                return self._model_info(segs[2], segs[3], None, token, query)
            if len(segs) == 6 and segs[4] == "revision":
                return self._model_info(segs[2], segs[3], segs[5], token, query)
            if len(segs) >= 6 and segs[4] == "tree":
                return self._tree(segs[2], segs[3], segs[5], "/".join(segs[6:]), token, query)
            if len(segs) == 6 and segs[4] == "xet-read-token":
                self.hub.repo(segs[2], segs[3], token, download=True)  # the same auth answers as a download
                raise HubError(501, None, "hf_standin: no Xet storage (CAS) here; download over plain HTTP")
        elif len(segs) >= 5 and segs[2] == "resolve":
            return self._resolve(segs[0], segs[1], segs[3], "/".join(segs[4:]), self._token())
        elif len(segs) >= 5 and segs[0] == "_cdn" and self.hub.cdn_host:
            return self._cdn(segs[1], segs[2], segs[3], "/".join(segs[4:]))
        raise HubError(404, None, f"hf_standin: no such endpoint: {split.path}")

    def _model_info(self, org: str, name: str, revision: str | None, token: str | None, query: dict) -> None:
        repo = self.hub.repo(org, name, token, download=False)
        commit = repo.resolve(revision or "main")
        blobs = _truthy(query.get("blobs"))
        siblings = []
        for rel in sorted(repo.files):
            sibling: dict = {"rfilename": rel}
            if blobs:
                e = repo.entry(rel)
                sibling.update(size=e["size"], blobId=e["blob_id"])
                if e["lfs"]:
                    sibling["lfs"] = {"sha256": e["sha256"], "size": e["size"], "pointerSize": e["pointer_size"]}
            siblings.append(sibling)
        gated = repo.config.get("gated")
        info = {
            "_id": hashlib.sha1(repo.id.encode()).hexdigest()[:24],
            "id": repo.id,
            "modelId": repo.id,
            "author": org,
            "sha": commit,
            "lastModified": repo.last_modified(),
            "createdAt": repo.last_modified(),
            "private": bool(repo.config.get("private")),
            "gated": "manual" if gated else False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": ["gguf"] if any(r.endswith(".gguf") for r in repo.files) else [],
            "siblings": siblings,
        }
        expand = [v for vals in query.get("expand", []) for v in vals.split(",")]
        if expand:
            info = {k: v for k, v in info.items() if k in {"_id", "id", *expand}}
        self._send_json(info, {"X-Repo-Commit": commit})

    def _tree(self, org: str, name: str, revision: str, under: str, token: str | None, query: dict) -> None:
        repo = self.hub.repo(org, name, token, download=False)
        commit = repo.resolve(revision)
        under = under.strip("/")
        prefix = f"{under}/" if under else ""
        dirs: set[str] = set()
        for rel in repo.files:
            parts = rel.split("/")
            dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
        if under and under not in dirs:
            raise HubError(404, "EntryNotFound", f"{under} does not exist on {revision}", commit)
        recursive = _truthy(query.get("recursive"))
        out = []
        for path in sorted(dirs | set(repo.files)):
            if not path.startswith(prefix) or (not recursive and "/" in path[len(prefix) :]):
                continue
            if path in dirs:
                listing = "\n".join(p for p in sorted(repo.files) if p.startswith(path + "/"))
                out.append(
                    {"type": "directory", "oid": hashlib.sha1(listing.encode()).hexdigest(), "size": 0, "path": path}
                )
                continue
            e = repo.entry(path)
            item: dict = {"type": "file", "oid": e["blob_id"], "size": e["size"], "path": path}
            if e["lfs"]:
                item["lfs"] = {"oid": e["sha256"], "size": e["size"], "pointerSize": e["pointer_size"]}
            out.append(item)
        self._send_json(out)

    def _resolve(self, org: str, name: str, revision: str, rel: str, token: str | None) -> None:
        repo = self.hub.repo(org, name, token, download=True)
        commit = repo.resolve(revision)
        if rel not in repo.files:
            raise HubError(404, "EntryNotFound", "Entry not found", commit)
        e = repo.entry(rel)
        headers: dict[str, str | int] = {"X-Repo-Commit": commit}
        if e["lfs"]:
            headers.update(
                {"ETag": f'"{e["sha256"]}"', "X-Linked-Etag": f'"{e["sha256"]}"', "X-Linked-Size": e["size"]}
            )
        else:
            headers["ETag"] = f'"{e["blob_id"]}"'
        if e["lfs"] and repo.config.get("xet"):
            route = f"{self.server.endpoint}/api/models/{quote(org)}/{quote(name)}/xet-read-token/{commit}"
            headers["X-Xet-Hash"] = hashlib.sha256(b"xet-merkle:" + e["sha256"].encode()).hexdigest()
            headers["X-Xet-Refresh-Route"] = route
            headers["Link"] = f'<{route}>; rel="xet-auth"'
        if e["lfs"] and self.hub.cdn_host:
            port = self.server.server_address[1]
            location = f"http://{self.hub.cdn_host}:{port}/_cdn/{quote(org)}/{quote(name)}/{commit}/{quote(rel)}"
            body = f"Found. Redirecting to {location}".encode()
            return self._send_bytes(302, body, {**headers, "Location": location, "Content-Type": "text/plain"})
        self._send_file(repo, rel, e, headers)

    def _cdn(self, org: str, name: str, commit: str, rel: str) -> None:
        """The 'CDN' origin LFS downloads are redirected to (signed URL on the Hub: no auth checked)."""
        path = self.hub.root / org / name
        if not _safe_segment(org) or not _safe_segment(name) or not path.is_dir():
            raise HubError(404, None, "NoSuchKey")
        repo = Repo(self.hub, f"{org}/{name}", path, _load_config(path, self.hub.root))
        if commit not in repo.refs().values() or rel not in repo.files:
            raise HubError(404, None, "NoSuchKey")
        e = repo.entry(rel)
        self._send_file(repo, rel, e, {"ETag": f'"{e["sha256"]}"'})

    def _send_file(self, repo: Repo, rel: str, e: dict, headers: dict[str, str | int]) -> None:
        size = e["size"]
        headers = {
            **headers,
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
            "Content-Disposition": f'attachment; filename="{rel.rsplit("/", 1)[-1]}"',
        }
        start, end = 0, size - 1
        status = 200
        if self.command == "GET" and (rng := self.headers.get("Range")) is not None:
            parsed = _parse_range(rng, size)
            if parsed == "unsatisfiable":
                return self._send_bytes(416, b"", {**headers, "Content-Range": f"bytes */{size}"})
            if parsed is not None:
                start, end = parsed
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        length = end - start + 1 if size else 0
        self._send_head(status, {**headers, "Content-Length": length})
        if self.command == "HEAD":
            return
        limit = length
        if status == 200 and (cut := self.hub.take_drop(f"{repo.id}/{rel}", size)) is not None:
            limit, self._dropped = cut, True
        with open(repo.files[rel], "rb") as f:
            f.seek(start)
            while self._sent < limit:
                chunk = f.read(min(READ_CHUNK, limit - self._sent))
                if not chunk:
                    break
                self.wfile.write(chunk)
                self._sent += len(chunk)
        if self._dropped:  # announce the whole file, send part of it, hang up
            self.wfile.flush()
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)


# -- helpers ---------------------------------------------------------------------------------------------------
def _safe_segment(s: str) -> bool:
    return bool(s) and s not in (".", "..") and "/" not in s and "\\" not in s and not s.startswith(".")


def _truthy(values: list[str] | None) -> bool:
    return bool(values) and values[-1].lower() in ("1", "true", "yes")


def _list_files(repo_path: Path) -> dict[str, Path]:
    """Repo files by posix relative path; skips .git/ and the stand-in config. Symlinked files are followed."""
    files = {}
    for dirpath, dirnames, filenames in os.walk(repo_path):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for fn in filenames:
            full = Path(dirpath) / fn
            rel = full.relative_to(repo_path).as_posix()
            if rel == CONFIG_NAME or not full.is_file():
                continue
            files[rel] = full
    return files


def _gitattributes_lfs(repo_path: Path) -> list[str]:
    ga = repo_path / ".gitattributes"
    if not ga.is_file():
        return []
    globs = []
    for line in ga.read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.split()
        if len(parts) >= 2 and not parts[0].startswith("#") and "filter=lfs" in parts[1:]:
            globs.append(parts[0])
    return globs


def _matches_any(rel: str, globs) -> bool:
    base = rel.rsplit("/", 1)[-1]
    for g in globs:
        if "/" in g.strip("/"):
            if fnmatch.fnmatchcase(rel, g.lstrip("/").replace("**/", "*")):
                return True
        elif fnmatch.fnmatchcase(base, g.strip("/")):
            return True
    return False


def _parse_range(value: str, size: int):
    """(start, end) inclusive, None to ignore the header (multi-range, junk), or 'unsatisfiable'."""
    m = re.fullmatch(r"\s*bytes=(\d*)-(\d*)\s*", value)
    if not m or (not m.group(1) and not m.group(2)):
        return None
    if not m.group(1):  # suffix: last N bytes
        n = int(m.group(2))
        if n == 0 or size == 0:
            return "unsatisfiable"
        return max(size - n, 0), size - 1
    start = int(m.group(1))
    end = int(m.group(2)) if m.group(2) else size - 1
    if start >= size or end < start:
        return "unsatisfiable"
    return start, min(end, size - 1)


def _config_tokens(config: dict) -> set[str]:
    tokens = set(config.get("tokens") or [])
    if config.get("token"):
        tokens.add(config["token"])
    return tokens


def _load_config(repo_path: Path, root: Path) -> dict:
    cfg_path = repo_path / CONFIG_NAME
    if not cfg_path.is_file():
        return {}
    where = cfg_path.relative_to(root).as_posix()

    def bad(msg: str) -> HubError:
        return HubError(500, None, f"hf_standin: bad {where}: {msg}")

    try:
        config = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise bad(f"not readable JSON ({e})") from None
    if not isinstance(config, dict):
        raise bad("must be a JSON object")
    unknown = set(config) - CONFIG_KEYS
    if unknown:
        raise bad(f"unknown keys {sorted(unknown)}; allowed: {sorted(CONFIG_KEYS)}")
    for key in ("gated", "private", "xet"):
        if key in config and not isinstance(config[key], bool):
            raise bad(f"{key!r} must be true or false")
    if "token" in config and not (isinstance(config["token"], str) and config["token"].strip()):
        raise bad("'token' must be a non-empty string")
    for key in ("tokens", "lfs"):
        if key in config and not (
            isinstance(config[key], list) and all(isinstance(t, str) and t.strip() for t in config[key])
        ):
            raise bad(f"{key!r} must be a list of non-empty strings")
    revs = config.get("revisions")
    if revs is not None:
        if not isinstance(revs, dict) or not revs:
            raise bad("'revisions' must be a non-empty object {ref name: 40-hex commit sha}")
        for name, sha in revs.items():
            if not isinstance(sha, str) or not SHA_RE.match(sha):
                raise bad(f"revision {name!r} -> {sha!r}: the commit must be 40 lowercase hex digits")
    return config


class StandinServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, hub: Hub):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)
        self.hub = hub
        host = address[0] if ":" not in address[0] else f"[{address[0]}]"
        self.endpoint = f"http://{host}:{self.server_address[1]}"


def serve(
    root: str | Path,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    log: str | Path | None = None,
    drop_after: int | None = None,
    cdn_host: str | None = None,
    tokens: tuple[str, ...] | list[str] = (),
) -> tuple[StandinServer, threading.Thread]:
    """Start the stand-in in a daemon thread. Returns (server, thread); server.endpoint is the base URL."""
    hub = Hub(root, log=log, drop_after=drop_after, cdn_host=cdn_host, tokens=tokens)
    server = StandinServer((host, port), hub)
    thread = threading.Thread(target=server.serve_forever, name="hf-standin", daemon=True)
    thread.start()
    return server, thread


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Hugging Face Hub stand-in for tests (serves ROOT/<org>/<repo>/...).")
    ap.add_argument("--root", required=True, help="directory holding <org>/<repo>/ trees")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0 = pick a free port (see --port-file)")
    ap.add_argument("--port-file", help="write the bound port here once listening")
    ap.add_argument("--log", help="append one JSON line per request to this file")
    ap.add_argument("--drop-after", type=int, help="cut the first full GET of each file after this many bytes")
    ap.add_argument("--cdn-host", help="302 LFS downloads to http://CDN_HOST:PORT/_cdn/... (e.g. localhost)")
    ap.add_argument("--token", action="append", default=[], help="a valid token authorized for no gated repo")
    args = ap.parse_args(argv)
    try:
        hub = Hub(args.root, log=args.log, drop_after=args.drop_after, cdn_host=args.cdn_host, tokens=args.token)
        server = StandinServer((args.host, args.port), hub)
    except (ValueError, OSError) as e:
        print(f"hf_standin: cannot start: {e}", file=sys.stderr)
        return 2
    except HubError as e:
        print(f"hf_standin: cannot start: {e.message}", file=sys.stderr)
        return 2
    if args.port_file:
        tmp = f"{args.port_file}.tmp"
        Path(tmp).write_text(f"{server.server_address[1]}\n", encoding="utf-8")
        os.replace(tmp, args.port_file)
    print(f"hf_standin: serving {hub.root} at {server.endpoint}", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        hub.wait_idle(timeout=10)
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
