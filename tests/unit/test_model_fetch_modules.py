"""hf_download, model_verify and model_fetch_plan run for real through ``ansible localhost -m ...``.

Real ansible ad-hoc runs (AnsiballZ, module_utils by collection path, argument specs, no_log) against the Hub
stand-in (tests/harness/hf_standin.py, in-process) serving a GGUF written by make_models. hf_download runs under
the project venv's Python, which has huggingface_hub, as the role runs it under the venv it manages.
"""

from __future__ import annotations

import hashlib
import json
import sys

import pytest
from ansible_run import needs_ansible, run_adhoc

from tests.harness import hf_standin
from tests.harness.gguf.make_models import build_model

TOKEN = "hf_module_secret_token_0042"

pytestmark = needs_ansible


def run_module(name: str, args: dict, *, check: bool = False, verbose: bool = False) -> tuple[dict, str]:
    """Run under this interpreter (the venv's, which has huggingface_hub); return (result, output)."""
    extra = ["-e", f"ansible_python_interpreter={sys.executable}"] + (["-vvvv"] if verbose else [])
    return run_adhoc(name, args, check_mode=check, extra_args=extra)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    model = build_model("agree", root / "org" / "gated", name="tiny-agree")
    (root / "org/gated/.standin.json").write_text(json.dumps({"gated": True, "token": TOKEN}))
    server, _ = hf_standin.serve(root)
    yield {"endpoint": server.endpoint, "model": model.path, "server": server}
    server.shutdown()
    server.server_close()


def test_hf_download_module_token_never_shows(hub, tmp_path):
    args = {
        "repo": "org/gated",
        "files": ["tiny-agree.gguf"],
        "dest": str(tmp_path / "m"),
        "endpoint": hub["endpoint"],
        "token": TOKEN,
    }
    result, output = run_module("hf_download", args, verbose=True)
    assert result["changed"] and result["files"][0]["status"] == "downloaded", result
    assert result["downloaded_bytes"] == hub["model"].stat().st_size
    assert result["client_version"].startswith("2.")
    assert TOKEN not in output
    assert hub["server"].hub.requests[-1]["auth"] is True  # the token did reach the Hub
    for path in tmp_path.rglob("*"):
        assert TOKEN.encode() not in path.read_bytes() if path.is_file() else True

    again, _ = run_module("hf_download", args)
    assert not again["changed"] and again["files"][0]["status"] == "ok"


def test_hf_download_module_gated_without_token(hub, tmp_path):
    args = {"repo": "org/gated", "files": ["tiny-agree.gguf"], "dest": str(tmp_path), "endpoint": hub["endpoint"]}
    result, _ = run_module("hf_download", args)
    assert result["failed"] and result["kind"] == "gated" and result["status"] == 401
    assert "401 Unauthorized: org/gated is a gated repo and no HF token was given" in result["msg"]


def test_hf_download_module_check_mode(hub, tmp_path):
    dest = tmp_path / "new"
    args = {"repo": "org/gated", "files": ["tiny-agree.gguf"], "dest": str(dest), "endpoint": hub["endpoint"]}
    result, _ = run_module("hf_download", {**args, "token": TOKEN}, check=True)
    assert result["changed"] and result["files"][0]["status"] == "would_download" and not dest.exists()


def test_model_verify_module_check_and_adopt(tmp_path):
    final = tmp_path / "m.gguf"
    inc = tmp_path / ".m.gguf.incoming"
    inc.write_bytes(b"GGUF model bytes")
    good = hashlib.sha256(b"GGUF model bytes").hexdigest()
    entry = {"path": str(final), "sha256": good, "model": "m", "name": "m.gguf"}

    result, _ = run_module("model_verify", {"files": [{**entry, "via": "copy", "src": "/cache/m.gguf"}]})
    (missing,) = result["missing"]
    assert not result["changed"]
    assert missing == {
        "model": "m",
        "name": "m.gguf",
        "path": str(final),
        "sha256": good,
        "size": None,
        "via": "copy",
        "src": "/cache/m.gguf",
        "reason": None,
    }

    # The missing entries go straight back in with adopt: true (temp name DIR/.NAME.incoming by convention).
    result, _ = run_module("model_verify", {"files": [missing], "adopt": True, "mode": "0640"}, check=True)
    assert result["files"][0]["status"] == "would_adopt" and inc.exists() and not final.exists()

    result, _ = run_module("model_verify", {"files": [missing], "adopt": True, "mode": "0640"})
    assert result["changed"] and result["files"][0]["status"] == "adopted" and final.exists() and not inc.exists()
    assert oct(final.stat().st_mode & 0o777) == "0o640"

    result, _ = run_module("model_verify", {"files": [missing], "adopt": True})
    assert result["failed"] and "nothing to adopt" in result["msg"]

    result, _ = run_module("model_verify", {"files": [entry]})
    assert not result["changed"] and result["missing"] == [] and result["files"][0]["hashed"] is False

    inc.write_bytes(b"something else")
    result, _ = run_module("model_verify", {"files": [{**entry, "incoming": str(inc)}]})
    assert result["failed"] and "sha256 mismatch for m.gguf" in result["msg"] and "left untouched" in result["msg"]
    assert not inc.exists() and final.read_bytes() == b"GGUF model bytes"

    result, _ = run_module("model_verify", {"files": [{**entry, "sha256": "1" * 64}], "missing_ok": False})
    assert result["failed"] and "not present or not as expected" in result["msg"]
    assert "(sha256 differs from the expected one)" in result["msg"]


def test_model_fetch_plan_module():
    models = [
        {"name": "a", "repo": "o/r", "file": "a.gguf"},
        {"name": "b", "source": "controller", "controller_path": "/srv/b.gguf", "require_mtp": False},
    ]
    result, output = run_module("model_fetch_plan", {"models": models, "models_dir": "/data/models"})
    assert [m["dir"] for m in result["models"]] == ["/data/models/a", "/data/models/b"]
    assert any("'main' is a branch" in w for w in result.get("warnings", [])), output
    fleet, _ = run_module("model_fetch_plan", {"hosts": {"h1": result["models"], "h2": result["models"][:1]}})
    assert [(m["name"], m["hosts"]) for m in fleet["fleet"]] == [("a", ["h1", "h2"]), ("b", ["h1"])]
    bad, _ = run_module("model_fetch_plan", {"models": [{"name": "x", "repo": "o/r"}]})
    assert bad["failed"] and bad["msg"].startswith("model_fetch_models: model 'x': give exactly one of file")


def test_model_share_stop_removes_the_served_pieces(tmp_path):
    """model_share state=absent with remove: one call stops the share and removes the pieces it served (a unit of
    its own name, never started here: the stop is a no-op, the removal is real), check mode predicts it."""
    pieces = [tmp_path / ".m.gguf.piece-0", tmp_path / ".m.gguf.piece-3"]
    for p in pieces:
        p.write_bytes(b"piece")
    args = {"state": "absent", "unit": "llamafleet-model-share-unit-test",
            "remove": [str(p) for p in pieces] + [str(tmp_path / ".m.gguf.piece-9")]}  # fmt: skip
    predicted, _ = run_module("model_share", args, check=True)
    assert predicted["changed"] and predicted["removed"] == [str(p) for p in pieces], predicted
    assert all(p.exists() for p in pieces)
    done, _ = run_module("model_share", args)
    assert done["changed"] and done["removed"] == predicted["removed"] and not any(p.exists() for p in pieces)
    again, _ = run_module("model_share", args)
    assert not again["changed"] and again["removed"] == []
    refused, _ = run_module("model_share", {"secret": "x", "remove": ["relative/piece"], "unit": "llamafleet-x"})
    assert refused.get("failed") and "remove is for state=absent" in refused["msg"], refused
    assert "'relative/piece' must be an absolute path" in refused["msg"]
