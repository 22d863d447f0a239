"""model_fetch: model list normalisation, fleet aggregation and Hub error messages."""

from __future__ import annotations

import pytest
from ansible_collections.llamafleet.mtp.plugins.module_utils.model_fetch import (
    ModelSpecError,
    aggregate,
    build_facts,
    controller_work,
    expected_sha256,
    host_plan,
    hub_error_message,
    is_commit,
    normalize_model,
    normalize_models,
)

SHA = "ab" * 32
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def norm(item, **kw):
    return normalize_model(item, models_dir=kw.pop("models_dir", "/var/lib/llama-models"), **kw)


def test_hf_file_pinned():
    m, warnings = norm({"name": "qwen", "repo": "unsloth/Qwen3.6-27B-GGUF", "file": "q.gguf", "revision": COMMIT})
    assert warnings == []
    assert m["source"] == "hf" and m["dir"] == "/var/lib/llama-models/qwen" and m["pinned"] is True
    assert m["files"] == ["q.gguf"] and m["include"] is None and m["sha256"] == {} and m["require_mtp"] is True


def test_hf_branch_warns_and_sha_string_maps_to_the_file():
    m, warnings = norm({"name": "q", "repo": "o/r", "file": "q.gguf", "sha256": "SHA256:" + SHA.upper()})
    assert m["revision"] == "main" and m["pinned"] is False
    assert m["sha256"] == {"q.gguf": SHA}
    assert len(warnings) == 1 and "'main' is a branch" in warnings[0] and "pin the commit" in warnings[0]


def test_hf_include_and_require_mtp_default():
    m, _ = norm({"name": "s", "repo": "o/r", "include": "*-of-*.gguf", "revision": COMMIT}, require_mtp=False)
    assert m["include"] == ["*-of-*.gguf"] and m["files"] is None and m["require_mtp"] is False
    m, _ = norm({"name": "s", "repo": "o/r", "include": ["a*"], "revision": COMMIT, "require_mtp": True})
    assert m["require_mtp"] is True
    m, _ = norm({"name": "s", "repo": "o/r", "include": ["a*"], "sha256": {"a-00001-of-00002.gguf": SHA}})
    assert m["sha256"] == {"a-00001-of-00002.gguf": SHA}


def test_url_and_controller_sources():
    m, _ = norm({"name": "u", "source": "url", "url": "https://example.org/x/tiny%20m.gguf?dl=1", "sha256": SHA})
    assert m["files"] == ["tiny m.gguf"] and m["urls"] == [{"name": "tiny m.gguf", "url": m["urls"][0]["url"]}]
    m, _ = norm({"name": "c", "source": "controller", "controller_path": ["/srv/a-00001-of-00002.gguf", "/srv/b.bin"]})
    assert m["files"] == ["a-00001-of-00002.gguf", "b.bin"]
    assert m["controller_paths"][1] == {"name": "b.bin", "path": "/srv/b.bin"} and m["sha256"] == {}
    m, _ = norm({"name": "c", "source": "controller", "controller_path": "/srv/a.gguf", "dir": "/models/x/"})
    assert m["dir"] == "/models/x"


@pytest.mark.parametrize(
    ("item", "match"),
    [
        ("just-a-string", "must be a mapping"),
        ({"name": "../x", "repo": "o/r", "file": "a.gguf"}, "name '../x' is not valid"),
        ({"name": "x", "repo": "o/r", "file": "a.gguf", "revison": "main"}, r"unknown keys \['revison'\]"),
        ({"name": "x", "source": "s3", "repo": "o/r"}, "source 's3' is not one of hf, url, controller"),
        ({"name": "x", "repo": "just-a-name", "file": "a.gguf"}, "repo must be a Hugging Face repo id 'owner/name'"),
        ({"name": "x", "repo": "o/r"}, "give exactly one of file"),
        ({"name": "x", "repo": "o/r", "file": "a.gguf", "include": ["*"]}, "give exactly one of file"),
        ({"name": "x", "repo": "o/r", "file": "../a.gguf"}, "must not contain empty, '.' or '..'"),
        ({"name": "x", "repo": "o/r", "file": "a.gguf", "revision": "../main"}, "not a valid branch"),
        ({"name": "x", "repo": "o/r", "file": "a.gguf", "sha256": "abc"}, "must be 64 hex digits"),
        ({"name": "x", "repo": "o/r", "include": ["*"], "sha256": SHA}, "single string but the model has"),
        ({"name": "x", "repo": "o/r", "file": ["a.gguf", "b.gguf"], "sha256": SHA}, "has 2 files"),
        ({"name": "x", "repo": "o/r", "file": "a.gguf", "sha256": {"b.gguf": SHA}}, "not one of its files"),
        ({"name": "x", "repo": "o/r", "file": "README.md"}, r"none of its files ends in \.gguf"),
        ({"name": "x", "repo": "o/r", "file": "a.gguf", "require_mtp": "yes"}, "require_mtp must be true or false"),
        ({"name": "x", "repo": "o/r", "file": "a.gguf", "dir": "rel/dir"}, "dir must be an absolute path"),
        ({"name": "x", "source": "url", "url": "https://h/a.gguf"}, "needs the sha256 of every file"),
        ({"name": "x", "source": "url", "url": "s3://b/a.gguf", "sha256": SHA}, "must be an http"),
        ({"name": "x", "source": "url", "url": "https://h/", "sha256": SHA}, "file name taken from the url"),
        ({"name": "x", "source": "url", "url": ["https://h/a.gguf", "https://g/a.gguf"]}, "same file name"),
        ({"name": "x", "source": "controller", "controller_path": "rel.gguf"}, "must be an absolute path"),
        ({"name": "x", "source": "controller", "controller_path": "/a.gguf", "file": "a.gguf"}, "use controller_path"),
        ({"name": "x", "source": "controller"}, "controller_path must be a string or a non-empty list"),
    ],
)
def test_bad_items(item, match):
    with pytest.raises(ModelSpecError, match=match):
        norm(item)


def test_list_level_checks():
    ok = {"name": "a", "repo": "o/r", "file": "a.gguf", "revision": COMMIT}
    models, warnings = normalize_models([ok], models_dir="/m")
    assert [m["name"] for m in models] == ["a"] and warnings == []
    assert normalize_models(None, models_dir="/m") == ([], [])
    with pytest.raises(ModelSpecError, match="used twice"):
        normalize_models([ok, ok], models_dir="/m")
    with pytest.raises(ModelSpecError, match="share the directory /m/shared"):
        normalize_models([{**ok, "dir": "/m/shared"}, {**ok, "name": "b", "dir": "/m/shared"}], models_dir="/m")
    with pytest.raises(ModelSpecError, match="must be a list"):
        normalize_models({"name": "a"}, models_dir="/m")


def test_aggregate_fleet():
    a, _ = norm({"name": "a", "repo": "o/r", "file": "a.gguf", "revision": COMMIT})
    b, _ = norm({"name": "b", "source": "controller", "controller_path": "/srv/b.gguf"})
    a_other_dir = {**a, "dir": "/elsewhere/a", "require_mtp": False}
    fleet = aggregate({"h2": [a_other_dir], "h1": [a, b]})
    assert [(m["name"], m["hosts"]) for m in fleet] == [("a", ["h1", "h2"]), ("b", ["h1"])]
    assert "dir" not in fleet[0] and fleet[0]["files"] == ["a.gguf"]
    changed = {**a, "revision": "main"}
    with pytest.raises(ModelSpecError, match="'a' is defined differently on h1 and h2"):
        aggregate({"h1": [a], "h2": [changed]})


def test_hub_error_messages_say_which():
    gated401 = hub_error_message("gated", repo="o/g", status=401, endpoint="http://mirror:1")
    assert gated401.startswith("401 Unauthorized") and "gated" in gated401 and "no HF token" in gated401
    assert "http://mirror:1/o/g" in gated401 and "model_fetch_hf_token" in gated401
    gated403 = hub_error_message("gated", repo="o/g", status=403, token_given=True)
    assert gated403.startswith("403 Forbidden") and "not authorized" in gated403 and "Request access" in gated403
    auth = hub_error_message("auth", repo="o/r", status=401, server_message="Invalid credentials")
    assert auth.startswith("401") and "rejected the HF token" in auth and "Invalid credentials" in auth
    repo = hub_error_message("repo", repo="o/missing", status=404, token_given=True)
    assert repo.startswith("repository not found (HTTP 404): o/missing does not exist") and "token given" in repo
    assert "private and no token" in hub_error_message("repo", repo="o/m", status=401)
    rev = hub_error_message("revision", repo="o/r", revision="v9")
    assert rev.startswith("404 Not Found: revision 'v9' does not exist in o/r")
    entry = hub_error_message("entry", repo="o/r", revision="main", filename="x.gguf", available=["a.gguf"] * 25)
    assert entry.startswith("404 Not Found: file 'x.gguf' does not exist in o/r at revision 'main'")
    assert "Files there: a.gguf" in entry and "and 5 more" in entry
    assert "cannot reach the Hub at http://h:1" in hub_error_message("network", repo="o/r", endpoint="http://h:1")
    assert hub_error_message("http", repo="o/r", status=500).startswith("HTTP 500")


def test_expected_sha_and_commit():
    assert expected_sha256({"a.gguf": SHA}, "a.gguf", "f" * 64) == (SHA, "pinned")
    assert expected_sha256({}, "a.gguf", "f" * 64) == ("f" * 64, "hub")
    assert expected_sha256({}, "README.md", "1" * 40) == (None, None)
    assert is_commit(COMMIT) and not is_commit("main") and not is_commit(COMMIT.upper()) and not is_commit(None)


def _models():
    hf, _ = norm({"name": "q", "repo": "o/r", "include": "*-of-*.gguf", "revision": COMMIT})
    one, _ = norm({"name": "one", "repo": "o/one", "file": "one.gguf", "revision": COMMIT})
    url, _ = norm({"name": "u", "source": "url", "url": "https://h/x/u.gguf", "sha256": SHA})
    ctl, _ = norm({"name": "c", "source": "controller", "controller_path": "/srv/c.gguf", "require_mtp": False})
    return hf, one, url, ctl


def test_host_plan_fleet():
    hf, one, url, ctl = _models()
    manifest = [
        {
            "model": "q",
            "name": "m-00002-of-00002.gguf",
            "sha256": SHA,
            "size": 2,
            "path": "/cache/q/m-00002-of-00002.gguf",
        },
        {
            "model": "q",
            "name": "m-00001-of-00002.gguf",
            "sha256": SHA,
            "size": 1,
            "path": "/cache/q/m-00001-of-00002.gguf",
        },
        {"model": "c", "name": "c.gguf", "sha256": SHA, "size": 3, "path": "/srv/c.gguf"},
    ]
    plan = host_plan([hf, url, ctl], manifest, cache_dir="/cache", fleet=True)
    assert plan["heads"] == {
        "q": "/var/lib/llama-models/q/m-00001-of-00002.gguf",
        "u": "/var/lib/llama-models/u/u.gguf",
        "c": "/var/lib/llama-models/c/c.gguf",
    }
    by = {(e["model"], e["name"]): e for e in plan["expect"]}
    assert by[("q", "m-00001-of-00002.gguf")] == {
        "model": "q",
        "name": "m-00001-of-00002.gguf",
        "path": "/var/lib/llama-models/q/m-00001-of-00002.gguf",
        "sha256": SHA,
        "size": 1,
        "via": "copy",
        "src": "/cache/q/m-00001-of-00002.gguf",
    }
    assert by[("u", "u.gguf")]["via"] == "copy" and by[("u", "u.gguf")]["src"] == "/cache/u/u.gguf"
    assert by[("c", "c.gguf")]["src"] == "/srv/c.gguf" and len(plan["expect"]) == 4
    assert len(plan["installed"]) == 4


def test_host_plan_per_host():
    hf, one, url, ctl = _models()
    plan = host_plan([hf, one, url], [], cache_dir="/cache", fleet=False)
    # hf models are fetched by the host itself (not expected by copy); an unresolved include has no head yet
    assert [(e["model"], e["via"], e["src"]) for e in plan["expect"]] == [("u", "get_url", "https://h/x/u.gguf")]
    assert plan["heads"]["q"] is None and plan["heads"]["one"] == "/var/lib/llama-models/one/one.gguf"
    host_files = [{"model": "q", "name": "m-00001-of-00002.gguf", "path": "/var/lib/llama-models/q/x"}]
    assert host_plan([hf], host_files, cache_dir="/c", fleet=False)["heads"]["q"].endswith("m-00001-of-00002.gguf")


def test_controller_work_fetches_each_missing_file_once():
    hf, one, url, ctl = _models()
    needed = [
        {"model": "q", "name": "m-00002-of-00002.gguf", "src": "/cache/q/m-00002-of-00002.gguf", "sha256": SHA},
        {"model": "q", "name": "m-00002-of-00002.gguf", "src": "/cache/q/m-00002-of-00002.gguf", "sha256": SHA},
        {"model": "q", "name": "m-00001-of-00002.gguf", "src": "/cache/q/m-00001-of-00002.gguf", "sha256": SHA},
        {"model": "u", "name": "u.gguf", "src": "/cache/u/u.gguf", "sha256": SHA},
        {"model": "u", "name": "u.gguf", "src": "/cache/u/u.gguf", "sha256": SHA},
        {"model": "c", "name": "c.gguf", "src": "/srv/c.gguf", "sha256": SHA},
    ]
    fleet = aggregate({"h1": [hf, one, url, ctl]})
    work = controller_work(fleet, needed)
    assert [(m["name"], m["only"]) for m in work["hf"]] == [("q", ["m-00001-of-00002.gguf", "m-00002-of-00002.gguf"])]
    assert work["url"] == [
        {"model": "u", "name": "u.gguf", "path": "/cache/u/u.gguf", "sha256": SHA, "src": "https://h/x/u.gguf"}
    ]
    assert controller_work(fleet, []) == {"hf": [], "url": []}


def test_build_facts_and_mtp_refusal():
    hf, one, url, ctl = _models()
    verified = [
        {"model": "one", "path": "/var/lib/llama-models/one/one.gguf", "sha256": SHA, "size": 10},
        {"model": "c", "path": "/var/lib/llama-models/c/c.gguf", "sha256": "cd" * 32, "size": 5},
    ]
    heads = {"one": "/var/lib/llama-models/one/one.gguf", "c": "/var/lib/llama-models/c/c.gguf"}
    mtp = {"split": {"paths": [heads["one"]]}, "nextn_predict_layers": 1, "architecture": "glm4moe"}
    plain = {"split": {"paths": [heads["c"]]}, "nextn_predict_layers": 0, "architecture": "llama"}
    facts, problems = build_facts([one, ctl], verified, heads, {"one": mtp, "c": plain}, {"one": COMMIT})
    assert problems == []  # c does not require MTP
    assert facts["one"] == {
        "path": heads["one"],
        "paths": [heads["one"]],
        "sha256": SHA,
        "size_bytes": 10,
        "revision": COMMIT,
        "repo": "o/one",
        "source": "hf",
        "require_mtp": True,
        "gguf": mtp,
        "files": [{"path": heads["one"], "sha256": SHA, "size": 10}],
    }
    assert facts["c"]["revision"] is None and facts["c"]["repo"] is None and facts["c"]["sha256"] == "cd" * 32
    _, problems = build_facts([one], verified, heads, {"one": plain}, {})
    assert len(problems) == 1 and "/var/lib/llama-models/one/one.gguf has no MTP layers" in problems[0]
    assert "Pick an MTP GGUF" in problems[0]
