"""The Hugging Face Hub stand-in (tests/harness/hf_standin.py) against the REAL huggingface_hub client.

The client runs in a subprocess (it reads HF_ENDPOINT, HF_HOME, HF_HUB_DISABLE_XET... at import time) with an
isolated HF_HOME and no token or proxy from the outer environment; the server runs in-process on a free port and
serves small files written to tmp_path. Expected hashes are computed here with hashlib from the bytes written.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.harness import hf_standin

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "harness" / "hf_standin.py"
MIB = 1024 * 1024
CLIENT_CHUNK = 10 * MIB  # huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE (checked in test_resume...)
GOOD_TOKEN = "hf_standin_good_token_0001"
OTHER_TOKEN = "hf_standin_other_token_0002"

# Runs a list of client operations in one process; prints one JSON result per operation.
CLIENT = r"""
import json, os, sys
from pathlib import Path
from huggingface_hub import HfApi, constants, get_hf_file_metadata, hf_hub_download, hf_hub_url, snapshot_download

results = []
for op, kw in json.loads(sys.argv[1]):
    try:
        if op == "download":
            out = {"path": hf_hub_download(**kw)}
        elif op == "metadata":
            m = get_hf_file_metadata(hf_hub_url(kw["repo_id"], kw["filename"], revision=kw.get("revision")),
                                     token=kw.get("token"))
            out = {"commit_hash": m.commit_hash, "etag": m.etag, "size": m.size, "location": m.location}
        elif op == "snapshot":
            root = Path(snapshot_download(**kw))
            out = {"files": sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                                   if p.is_file() and ".cache" not in p.parts)}
        elif op == "model_info":
            info = HfApi().model_info(**kw)
            out = {"sha": info.sha, "gated": info.gated, "siblings": [
                {"rfilename": s.rfilename, "size": s.size, "blob_id": s.blob_id,
                 "lfs": None if s.lfs is None else {"sha256": s.lfs.sha256, "size": s.lfs.size}}
                for s in info.siblings]}
        elif op == "list_files":
            out = {"files": HfApi().list_repo_files(**kw)}
        elif op == "chunk_size":
            out = {"value": constants.DOWNLOAD_CHUNK_SIZE}
        else:
            raise SystemExit(f"unknown op {op}")
        results.append({"ok": True, **out})
    except Exception as e:
        response = getattr(e, "response", None)
        results.append({"ok": False, "type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__],
                        "status": getattr(response, "status_code", None), "message": str(e)})
print(json.dumps(results))
"""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def write_repo(root: Path, repo_id: str, files: dict[str, bytes], config: dict | None = None) -> Path:
    repo = root / repo_id
    for rel, data in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_bytes(data)
    if config is not None:
        (repo / ".standin.json").write_text(json.dumps(config))
    return repo


class Standin:
    """One server on a free port over tmp_path/root, plus a way to run the real client against it."""

    def __init__(self, tmp_path: Path, **options):
        self.tmp = tmp_path
        self.root = tmp_path / "root"
        self.root.mkdir(exist_ok=True)
        self.log = tmp_path / f"requests-{len(list(tmp_path.glob('requests-*')))}.jsonl"
        self.options = options
        self.server = None

    def start(self) -> Standin:
        self.server, _ = hf_standin.serve(self.root, "127.0.0.1", 0, log=self.log, **self.options)
        self.endpoint = self.server.endpoint
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def records(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def client(self, *ops: tuple[str, dict]) -> list[dict]:
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith(("HF_", "HUGGING", "HTTP", "ALL_PROXY"))}
        env.update(
            HF_ENDPOINT=self.endpoint,
            HF_HOME=str(self.tmp / "hf_home"),
            HF_HUB_DISABLE_XET="1",
            HF_HUB_DISABLE_TELEMETRY="1",
            HF_HUB_DISABLE_PROGRESS_BARS="1",
            NO_PROXY="127.0.0.1,localhost",
        )
        proc = subprocess.run(
            [sys.executable, "-c", CLIENT, json.dumps(ops)],
            env=env,
            cwd=self.tmp,
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert proc.returncode == 0, proc.stderr
        results = json.loads(proc.stdout.strip().splitlines()[-1])
        assert len(results) == len(ops)
        return results


@pytest.fixture
def standin(tmp_path):
    servers = []

    def make(**options) -> Standin:
        s = Standin(tmp_path, **options)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()


def ok(result: dict) -> dict:
    assert result["ok"], f"{result['type']}: {result['message']}"
    return result


def failed(result: dict, exc_type: str, status: int | None) -> dict:
    assert not result["ok"], f"expected {exc_type}, the client succeeded: {result}"
    assert (result["type"], result["status"]) == (exc_type, status), result
    return result


def downloads(records: list[dict], name: str) -> list[dict]:
    return [r for r in records if r["method"] == "GET" and r["path"].split("?")[0].endswith("/" + name)]


# -- happy paths -----------------------------------------------------------------------------------------------
def test_download_to_local_dir_matches_bytes_and_hub_metadata(standin, tmp_path):
    gguf, readme = os.urandom(300_000), b"# tiny\n"
    write_repo(tmp_path / "root", "org/tiny", {"model-Q4_K_M.gguf": gguf, "README.md": readme})
    s = standin().start()
    local = tmp_path / "local"
    meta, meta_readme, dl, dl_readme, info = s.client(
        ("metadata", {"repo_id": "org/tiny", "filename": "model-Q4_K_M.gguf"}),
        ("metadata", {"repo_id": "org/tiny", "filename": "README.md"}),
        ("download", {"repo_id": "org/tiny", "filename": "model-Q4_K_M.gguf", "local_dir": str(local)}),
        ("download", {"repo_id": "org/tiny", "filename": "README.md", "local_dir": str(local)}),
        ("model_info", {"repo_id": "org/tiny"}),
    )
    assert Path(ok(dl)["path"]) == local / "model-Q4_K_M.gguf"
    assert (local / "model-Q4_K_M.gguf").read_bytes() == gguf
    assert Path(ok(dl_readme)["path"]).read_bytes() == readme
    commit = ok(info)["sha"]
    assert len(commit) == 40 and int(commit, 16) >= 0
    # LFS file: etag is the sha256, size the linked size; git file: etag is the git blob sha1.
    assert ok(meta) | {"location": None} == {
        "ok": True,
        "commit_hash": commit,
        "etag": sha256(gguf),
        "size": len(gguf),
        "location": None,
    }
    assert meta["location"] == f"{s.endpoint}/org/tiny/resolve/main/model-Q4_K_M.gguf"
    assert (ok(meta_readme)["etag"], meta_readme["size"]) == (git_blob_sha1(readme), len(readme))
    # The client's local_dir bookkeeping recorded what the stand-in said.
    lines = (local / ".cache/huggingface/download/model-Q4_K_M.gguf.metadata").read_text().splitlines()
    assert lines[:2] == [commit, sha256(gguf)]
    # One body transfer per file, no Range.
    assert [(r["status"], r["bytes"], r["range"]) for r in downloads(s.records(), "model-Q4_K_M.gguf")] == [
        (200, len(gguf), None)
    ]


def test_download_by_commit_sha_and_configured_refs(standin, tmp_path):
    data = os.urandom(4096)
    commit, tag_commit = "a" * 40, "b" * 40
    write_repo(
        tmp_path / "root",
        "org/pinned",
        {"m.gguf": data},
        {"revisions": {"main": commit, "v1.0": tag_commit}},
    )
    write_repo(tmp_path / "root", "org/derived", {"m.gguf": data})
    s = standin().start()
    by_main, by_sha, by_tag, by_tag_sha, derived, derived_main = s.client(
        ("metadata", {"repo_id": "org/pinned", "filename": "m.gguf"}),
        ("download", {"repo_id": "org/pinned", "filename": "m.gguf", "revision": commit, "local_dir": "d1"}),
        ("metadata", {"repo_id": "org/pinned", "filename": "m.gguf", "revision": "v1.0"}),
        ("metadata", {"repo_id": "org/pinned", "filename": "m.gguf", "revision": tag_commit}),
        ("model_info", {"repo_id": "org/derived"}),
        ("download", {"repo_id": "org/derived", "filename": "m.gguf", "revision": None, "local_dir": "d2"}),
    )
    assert ok(by_main)["commit_hash"] == commit
    assert Path(ok(by_sha)["path"]).read_bytes() == data
    assert ok(by_tag)["commit_hash"] == tag_commit
    assert ok(by_tag_sha)["commit_hash"] == tag_commit
    assert Path(ok(derived_main)["path"]).read_bytes() == data
    # The derived commit is a function of the content: same files -> same sha; changed file -> new sha.
    derived_sha = ok(derived)["sha"]
    assert derived_sha not in (commit, tag_commit)
    again = s.client(("download", {"repo_id": "org/derived", "filename": "m.gguf", "revision": derived_sha}))
    ok(again[0])
    (tmp_path / "root/org/derived/m.gguf").write_bytes(data + b"x")
    (changed,) = s.client(("model_info", {"repo_id": "org/derived"}))
    assert ok(changed)["sha"] != derived_sha


def test_resume_after_dropped_transfer_uses_range(standin, tmp_path):
    size = 2 * CLIENT_CHUNK + 5 * MIB  # the client writes whole 10 MiB chunks before retrying
    data = os.urandom(size)
    cut = CLIENT_CHUNK + 2 * MIB
    write_repo(tmp_path / "root", "org/big", {"big.gguf": data})
    s = standin(drop_after=cut).start()
    chunk, dl = s.client(
        ("chunk_size", {}),
        ("download", {"repo_id": "org/big", "filename": "big.gguf", "local_dir": str(tmp_path / "out")}),
    )
    assert chunk["value"] == CLIENT_CHUNK
    assert Path(ok(dl)["path"]).read_bytes() == data
    gets = downloads(s.records(), "big.gguf")
    assert [(g["status"], g["range"], g["dropped"]) for g in gets] == [
        (200, None, True),
        (206, f"bytes={CLIENT_CHUNK}-", False),
    ]
    assert gets[0]["bytes"] == cut and gets[1]["bytes"] == size - CLIENT_CHUNK
    total = sum(g["bytes"] for g in gets)
    assert size < total <= size + (cut - CLIENT_CHUNK) < 2 * size


# -- errors, as the client classifies them --------------------------------------------------------------------
def test_gated_repo_needs_an_authorized_token(standin, tmp_path):
    data = os.urandom(2048)
    write_repo(tmp_path / "root", "org/gated", {"g.gguf": data}, {"gated": True, "token": GOOD_TOKEN})
    write_repo(tmp_path / "root", "org/public", {"p.gguf": data})
    s = standin(tokens=[OTHER_TOKEN]).start()
    kw = {"repo_id": "org/gated", "filename": "g.gguf"}
    no_token, other, unknown, good, info, public_unknown = s.client(
        ("download", {**kw, "local_dir": "a"}),
        ("download", {**kw, "local_dir": "b", "token": OTHER_TOKEN}),
        ("download", {**kw, "local_dir": "c", "token": "hf_not_a_known_token"}),
        ("download", {**kw, "local_dir": str(tmp_path / "d"), "token": GOOD_TOKEN}),
        ("model_info", {"repo_id": "org/gated", "files_metadata": True}),
        ("download", {"repo_id": "org/public", "filename": "p.gguf", "local_dir": "e", "token": "hf_nope"}),
    )
    assert "restricted" in failed(no_token, "GatedRepoError", 401)["message"]
    assert "authorized list" in failed(other, "GatedRepoError", 403)["message"]
    # As on the Hub: an unknown token is refused everywhere, and the client does not call it RepoNotFound.
    assert "Invalid credentials" in failed(unknown, "HfHubHTTPError", 401)["message"]
    assert "Invalid credentials" in failed(public_unknown, "HfHubHTTPError", 401)["message"]
    assert Path(ok(good)["path"]).read_bytes() == data
    # Metadata of a gated repo stays public (a size preflight needs no token).
    assert ok(info)["gated"] == "manual"
    assert [(x["rfilename"], x["size"]) for x in info["siblings"]] == [("g.gguf", len(data))]
    assert not any(r["status"] == 200 and r["auth"] is False for r in downloads(s.records(), "g.gguf"))


def test_missing_file_revision_and_repo(standin, tmp_path):
    write_repo(tmp_path / "root", "org/m", {"m.gguf": b"GGUF"})
    write_repo(tmp_path / "root", "org/secret", {"m.gguf": b"GGUF"}, {"private": True, "token": GOOD_TOKEN})
    s = standin().start()
    no_file, no_rev, no_rev_sha, no_repo, no_repo_token, private, private_ok, info_bad_rev = s.client(
        ("download", {"repo_id": "org/m", "filename": "absent.gguf", "local_dir": "a"}),
        ("download", {"repo_id": "org/m", "filename": "m.gguf", "revision": "no-such-branch", "local_dir": "b"}),
        ("download", {"repo_id": "org/m", "filename": "m.gguf", "revision": "c" * 40, "local_dir": "c"}),
        ("download", {"repo_id": "org/absent", "filename": "m.gguf", "local_dir": "d"}),
        ("download", {"repo_id": "org/absent", "filename": "m.gguf", "local_dir": "e", "token": GOOD_TOKEN}),
        ("download", {"repo_id": "org/secret", "filename": "m.gguf", "local_dir": "f"}),
        ("download", {"repo_id": "org/secret", "filename": "m.gguf", "local_dir": "g", "token": GOOD_TOKEN}),
        ("model_info", {"repo_id": "org/m", "revision": "nope"}),
    )
    assert "EntryNotFoundError" in failed(no_file, "RemoteEntryNotFoundError", 404)["mro"]
    failed(no_rev, "RevisionNotFoundError", 404)
    failed(no_rev_sha, "RevisionNotFoundError", 404)
    failed(no_repo, "RepositoryNotFoundError", 401)
    failed(no_repo_token, "RepositoryNotFoundError", 404)
    failed(private, "RepositoryNotFoundError", 401)
    ok(private_ok)
    failed(info_bad_rev, "RevisionNotFoundError", 404)


# -- listing / metadata API ------------------------------------------------------------------------------------
def split_repo(tmp_path: Path) -> dict[str, bytes]:
    files = {f"Model-Q4_K_M-{i:05d}-of-00003.gguf": os.urandom(1000 + i) for i in (1, 2, 3)}
    files["Model-Q8_0.gguf"] = os.urandom(3000)
    files["README.md"] = b"# model card\n"
    files["mmproj/mmproj-F16.gguf"] = os.urandom(500)
    write_repo(tmp_path / "root", "org/split", files)
    return files


def test_snapshot_download_allow_patterns_gets_all_split_parts(standin, tmp_path):
    files = split_repo(tmp_path)
    parts = sorted(f for f in files if "-of-00003" in f)
    s = standin().start()
    local = tmp_path / "snap"
    listed, snap = s.client(
        ("list_files", {"repo_id": "org/split"}),
        ("snapshot", {"repo_id": "org/split", "local_dir": str(local), "allow_patterns": ["*Q4_K_M-*-of-*.gguf"]}),
    )
    assert sorted(ok(listed)["files"]) == sorted(files)
    assert ok(snap)["files"] == parts
    for name in parts:
        assert (local / name).read_bytes() == files[name]
    assert not downloads(s.records(), "Model-Q8_0.gguf")


def test_model_info_files_metadata_gives_sizes_and_sha256(standin, tmp_path):
    files = split_repo(tmp_path)
    s = standin().start()
    full, bare = s.client(
        ("model_info", {"repo_id": "org/split", "files_metadata": True}),
        ("model_info", {"repo_id": "org/split"}),
    )
    expected = {}
    for name, data in files.items():
        lfs = {"sha256": sha256(data), "size": len(data)} if name.endswith(".gguf") else None
        blob = git_blob_sha1(data) if lfs is None else None
        expected[name] = {"rfilename": name, "size": len(data), "lfs": lfs, "blob_id": blob}
    got = {x["rfilename"]: x for x in ok(full)["siblings"]}
    for x in got.values():
        if x["lfs"] is not None:  # blob id of an LFS file is the git sha1 of its pointer: just check the form
            assert len(x["blob_id"]) == 40
            x["blob_id"] = None
    assert got == expected
    assert sum(x["size"] for x in got.values()) == sum(len(d) for d in files.values())
    # Without files_metadata the Hub lists names only.
    assert {x["rfilename"]: x["size"] for x in ok(bare)["siblings"]} == dict.fromkeys(files)
    assert bare["sha"] == full["sha"]


def test_cdn_redirect_drops_authorization_and_still_resumes(standin, tmp_path):
    size = CLIENT_CHUNK + 3 * MIB
    data = os.urandom(size)
    write_repo(tmp_path / "root", "org/gated", {"g.gguf": data}, {"gated": True, "token": GOOD_TOKEN})
    s = standin(cdn_host="localhost", drop_after=CLIENT_CHUNK + MIB).start()
    meta, dl = s.client(
        ("metadata", {"repo_id": "org/gated", "filename": "g.gguf", "token": GOOD_TOKEN}),
        (
            "download",
            {"repo_id": "org/gated", "filename": "g.gguf", "local_dir": str(tmp_path / "o"), "token": GOOD_TOKEN},
        ),
    )
    port = s.endpoint.rsplit(":", 1)[1]
    assert ok(meta)["location"].startswith(f"http://localhost:{port}/_cdn/org/gated/")
    assert (meta["etag"], meta["size"]) == (sha256(data), size)
    assert Path(ok(dl)["path"]).read_bytes() == data
    records = s.records()
    heads = [r for r in records if r["method"] == "HEAD"]
    assert {(r["status"], r["auth"]) for r in heads} == {(302, True)}
    cdn = [r for r in records if r["path"].startswith("/_cdn/")]
    assert [(r["status"], r["range"], r["auth"]) for r in cdn] == [
        (200, None, False),
        (206, f"bytes={CLIENT_CHUNK}-", False),
    ]


# -- the server itself -----------------------------------------------------------------------------------------
def http(url: str, method: str = "GET", headers: dict | None = None) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_ranges_hidden_config_traversal_and_hash_cache(standin, tmp_path):
    data = os.urandom(1000)
    write_repo(tmp_path / "root", "org/m", {"m.gguf": data, "sub/x.bin": b"xyz"}, {"lfs": ["*.gguf"]})
    (tmp_path / "root/org/m/.git").mkdir()
    (tmp_path / "root/org/m/.git/HEAD").write_text("ref: refs/heads/main\n")
    s = standin().start()
    url = f"{s.endpoint}/org/m/resolve/main/m.gguf"
    assert http(url, headers={"Range": "bytes=100-199"})[::2] == (206, data[100:200])
    status, headers, body = http(url, headers={"Range": "bytes=-10"})
    assert (status, headers["Content-Range"], body) == (206, "bytes 990-999/1000", data[-10:])
    status, headers, _ = http(url, headers={"Range": "bytes=1000-"})
    assert (status, headers["Content-Range"]) == (416, "bytes */1000")
    # 'lfs' config: *.bin is not LFS here -> git etag, no X-Linked-*.
    status, headers, _ = http(f"{s.endpoint}/org/m/resolve/main/sub/x.bin", "HEAD")
    assert (status, headers["ETag"], "X-Linked-Etag" in headers) == (200, f'"{git_blob_sha1(b"xyz")}"', False)
    for hidden in (".standin.json", ".git/HEAD", "../m/m.gguf", "sub/../m.gguf"):
        status, headers, _ = http(f"{s.endpoint}/org/m/resolve/main/{hidden}", "HEAD")
        assert (status, headers.get("X-Error-Code")) == (404, "EntryNotFound"), hidden
    status, headers, _ = http(f"{s.endpoint}/org/../resolve/main/m.gguf")
    assert status in (401, 404)
    # Hashes are computed once per (file, size, mtime).
    hub = s.server.hub
    before = hub.hash_computations
    for _ in range(3):
        assert http(url, "HEAD")[0] == 200
    assert hub.hash_computations == before
    (tmp_path / "root/org/m/m.gguf").write_bytes(data + b"!")
    status, headers, _ = http(url, "HEAD")
    assert headers["X-Linked-Etag"] == f'"{sha256(data + b"!")}"' and hub.hash_computations == before + 1


def test_bad_config_is_a_clear_error(standin, tmp_path):
    write_repo(tmp_path / "root", "org/m", {"m.gguf": b"GGUF"}, {"gated": "yes"})
    with pytest.raises(hf_standin.HubError, match=r"org/m/.standin.json: 'gated' must be true or false"):
        standin().start()
    (tmp_path / "root/org/m/.standin.json").write_text("{}")
    s = standin().start()
    (tmp_path / "root/org/m/.standin.json").write_text(json.dumps({"revisions": {"main": "abc"}}))
    status, headers, _ = http(f"{s.endpoint}/org/m/resolve/main/m.gguf", "HEAD")
    assert status == 500 and "40 lowercase hex" in headers["X-Error-Message"]


def test_cli_with_system_python_port_file_and_log(tmp_path):
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable  # stdlib-only: a bare python3
    write_repo(tmp_path / "root", "org/m", {"m.gguf": b"GGUF" * 100})
    port_file, log = tmp_path / "port", tmp_path / "log.jsonl"
    cmd = [python, str(STANDIN), "--root", str(tmp_path / "root"), "--port", "0", "--port-file", str(port_file)]
    proc = subprocess.Popen([*cmd, "--log", str(log)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 15
        while not port_file.exists():
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "stand-in did not write its port file"
            time.sleep(0.05)
        port = int(port_file.read_text())
        status, headers, body = http(f"http://127.0.0.1:{port}/org/m/resolve/main/m.gguf")
        assert (status, body, headers["X-Linked-Size"]) == (200, b"GGUF" * 100, "400")
        assert headers["X-Repo-Commit"] and headers["ETag"] == f'"{sha256(b"GGUF" * 100)}"'
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    (entry,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert {k: entry[k] for k in ("method", "path", "range", "status", "bytes")} == {
        "method": "GET",
        "path": "/org/m/resolve/main/m.gguf",
        "range": None,
        "status": 200,
        "bytes": 400,
    }
    bad = subprocess.run([python, str(STANDIN), "--root", str(tmp_path / "nope")], capture_output=True, text=True)
    assert bad.returncode == 2 and "is not a directory" in bad.stderr
