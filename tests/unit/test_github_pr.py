"""Following a pull request: the pure logic (module_utils/github_pr.py), and the github_pr_info module run for
real (ansible-runner, AnsiballZ, fetch_url) against the GitHub stand-in (tests/harness/github_standin.py).

STAND-IN: GitHub's REST API (unreachable here) - the stand-in speaks its contract for pulls/N, tags and compare,
with ETag/304 and the 403 rate limit; compare and tag shas come from a real git repository made in tmp_path.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from ansible_collections.llamafleet.mtp.plugins.module_utils import github_pr as gp

from tests.harness import github_standin
from tests.unit.ansible_run import needs_ansible, run_module

# ------------------------------------------------------------------------------------------
# pure logic


@pytest.mark.parametrize(
    "ref,n",
    [
        ("pull/22673", 22673),
        ("refs/pull/22673/head", 22673),
        ("#22673", 22673),
        (22673, 22673),
        ("b9180", None),
        ("mainline-0c1e570", None),
        ("master", None),
        ("", None),
        (None, None),
    ],
)
def test_pr_of_ref(ref, n):
    assert gp.pr_of_ref(ref) == n


def test_release_tags_and_first_release():
    assert gp.release_tags(["b10", "b9", "v1.0", "b100", "b9"]) == ["b9", "b10", "b100"]
    tags = [f"b{n}" for n in range(9100, 9300)]
    asked = []

    def contains(t):
        asked.append(t)
        return gp.tag_number(t) >= 9180

    assert gp.first_release(tags, contains) == "b9180"
    assert len(asked) <= 10  # binary search, not a scan of 200 tags
    assert gp.first_release(tags, lambda t: False) is None
    assert gp.first_release([], lambda t: True) is None
    assert gp.first_release(["b1", "b2"], lambda t: True) == "b1"
    assert gp.git_tags_containing("b9181\nmainline-x\nb9180\n") == ["b9180", "b9181"]


def test_compare_contains():
    assert gp.compare_contains({"status": "ahead"}) and gp.compare_contains({"status": "identical"})
    assert not gp.compare_contains({"status": "behind"}) and not gp.compare_contains({"status": "diverged"})
    with pytest.raises(gp.GitHubAnswerError):
        gp.compare_contains({"message": "Not Found"})


def test_pull_summary_and_decide():
    open_pr = gp.pull_summary({"number": 7, "state": "open", "merged": False, "head": {"sha": "h"}})
    merged = gp.pull_summary(
        {"number": 7, "state": "closed", "merged": True, "merged_at": "2026-05-16T00:00:00Z", "merge_commit_sha": "m"}
    )
    closed = gp.pull_summary({"number": 7, "state": "closed", "merged": False, "merge_commit_sha": "test-merge"})
    assert closed["merge_commit_sha"] is None  # GitHub keeps a test-merge sha on unmerged PRs: not a merge
    assert gp.decide("pull/7", open_pr, None)["action"] == "none"
    assert gp.decide("pull/7", closed, None)["action"] == "warn"
    assert "closed without merging" in gp.decide("pull/7", closed, None)["msg"]
    assert gp.decide("pull/7", merged, None)["action"] == "none"  # merged, no release yet
    d = gp.decide("pull/7", merged, "b9180", repo="o/r")
    assert d["action"] == "upgrade" and d["ref"] == "b9180" and "o/r#7" in d["msg"]
    assert gp.decide("b9180", merged, "b9180")["action"] == "none"  # the pin is a release: nothing to follow
    with pytest.raises(gp.GitHubAnswerError):
        gp.pull_summary({"message": "Not Found"})


def test_rate_limit_line():
    now = 1_800_000_000
    h = {"X-RateLimit-Limit": "60", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(now + 600)}
    line = gp.rate_limit_line(403, h, b'{"message": "API rate limit exceeded for 1.2.3.4."}', now=now)
    assert line == (
        "GitHub API rate limit (403, 0 of 60 requests left): resets at 2027-01-15T08:10:00Z (in 10 min); "
        "nothing was changed"
    )
    assert "\n" not in line
    assert "in 2 min" in gp.rate_limit_line(429, {"retry-after": "120"}, None, now=now)
    assert gp.rate_limit_line(403, {"X-RateLimit-Remaining": "59"}, '{"message": "Resource not accessible"}') is None
    assert gp.rate_limit_line(404, h) is None


# ------------------------------------------------------------------------------------------
# the module against the stand-in


def _git(d, *args, env=None):
    return subprocess.run(["git", "-C", str(d), *args], check=True, capture_output=True, text=True, env=env).stdout


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    """A git repository like llama.cpp's: master builds tagged b1..b40, a PR branch merged after b20."""
    d = tmp_path_factory.mktemp("upstream")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    _git(d, "init", "-q", "-b", "master", env=env)
    shas = {}
    for n in range(1, 41):
        if n == 21:
            _git(d, "checkout", "-q", "-b", "pr", env=env)
            _git(d, "commit", "-q", "--allow-empty", "-m", "pr head", env=env)
            shas["head"] = _git(d, "rev-parse", "HEAD").strip()
            _git(d, "checkout", "-q", "master", env=env)
            _git(d, "merge", "-q", "--no-ff", "-m", "merge pr", "pr", env=env)
            shas["merge"] = _git(d, "rev-parse", "HEAD").strip()
            _git(d, "tag", f"b{n}", env=env)
            continue
        _git(d, "commit", "-q", "--allow-empty", "-m", f"c{n}", env=env)
        _git(d, "tag", f"b{n}", env=env)
    return d, shas


@pytest.fixture
def github(tmp_path, upstream):
    d, shas = upstream
    state_path = tmp_path / "state.json"
    server, _ = github_standin.serve(state_path)

    def set_state(pull, tags=(), **top):
        p = {"title": "MTP", "head_sha": shas["head"], **pull}
        repo = {"git_dir": str(d / ".git"), "tags": list(tags), "pulls": {"22673": p}}
        state = {"repos": {"ggml-org/llama.cpp": repo}, **top}
        tmp = state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(state_path)

    yield server, set_state, shas, d
    server.shutdown()
    server.server_close()


def _args(server, tmp_path, **kw):
    return {
        "repo": "ggml-org/llama.cpp",
        "number": 22673,
        "api_url": server.endpoint,
        "cache_dir": str(tmp_path / "cache"),
        **kw,
    }


@needs_ansible
def test_module_open_idle_poll_is_one_304(github, tmp_path):
    server, set_state, shas, _ = github
    set_state({"state": "open"})
    first = run_module("github_pr_info", _args(server, tmp_path))
    assert first["state"] == "open" and first["merged"] is False and first["head_sha"] == shas["head"]
    assert first["requests"] == 1 and first["not_modified"] == 0 and first["changed"] is False
    n = len(server.requests)
    idle = run_module("github_pr_info", _args(server, tmp_path))
    assert idle["requests"] == 1 and idle["not_modified"] == 1 and idle["state"] == "open"
    assert [r["status"] for r in server.requests[n:]] == [304]  # exactly one conditional request
    assert server.requests[-1]["if_none_match"]
    cache = next((tmp_path / "cache").iterdir())
    assert oct(cache.stat().st_mode & 0o777) == "0o600"


@needs_ansible
def test_module_merged_finds_first_release_by_api_then_keeps_it(github, tmp_path):
    server, set_state, shas, _ = github
    tags = [f"b{n}" for n in range(1, 41)]
    merged = {"state": "closed", "merged": True, "merged_at": "2026-05-16T09:00:00Z", "merge_commit_sha": shas["merge"]}
    set_state(merged, tags)
    res = run_module("github_pr_info", _args(server, tmp_path))
    assert res["merged"] is True and res["merge_commit_sha"] == shas["merge"] and res["release"] == "b21"
    assert res["requests"] <= 1 + 1 + 7  # pulls, one page of tags, a binary search of compares
    again = run_module("github_pr_info", _args(server, tmp_path))
    assert again["release"] == "b21" and again["requests"] == 1 and again["not_modified"] == 1


@needs_ansible
def test_module_merged_no_release_yet_then_git_resolver(github, tmp_path):
    server, set_state, shas, d = github
    merged = {"state": "closed", "merged": True, "merged_at": "2026-05-16T09:00:00Z", "merge_commit_sha": shas["merge"]}
    set_state(merged, ["b1", "b20"])  # GitHub shows only tags older than the merge
    res = run_module("github_pr_info", _args(server, tmp_path))
    assert res["merged"] is True and res["release"] is None
    by_git = run_module("github_pr_info", _args(server, tmp_path, release_from="git", git_dir=str(d / ".git")))
    assert by_git["release"] == "b21"
    missing = run_module(
        "github_pr_info", _args(server, tmp_path / "other", release_from="git", git_dir=str(tmp_path / "empty"))
    )
    assert missing.get("failed") and "git tag --contains" in missing["msg"]


@needs_ansible
def test_module_rate_limited_is_one_line_and_keeps_the_cache(github, tmp_path):
    server, set_state, _, _ = github
    set_state({"state": "open"})
    run_module("github_pr_info", _args(server, tmp_path))
    cache = next((tmp_path / "cache").iterdir())
    before = cache.read_bytes()
    set_state({"state": "open"}, rate_limited=True)
    res = run_module("github_pr_info", _args(server, tmp_path))
    assert res["rate_limited"] is True and res["changed"] is False and not res.get("failed")
    assert res["msg"].startswith("GitHub API rate limit (403, 0 of 60 requests left): resets at ")
    assert res["warnings"] == [res["msg"]] and "\n" not in res["msg"]
    assert cache.read_bytes() == before


@needs_ansible
def test_module_token_from_environment_never_in_output(github, tmp_path):
    server, set_state, _, _ = github
    token = "ghp_standin_secret_token_0001"
    set_state({"state": "open"}, tokens=[token])
    res = run_module("github_pr_info", _args(server, tmp_path), extra_env={"GITHUB_TOKEN": token})
    assert res["state"] == "open" and server.requests[-1]["auth"]
    bad = run_module("github_pr_info", _args(server, tmp_path / "b"), extra_env={"GITHUB_TOKEN": "wrong"})
    assert bad.get("failed") and "HTTP 401 Bad credentials" in bad["msg"]
    assert token not in json.dumps(res) and "wrong" not in json.dumps(bad)


@needs_ansible
def test_module_check_mode_writes_no_cache(github, tmp_path):
    server, set_state, _, _ = github
    set_state({"state": "open"})
    res = run_module("github_pr_info", _args(server, tmp_path), check_mode=True)
    assert res["state"] == "open" and not (tmp_path / "cache").exists()
    missing = run_module("github_pr_info", {**_args(server, tmp_path), "number": 1})
    assert missing.get("failed") and "HTTP 404 Not Found" in missing["msg"]


@needs_ansible
def test_module_with_the_pin(github, tmp_path):
    server, set_state, shas, _ = github
    args = _args(server, tmp_path)
    del args["number"]
    set_state({"state": "closed", "closed_at": "2026-05-15T10:00:00Z"})
    closed = run_module("github_pr_info", {**args, "ref": "pull/22673"})
    assert closed["follow"]["action"] == "warn" and closed["warnings"] == [closed["msg"]]
    n = len(server.requests)
    release_pin = run_module("github_pr_info", {**args, "ref": "b9180"})
    assert release_pin["number"] is None and release_pin["requests"] == 0 and len(server.requests) == n
    assert release_pin["follow"] == {"action": "none", "msg": "the pin b9180 names no pull request: nothing to follow"}
    merged = {"state": "closed", "merged": True, "merged_at": "2026-05-16T09:00:00Z", "merge_commit_sha": shas["merge"]}
    set_state(merged, [f"b{n}" for n in range(1, 41)])
    up = run_module("github_pr_info", {**args, "ref": "pull/22673"})
    assert up["follow"]["action"] == "upgrade" and up["follow"]["ref"] == "b21" and up["release"] == "b21"
    both = run_module("github_pr_info", {**args, "ref": "pull/1", "number": 1})
    assert both.get("failed") and "mutually exclusive" in both["msg"]
