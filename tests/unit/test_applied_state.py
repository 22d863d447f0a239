"""plugins/module_utils/applied_state.py: the scan of what a converge left on a host, and its drift."""

from __future__ import annotations

import os

from ansible_collections.llamafleet.mtp.plugins.module_utils.applied_state import (
    declared_digest,
    drift,
    record_paths,
    scan,
)


def _host(tmp_path):
    cfg, units, root, models = (tmp_path / d for d in ("etc", "units", "opt", "models"))
    for d in (cfg, units / "llama-server@main.service.d", root / "builds" / "a" / "bin", root / "builds" / "b", models):
        d.mkdir(parents=True)
    (cfg / "main.env").write_text("LLAMA_ARGS=-m /m.gguf\n")
    (cfg / "main.key").write_text("secret\n")
    (units / "llama-server@.service").write_text("[Service]\n")
    (units / "llama-server@main.service.d" / "10-llamafleet.conf").write_text("[Service]\nX=1\n")
    server = root / "builds" / "a" / "bin" / "llama-server"
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    os.symlink(root / "builds" / "a", root / "current")
    os.symlink(root / "builds" / "b", root / "previous")
    model = models / "m.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 60)
    return cfg, units, root, model


def _scan(host):
    cfg, units, root, model = host
    return scan(str(cfg), str(units), str(root), [str(model)])


def test_unchanged_host_has_no_drift(tmp_path):
    host = _host(tmp_path)
    rec = _scan(host)
    assert drift(rec, _scan(host)) == []
    assert record_paths({"scan": rec}) == [str(host[3])]


def test_every_kind_of_drift_is_named(tmp_path):
    cfg, units, root, model = host = _host(tmp_path)
    rec = _scan(host)
    (cfg / "main.env").write_text("LLAMA_ARGS=-m /other.gguf\n")  # hand-edited env file
    (units / "llama-server@.service").write_text("[Service]\nNice=5\n")  # hand-edited unit
    (units / "llama-server@main.service.d" / "10-llamafleet.conf").unlink()  # deleted drop-in
    (cfg / "main.key").unlink()  # deleted key
    model.unlink()  # deleted model
    os.unlink(root / "current")
    os.symlink(root / "builds" / "b", root / "current")  # switched current
    out = drift(rec, _scan(host))
    text = "\n".join(out)
    assert f"{cfg / 'main.env'} was changed" in text
    assert f"{units / 'llama-server@.service'} was changed" in text
    assert "10-llamafleet.conf is missing" in text
    assert "main.key is missing" in text
    assert f"model {model} is missing" in text
    assert "current points at" in text
    assert "current/bin/llama-server is missing" in text  # builds/b has no binary


def test_admin_dropins_and_new_instances(tmp_path):
    cfg, units, root, model = host = _host(tmp_path)
    rec = _scan(host)
    (units / "llama-server@main.service.d" / "50-admin.conf").write_text("[Service]\n")  # not ours: no drift
    assert drift(rec, _scan(host)) == []
    (cfg / "extra.env").write_text("LLAMA_ARGS=\n")  # an instance nobody declared
    assert any("instances configured" in d for d in drift(rec, _scan(host)))


def test_replaced_model_and_old_records(tmp_path):
    host = _host(tmp_path)
    rec = _scan(host)
    host[3].write_bytes(b"GGUF" + b"\1" * 80)
    assert any("changed (size/mtime)" in d for d in drift(rec, _scan(host)))
    assert drift({}, _scan(host)) == ["no applied-state record of this version"]
    assert drift(None, _scan(host)) == ["no applied-state record of this version"]


def test_digest_is_stable_and_order_free():
    a = declared_digest({"b": [1, 2], "a": {"y": 1, "x": None}})
    b = declared_digest({"a": {"x": None, "y": 1}, "b": [1, 2]})
    assert a == b and len(a) == 64
    assert declared_digest({"b": [2, 1]}) != declared_digest({"b": [1, 2]})
