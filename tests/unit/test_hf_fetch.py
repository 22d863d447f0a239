"""hf_fetch.fetch with the REAL huggingface_hub client against the Hub stand-in (tests/harness/hf_standin.py).

The stand-in replaces huggingface.co (out of reach here) and serves real GGUF files written by
tests/harness/gguf/make_models.py; its request log shows what went over the wire (ranges, bytes, auth).
Expected hashes come from hashlib over the served files. The resume case kills a real download process
(SIGKILL) midway and checks the next run continues with a Range request.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ansible_collections.llamafleet.mtp.plugins.module_utils import hf_fetch
from ansible_collections.llamafleet.mtp.plugins.module_utils.hf_fetch import HubError, fetch

from tests.harness import hf_standin
from tests.harness.gguf.make_models import build_model

REPO_ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
COMMIT = "c0ffee0000000000000000000000000000000001"
GOOD = "hf_unit_good_token_0001"
OTHER = "hf_unit_other_token_0002"


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    gen = tmp_path_factory.mktemp("gen")
    tiny = build_model("agree", gen, name="tiny-agree")
    split = build_model("agree", gen, name="tiny-split", split=3)
    big = build_model("agree", gen, name="big-agree", n_embd=384, n_layer=2)  # ~28 MiB: > 2 client chunks
    repos = {
        "org/tiny": [tiny.path],
        "org/pinned": [tiny.path],
        "org/split": split.paths,
        "org/big": [big.path],
        "org/gated": [tiny.path],
        "org/xet": [tiny.path],
    }
    for repo, paths in repos.items():
        d = root / repo
        d.mkdir(parents=True)
        for p in paths:
            shutil.copy(p, d / p.name)
    (root / "org/tiny/README.md").write_text("# tiny\n")
    (root / "org/pinned/.standin.json").write_text(json.dumps({"revisions": {"main": COMMIT, "v1": COMMIT}}))
    (root / "org/gated/.standin.json").write_text(json.dumps({"gated": True, "token": GOOD}))
    (root / "org/xet/.standin.json").write_text(json.dumps({"xet": True}))
    server, _ = hf_standin.serve(root, tokens=[OTHER])
    yield {"root": root, "endpoint": server.endpoint, "server": server, "big": big.path, "tiny": tiny.path}
    server.shutdown()
    server.server_close()


def _log_since(hub, n: int) -> list[dict]:
    """Requests since mark n, once the log settles (the stand-in logs a request after sending its answer)."""
    requests = hub["server"].hub.requests
    seen, stable = -1, 0
    while stable < 4:
        time.sleep(0.05)
        stable = stable + 1 if len(requests) == seen else 0
        seen = len(requests)
    return requests[n:]


def _mark(hub) -> int:
    return len(hub["server"].hub.requests)


def go(hub, dest, **kw):
    kw.setdefault("revision", "main")
    return fetch(dest=str(dest), endpoint=hub["endpoint"], mode=0o640, dir_mode=0o750, **kw)


def test_download_verify_and_noop_rerun_without_the_hub(hub, tmp_path):
    dest = tmp_path / "models" / "tiny"
    served = hub["root"] / "org/pinned/tiny-agree.gguf"
    r = go(hub, dest, repo="org/pinned", revision=COMMIT, files=["tiny-agree.gguf"])
    (f,) = r["files"]
    assert r["commit"] == COMMIT and r["pinned"] and r["changed"] and r["hub_contacted"]
    assert f["status"] == "downloaded" and f["sha256"] == _sha(served) and f["sha256_origin"] == "hub"
    assert f["downloaded_bytes"] == served.stat().st_size == r["downloaded_bytes"]
    installed = dest / "tiny-agree.gguf"
    assert installed.read_bytes() == served.read_bytes()
    assert oct(installed.stat().st_mode & 0o777) == "0o640" and oct(dest.stat().st_mode & 0o777) == "0o750"
    assert json.loads((dest / "tiny-agree.gguf.verified.json").read_text())["sha256"] == f["sha256"]
    assert sorted(os.listdir(dest)) == [".hf-manifest.json", "tiny-agree.gguf", "tiny-agree.gguf.verified.json"]

    mark = _mark(hub)
    again = go(hub, dest, repo="org/pinned", revision=COMMIT, files=["tiny-agree.gguf"])
    assert not again["changed"] and not again["hub_contacted"] and again["downloaded_bytes"] == 0
    assert again["files"][0]["status"] == "ok"
    assert _log_since(hub, mark) == []  # pinned + verified: not one request


def test_branch_revision_asks_the_hub_but_downloads_nothing_twice(hub, tmp_path):
    first = go(hub, tmp_path, repo="org/tiny", files=["tiny-agree.gguf"])
    mark = _mark(hub)
    second = go(hub, tmp_path, repo="org/tiny", files=["tiny-agree.gguf"])
    assert first["downloaded_bytes"] > 0 and second["downloaded_bytes"] == 0 and not second["changed"]
    assert [(q["method"], q["status"]) for q in _log_since(hub, mark)] == [("HEAD", 200)]


def test_resume_after_the_download_process_is_killed(hub, tmp_path):
    dest = tmp_path / "big"
    size = hub["big"].stat().st_size
    part = dest / ".big-agree.gguf.partial"
    code = (
        "import sys; sys.path[:0] = sys.argv[1:3]\n"
        "from ansible_collections.llamafleet.mtp.plugins.module_utils.hf_fetch import fetch\n"
        "fetch(repo='org/big', revision='main', files=['big-agree.gguf'], dest=sys.argv[3], endpoint=sys.argv[4],"
        " rate_limit=2 * 1024 * 1024)\n"
    )
    mark = _mark(hub)
    args = [sys.executable, "-c", code, str(REPO_ROOT / "collections"), str(REPO_ROOT), str(dest), hub["endpoint"]]
    proc = subprocess.Popen(args)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (part.exists() and part.stat().st_size >= 10 * MIB):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    kept = part.stat().st_size
    assert 10 * MIB <= kept < size, "the kill must land midway (client writes whole 10 MiB chunks)"
    assert not (dest / "big-agree.gguf").exists()

    r = go(hub, dest, repo="org/big", files=["big-agree.gguf"])
    f = r["files"][0]
    assert f["status"] == "downloaded" and f["resumed_from"] == kept and f["downloaded_bytes"] == size - kept
    assert _sha(dest / "big-agree.gguf") == _sha(hub["big"])
    gets = [q for q in _log_since(hub, mark) if q["method"] == "GET"]
    assert gets[0]["range"] is None and gets[-1]["range"] == f"bytes={kept}-" and gets[-1]["status"] == 206
    assert gets[-1]["bytes"] == size - kept
    assert not part.exists() and not Path(str(part) + ".json").exists()


def test_partial_of_another_file_version_is_dropped(hub, tmp_path):
    part = tmp_path / ".tiny-agree.gguf.partial"
    part.write_bytes(b"x" * 1000)
    Path(str(part) + ".json").write_text(json.dumps({"etag": "old", "size": 1}))
    mark = _mark(hub)
    r = go(hub, tmp_path, repo="org/tiny", files=["tiny-agree.gguf"])
    assert r["files"][0]["resumed_from"] == 0
    assert [q["range"] for q in _log_since(hub, mark) if q["method"] == "GET"] == [None]
    assert _sha(tmp_path / "tiny-agree.gguf") == _sha(hub["tiny"])


def test_checksum_mismatch_deletes_the_download_and_keeps_the_installed_model(hub, tmp_path):
    go(hub, tmp_path, repo="org/tiny", files=["tiny-agree.gguf"])
    installed = tmp_path / "tiny-agree.gguf"
    before = (installed.read_bytes(), installed.stat().st_mtime_ns)
    wrong = "0" * 64
    with pytest.raises(HubError) as e:
        go(hub, tmp_path, repo="org/tiny", files=["tiny-agree.gguf"], sha256={"tiny-agree.gguf": wrong})
    assert e.value.kind == "checksum"
    msg = str(e.value)
    assert f"expected {wrong}, got {_sha(hub['tiny'])}" in msg and "left untouched" in msg and "org/tiny@" in msg
    assert (installed.read_bytes(), installed.stat().st_mtime_ns) == before
    assert not [n for n in os.listdir(tmp_path) if ".partial" in n]


def test_gated_repo(hub, tmp_path):
    with pytest.raises(HubError) as e:
        go(hub, tmp_path, repo="org/gated", files=["tiny-agree.gguf"])
    assert (e.value.kind, e.value.status) == ("gated", 401) and str(e.value).startswith("401 Unauthorized")
    assert "no HF token was given" in str(e.value)
    with pytest.raises(HubError) as e:
        go(hub, tmp_path, repo="org/gated", files=["tiny-agree.gguf"], token=OTHER)
    assert (e.value.kind, e.value.status) == ("gated", 403) and "not authorized" in str(e.value)
    assert OTHER not in str(e.value)
    with pytest.raises(HubError) as e:
        go(hub, tmp_path, repo="org/gated", files=["tiny-agree.gguf"], token="hf_never_issued")
    assert (e.value.kind, e.value.status) == ("auth", 401) and "rejected the HF token" in str(e.value)
    mark = _mark(hub)
    r = go(hub, tmp_path, repo="org/gated", files=["tiny-agree.gguf"], token=GOOD)
    assert r["files"][0]["status"] == "downloaded"
    assert all(q["auth"] for q in _log_since(hub, mark))


def test_not_found_says_which(hub, tmp_path):
    with pytest.raises(HubError) as e:
        go(hub, tmp_path, repo="org/nope", files=["a.gguf"])
    assert e.value.kind == "repo" and e.value.status == 401  # anonymous: the Hub answers 401 for a missing repo
    assert str(e.value).startswith("repository not found (HTTP 401): org/nope does not exist")
    with pytest.raises(HubError) as e:
        go(hub, tmp_path, repo="org/tiny", revision="v9", files=["tiny-agree.gguf"])
    assert e.value.kind == "revision" and "revision 'v9' does not exist in org/tiny" in str(e.value)
    with pytest.raises(HubError) as e:
        go(hub, tmp_path, repo="org/tiny", files=["tiny-agree-Q4.gguf"])
    assert e.value.kind == "entry" and "file 'tiny-agree-Q4.gguf' does not exist in org/tiny" in str(e.value)
    assert "Files there: tiny-agree.gguf" in str(e.value)
    with pytest.raises(HubError, match="no file of org/tiny at revision 'main' matches include"):
        go(hub, tmp_path, repo="org/tiny", include=["*Q4_K_M*.gguf"])
    assert os.listdir(tmp_path) == []


def test_split_set_by_include(hub, tmp_path):
    r = go(hub, tmp_path, repo="org/split", include=["tiny-split-*-of-*.gguf"])
    names = [f["name"] for f in r["files"]]
    assert names == [f"tiny-split-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    for n in names:
        assert _sha(tmp_path / n) == _sha(hub["root"] / "org/split" / n)
    assert r["downloaded_bytes"] == sum((hub["root"] / "org/split" / n).stat().st_size for n in names)


def test_only_subset_and_resolve_only(hub, tmp_path):
    r = go(hub, tmp_path, repo="org/split", include=["*.gguf"], resolve_only=True)
    assert [f["status"] for f in r["files"]] == ["missing"] * 3 and r["downloaded_bytes"] == 0
    r = go(hub, tmp_path, repo="org/split", include=["*.gguf"], only=["tiny-split-00002-of-00003.gguf"])
    assert [f["name"] for f in r["files"]] == ["tiny-split-00002-of-00003.gguf"]
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith(".gguf")) == ["tiny-split-00002-of-00003.gguf"]
    with pytest.raises(HubError, match="not part of org/split"):
        go(hub, tmp_path, repo="org/split", include=["*.gguf"], only=["other.gguf"])


def test_disk_space_preflight_downloads_nothing(hub, tmp_path):
    mark = _mark(hub)
    with pytest.raises(HubError) as e:
        go(hub, tmp_path, repo="org/big", files=["big-agree.gguf"], margin_bytes=1 << 60)
    assert e.value.kind == "disk" and "not enough disk space in" in str(e.value)
    assert [q["method"] for q in _log_since(hub, mark)] == ["HEAD"]
    assert not [n for n in os.listdir(tmp_path) if n.endswith((".gguf", ".partial"))]


def test_check_mode_writes_nothing(hub, tmp_path):
    dest = tmp_path / "new"
    r = go(hub, dest, repo="org/tiny", files=["tiny-agree.gguf"], check_mode=True)
    assert r["changed"] and r["files"][0]["status"] == "would_download" and not dest.exists()


def test_non_lfs_file_needs_a_pinned_sha(hub, tmp_path):
    readme = hub["root"] / "org/tiny/README.md"
    with pytest.raises(HubError, match="gives no sha256 for org/tiny/README.md"):
        go(hub, tmp_path, repo="org/tiny", files=["README.md"])
    r = go(hub, tmp_path, repo="org/tiny", files=["README.md"], sha256={"README.md": _sha(readme)})
    assert r["files"][0]["sha256_origin"] == "pinned"


def test_environment_setup(monkeypatch):
    monkeypatch.setattr(os, "environ", dict(os.environ))  # restored after the test
    for k in ("HF_ENDPOINT", "HF_HUB_DISABLE_XET", "HF_HUB_DISABLE_IMPLICIT_TOKEN"):
        os.environ.pop(k, None)
    hf_fetch.setup_environment("http://mirror:8080/", xet=False)
    assert os.environ["HF_ENDPOINT"] == "http://mirror:8080"
    assert os.environ["HF_HUB_DISABLE_XET"] == "1" and os.environ["HF_HUB_DISABLE_IMPLICIT_TOKEN"] == "1"
    assert hf_fetch.client_version().startswith("2.")


# -- Xet ---------------------------------------------------------------------------------------------------
def _hf_xet_installed() -> bool:
    try:
        import hf_xet  # noqa: F401
    except ImportError:
        return False
    return True


def test_standin_serves_the_hubs_xet_headers_and_the_client_reads_them(hub):
    import urllib.request

    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    url = f"{hub['endpoint']}/org/xet/resolve/main/tiny-agree.gguf"
    with urllib.request.urlopen(urllib.request.Request(url, method="HEAD")) as r:
        h = r.headers
    route = h["X-Xet-Refresh-Route"]
    assert len(h["X-Xet-Hash"]) == 64 and route.endswith("/xet-read-token/" + h["X-Repo-Commit"])
    assert h["Link"] == f'<{route}>; rel="xet-auth"'
    meta = get_hf_file_metadata(hf_hub_url("org/xet", "tiny-agree.gguf", endpoint=hub["endpoint"]))
    assert meta.xet_file_data is not None and meta.xet_file_data.file_hash == h["X-Xet-Hash"]
    plain = get_hf_file_metadata(hf_hub_url("org/tiny", "tiny-agree.gguf", endpoint=hub["endpoint"]))
    assert plain.xet_file_data is None


@pytest.mark.skipif(not _hf_xet_installed(), reason="hf_xet is not installed")
def test_xet_file_with_hf_xet_installed_tries_xet_then_downloads_over_http_and_verifies(hub, tmp_path):
    mark = _mark(hub)
    r = go(hub, tmp_path, repo="org/xet", files=["tiny-agree.gguf"])
    (f,) = r["files"]
    assert f["status"] == "downloaded" and f["sha256"] == _sha(hub["tiny"]) == _sha(tmp_path / "tiny-agree.gguf")
    assert f["transfer"] == "http" and "501" in f["xet_error"]  # the stand-in has no Xet storage
    paths = [q["path"] for q in _log_since(hub, mark)]
    assert any("/xet-read-token/" in p for p in paths), paths


def test_xet_file_without_hf_xet_downloads_over_http_and_verifies(hub, tmp_path):
    """hf_xet made unimportable (a stub package that raises ImportError first on sys.path), in a fresh process."""
    stub = tmp_path / "stub" / "hf_xet"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('hf_xet is not installed (test stub)')\n")
    dest = tmp_path / "dest"
    code = (
        "import json, sys; sys.path[:0] = sys.argv[1:4]\n"
        "from ansible_collections.llamafleet.mtp.plugins.module_utils.hf_fetch import fetch, setup_environment\n"
        "setup_environment(sys.argv[5])\n"
        "print(json.dumps(fetch(repo='org/xet', revision='main', files=['tiny-agree.gguf'], dest=sys.argv[4],"
        " endpoint=sys.argv[5])))\n"
    )
    mark = _mark(hub)
    args = [sys.executable, "-c", code, str(stub.parent), str(REPO_ROOT / "collections"), str(REPO_ROOT)]
    proc = subprocess.run([*args, str(dest), hub["endpoint"]], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (f,) = json.loads(proc.stdout)["files"]
    assert f["status"] == "downloaded" and f["transfer"] == "http" and "xet_error" not in f
    assert _sha(dest / "tiny-agree.gguf") == _sha(hub["tiny"]) == f["sha256"]
    assert not any("/xet-read-token/" in q["path"] for q in _log_since(hub, mark))


def test_xet_off_downloads_over_http(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")  # what setup_environment(xet=False) sets
    mark = _mark(hub)
    r = go(hub, tmp_path, repo="org/xet", files=["tiny-agree.gguf"])
    assert r["files"][0]["transfer"] == "http" and "xet_error" not in r["files"][0]
    assert not any("/xet-read-token/" in q["path"] for q in _log_since(hub, mark))


def test_every_huggingface_hub_name_hf_fetch_uses_is_exported_by_the_installed_version():
    """Public names only, each importable from the installed huggingface_hub (the pinned range is what is tested)."""
    import ast
    import importlib
    import re

    source = Path(hf_fetch.__file__).read_text()
    used = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("huggingface_hub"):
            used += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            used += [(a.name, None) for a in node.names if a.name.startswith("huggingface_hub")]
    used += [("huggingface_hub.file_download", n) for n in re.findall(r"\bfile_download\.(\w+)\(", source)]
    assert ("huggingface_hub.utils", "build_hf_headers") in used and len(used) > 8
    for module, name in sorted(used, key=str):
        assert not any(part.startswith("_") for part in module.split(".")), f"private module {module}"
        mod = importlib.import_module(module)
        if name is not None:
            assert not name.startswith("_"), f"private name {module}.{name}"
            assert getattr(mod, name, None) is not None, f"{module}.{name} is not in huggingface_hub {_hf_version()}"


def _hf_version() -> str:
    import huggingface_hub

    return huggingface_hub.__version__


def test_the_huggingface_hub_the_role_installs_is_the_one_tested_here():
    import yaml

    defaults = yaml.safe_load((REPO_ROOT / "roles/model_fetch/defaults/main.yml").read_text())
    role_pin = [p for p in defaults["model_fetch_hf_pip_packages"] if p.startswith("huggingface_hub")]
    reqs = (REPO_ROOT / "requirements.txt").read_text().split()
    assert role_pin == [f"huggingface_hub=={_hf_version()}"] and role_pin[0] in reqs
