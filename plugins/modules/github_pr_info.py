#!/usr/bin/python
"""Ansible module: the fate of a GitHub pull request and the first release tag that contains its merge."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: github_pr_info
short_description: Read a GitHub pull request's state and the first release tag that contains its merge
version_added: "0.1.0"
description:
  - Reads C(GET /repos/{repo}/pulls/{number}) of the GitHub REST API (or a GitHub Enterprise / mirror API at
    I(api_url)) and returns the pull request's state, whether it merged, when, its merge commit and head sha.
  - For a merged pull request it also finds the oldest release tag that contains the merge commit (llama.cpp tags
    every master build C(b<N>)), either through the API (I(release_from=api) - C(GET /repos/{repo}/tags) newest
    first, then C(GET /repos/{repo}/compare/{merge}...{tag}) in a binary search over the release numbers, since
    containment grows along master) or through a local git repository the controller keeps up to date
    (I(release_from=git) - C(git tag --contains {merge}) in I(git_dir)). Use C(git) when the controller reaches a
    mirror but not the API's compare endpoint, or to spend no API requests on the release at all.
  - Every API answer is kept with its C(ETag) in a small cache file per pull request under I(cache_dir); the next
    request for the same URL is conditional (C(If-None-Match)), and GitHub answers C(304 Not Modified) when
    nothing changed. An idle poll of an open pull request is exactly one request answered 304, which GitHub does
    not count against the rate limit for authenticated requests. A release once found for a merge commit is
    kept, so it is never looked up again.
  - A rate-limit answer (403 or 429 with C(X-RateLimit-Remaining 0), C(Retry-After) or a rate-limit message)
    is not a failure - it returns I(rate_limited=true) with one warning line that says when the limit resets, and
    keeps the cache as it was.
  - Runs on the controller (C(delegate_to localhost)); it changes nothing but its cache.
author:
  - llamafleet maintainers (!UNKNOWN)
options:
  repo:
    description: The repository, C(owner/name) (e.g. C(ggml-org/llama.cpp)).
    type: str
    required: true
  number:
    description: The pull request number. Exactly one of I(number) and I(ref).
    type: int
  ref:
    description:
      - A declared llama.cpp ref (the fleet's pin, C(llamacpp_mtp_build_ref)). When it names a pull request
        (C(pull/N), C(refs/pull/N/head), C(#N)) that one is read; otherwise nothing is requested and I(number) is
        returned null. With I(ref) the result also says what a follower does (I(follow)), and a pull request
        closed without merging is a warning.
    type: str
  token:
    description:
      - A GitHub token (sent as C(Authorization Bearer)); optional for public repositories (60 unauthenticated
        requests per hour instead of 5000). Never logged; default the C(GITHUB_TOKEN) environment variable - pass
        it from the environment or a vault variable, never on the command line.
    type: str
  api_url:
    description: The REST API base URL (GitHub Enterprise C(https://HOST/api/v3), or a stand-in in tests).
    type: str
    default: https://api.github.com
  release_from:
    description: Where to find the first release tag that contains the merge commit, C(none) to skip.
    type: str
    choices: [api, git, none]
    default: api
  git_dir:
    description: A local git repository (bare or not) with the upstream tags, for I(release_from=git).
    type: path
  git_fetch:
    description: With I(release_from=git), C(git fetch --tags) its default remote first (not in check mode).
    type: bool
    default: false
  tag_pattern:
    description: A regular expression of the release tags, with the release number as group 1.
    type: str
    default: ^b(\d+)$
  max_tag_pages:
    description: With I(release_from=api), at most this many pages of 100 tags are read to find the first release.
    type: int
    default: 3
  cache_dir:
    description: Where the ETag cache lives (one JSON file per pull request, mode 0600, directory 0700).
    type: path
    default: ~/.cache/llamafleet/github
  timeout:
    description: Seconds per HTTP request.
    type: int
    default: 30
  validate_certs:
    description: Verify the API's TLS certificate.
    type: bool
    default: true
attributes:
  check_mode:
    support: full
    description: Reads the same in check mode (the requests are reads); the cache file is not written and
      I(git_fetch) is skipped.
  diff_mode:
    support: none
    description: Nothing to diff.
notes:
  - Connection errors and other HTTP errors (404 no such pull request, 401 bad token) fail with the URL and the
    status; the token is never part of a message.
seealso:
  - name: GitHub REST API, conditional requests
    description: 304 answers to If-None-Match do not count against the primary rate limit.
    link: https://docs.github.com/en/rest/using-the-rest-api/best-practices-for-using-the-rest-api
"""

EXAMPLES = r"""
- name: Did the MTP pull request merge, and in which release?
  llamafleet.mtp.github_pr_info:
    repo: ggml-org/llama.cpp
    number: 22673
    token: "{{ vault_github_token | default(omit) }}"
  delegate_to: localhost
  become: false
  run_once: true
  register: mtp_pr

- name: The same, the release from the controller's mirror (kept up to date by git fetch)
  llamafleet.mtp.github_pr_info:
    repo: ggml-org/llama.cpp
    number: 22673
    release_from: git
    git_dir: /srv/mirrors/llama.cpp.git
    git_fetch: true
  delegate_to: localhost
  become: false
  run_once: true
"""

RETURN = r"""
number:
  description: The pull request number (null when I(ref) names none).
  returned: unless rate limited
  type: int
state:
  description: C(open) or C(closed) (a merged pull request is closed).
  returned: unless rate limited
  type: str
  sample: closed
merged:
  description: Whether it merged.
  returned: unless rate limited
  type: bool
merged_at:
  description: When it merged (ISO 8601), or null.
  returned: unless rate limited
  type: str
  sample: "2026-05-16T09:12:44Z"
merge_commit_sha:
  description: The commit the merge made on the base branch (null unless merged).
  returned: unless rate limited
  type: str
head_sha:
  description: The pull request's head commit.
  returned: unless rate limited
  type: str
title:
  description: Its title.
  returned: unless rate limited
  type: str
url:
  description: Its web page.
  returned: unless rate limited
  type: str
release:
  description: The oldest release tag that contains the merge commit; null when not merged or no release has it yet.
  returned: unless rate limited
  type: str
  sample: b9180
requests:
  description: HTTP requests this run made to the API (an idle poll - 1).
  returned: always
  type: int
not_modified:
  description: How many of them were answered 304 Not Modified.
  returned: always
  type: int
rate_limited:
  description: The API answered with a rate limit; nothing else is returned and nothing was changed.
  returned: always
  type: bool
follow:
  description:
    - With I(ref) - what a follower does. I(action) C(none) (the ref names no pull request, it is open, or merged
      but in no release yet), C(warn) (closed without merging) or C(upgrade) (merged, I(ref) - the release to
      move the pin to); I(msg) one line.
  returned: with I(ref), unless rate limited
  type: dict
  sample: {"action": "upgrade", "ref": "b9180", "msg": "ggml-org/llama.cpp#22673 merged ... upgrading the fleet"}
msg:
  description: One line - what the pull request's state is, or the rate-limit line with its reset time.
  returned: always
  type: str
"""

import contextlib
import json
import os
import tempfile

from ansible.module_utils.basic import env_fallback
from ansible.module_utils.urls import fetch_url
from ansible_collections.llamafleet.mtp.plugins.module_utils.github_pr import (
    API_VERSION,
    DEFAULT_TAG_PATTERN,
    GitHubAnswerError,
    compare_contains,
    decide,
    first_release,
    git_tags_containing,
    pr_of_ref,
    pull_summary,
    rate_limit_line,
    release_tags,
)
from ansible_collections.llamafleet.mtp.plugins.module_utils.secret_module import AnsibleModule


class RateLimited(Exception):
    pass


class Client:
    """Conditional GETs against the API, with the cache of ETags and bodies."""

    def __init__(self, module, cache):
        self.module = module
        self.api = module.params["api_url"].rstrip("/")
        self.cache = cache
        self.requests = 0
        self.not_modified = 0
        self.dirty = False

    def get(self, path, store=True):
        headers = {
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": API_VERSION,
            "User-Agent": "llamafleet.mtp-github_pr_info",
        }
        token = self.module.params["token"]
        if token:
            headers["Authorization"] = f"Bearer {token}"
        entry = self.cache["responses"].get(path) if store else None
        if entry and entry.get("etag"):
            headers["If-None-Match"] = entry["etag"]
        resp, info = fetch_url(
            self.module, self.api + path, headers=headers, method="GET", timeout=self.module.params["timeout"]
        )
        self.requests += 1
        status = info.get("status")
        if status == 304 and entry:
            self.not_modified += 1
            return entry["body"], entry.get("link") or ""
        # an error answer's body is in info (fetch_url read it); a 200's is in the response
        raw = info["body"] if "body" in info else (resp.read() if resp is not None else b"")
        if status == 200:
            try:
                body = json.loads(raw)
            except ValueError as e:
                raise GitHubAnswerError(f"GET {self.api}{path}: the answer is not JSON ({e})") from e
            link = info.get("link") or ""
            if store:
                self.cache["responses"][path] = {"etag": info.get("etag"), "body": body, "link": link}
                self.dirty = True
            return body, link
        line = rate_limit_line(status, info, raw)
        if line:
            raise RateLimited(line)
        detail = info.get("msg") or ""
        with contextlib.suppress(ValueError, AttributeError):
            detail = json.loads(raw).get("message") or detail
        raise GitHubAnswerError(f"GET {self.api}{path}: HTTP {status} {detail}".strip())


def release_by_api(client, repo, merge_sha, pattern, max_pages, known):
    """The oldest release tag containing merge_sha, by the tags list and compare (binary search)."""
    tag_sha, names = {}, []
    contains_memo = dict(known)

    def contains(tag):
        if tag not in contains_memo:
            if tag_sha.get(tag) == merge_sha:
                contains_memo[tag] = True
            else:
                body = client.get(f"/repos/{repo}/compare/{merge_sha}...{tag}", store=False)[0]
                contains_memo[tag] = compare_contains(body)
        return contains_memo[tag]

    for page in range(1, max_pages + 1):
        body, link = client.get(f"/repos/{repo}/tags?per_page=100&page={page}")
        if not isinstance(body, list):
            raise GitHubAnswerError(f"GET /repos/{repo}/tags: not a list of tags")
        page_tags = []
        for t in body:
            tag_sha[t["name"]] = (t.get("commit") or {}).get("sha")
            page_tags.append(t["name"])
        names.extend(page_tags)
        on_page = release_tags(page_tags, pattern)
        # The first release is on this page unless even the page's oldest release already contains the merge.
        if not on_page or not contains(on_page[0]) or 'rel="next"' not in link:
            break
    return first_release(release_tags(names, pattern), contains), contains_memo


def release_by_git(module, merge_sha, pattern):
    git = module.get_bin_path("git", required=True)
    git_dir = module.params["git_dir"]
    if module.params["git_fetch"] and not module.check_mode:
        rc, dummy, err = module.run_command([git, "--git-dir", git_dir, "fetch", "--quiet", "--tags"])
        if rc != 0:
            raise GitHubAnswerError(f"git fetch --tags in {git_dir} failed: {err.strip()}")
    rc, out, err = module.run_command([git, "--git-dir", git_dir, "tag", "--contains", merge_sha])
    if rc != 0:
        if "malformed object name" in err or "no such commit" in err:
            return None  # the mirror has not fetched the merge yet
        raise GitHubAnswerError(f"git tag --contains {merge_sha} in {git_dir} failed: {err.strip()}")
    tags = git_tags_containing(out, pattern)
    return tags[0] if tags else None


def load_cache(path):
    try:
        with open(path) as f:
            data = json.load(f)
        if isinstance(data, dict) and isinstance(data.get("responses"), dict):
            return data
    except (OSError, ValueError):
        pass
    return {"responses": {}, "contains": {}}


def save_cache(path, data):
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _counts(client):
    """The request counts of the result: requests made, and how many were answered 304."""
    return {"requests": client.requests, "not_modified": client.not_modified}


def _checked_repo(module):
    """The repository without surrounding slashes; the module fails unless it is owner/name."""
    repo = module.params["repo"].strip("/")
    if repo.count("/") != 1:
        module.fail_json(msg=f"repo must be owner/name, got {repo!r}")
    return repo


def _resolve_ref(module, repo):
    """With ref: the pull request number it names (into params); when it names none, exit with the follow that says
    so, no request made."""
    p = module.params
    if p["ref"] is None:
        return
    p["number"] = pr_of_ref(p["ref"])
    if p["number"] is None:
        follow = decide(p["ref"], None, None, repo)
        module.exit_json(
            changed=False,
            rate_limited=False,
            number=None,
            follow=follow,
            msg=follow["msg"],
            requests=0,
            not_modified=0,
        )


def _release(module, client, repo, sha):
    """The oldest release tag containing the merge commit sha: the cached one for this merge, else by the API or git;
    what is learnt goes into the cache."""
    p = module.params
    cache = client.cache
    if cache.get("release", {}).get("merge_commit_sha") == sha:
        release = cache["release"]["tag"]
    elif p["release_from"] == "api":
        known = cache["contains"].get(sha, {})
        release, memo = release_by_api(client, repo, sha, p["tag_pattern"], p["max_tag_pages"], known)
        if memo != known:  # release tags never move: what is known stays known
            cache["contains"] = {sha: memo}
            client.dirty = True
    else:
        release = release_by_git(module, sha, p["tag_pattern"])
    if release:
        cache["release"] = {"merge_commit_sha": sha, "tag": release}
        client.dirty = True
    return release


def _read_pull(module, client, repo):
    """The pull request's summary and its release (None unless merged and release_from is not none); a rate limit
    exits with its warning line, any other bad answer fails."""
    p = module.params
    try:
        body = client.get(f"/repos/{repo}/pulls/{p['number']}")[0]
        pull = pull_summary(body)
        release = None
        sha = pull["merge_commit_sha"]
        if pull["merged"] and sha and p["release_from"] != "none":
            release = _release(module, client, repo, sha)
    except RateLimited as e:
        module.warn(str(e))
        module.exit_json(changed=False, rate_limited=True, msg=str(e), **_counts(client))
    except GitHubAnswerError as e:
        module.fail_json(msg=str(e), rate_limited=False, **_counts(client))
    return pull, release


def _save_changed_cache(module, client, cache_path):
    """Write the cache when this run changed it, except in check mode; a failed write is only a warning."""
    if client.dirty and not module.check_mode:
        try:
            save_cache(cache_path, client.cache)
        except OSError as e:
            module.warn(f"could not write the cache {cache_path}: {e} (the next poll is not conditional)")


def _result(module, client, repo, pull, release):
    """The module's result: the pull request's fields, its release and one-line msg; with ref, what a follower does
    (its msg, and a warning when it is warn)."""
    p = module.params
    where = f"{repo}#{pull['number']}"
    if pull["merged"]:
        msg = f"{where} merged {pull['merged_at']} ({pull['merge_commit_sha']}); first release: {release or 'none yet'}"
    else:
        msg = f"{where} is {pull['state']} (head {pull['head_sha']})"
    result = dict(changed=False, rate_limited=False, release=release, msg=msg, **pull, **_counts(client))
    if p["ref"] is not None:
        result["follow"] = decide(p["ref"], pull, release, repo)
        result["msg"] = result["follow"]["msg"]
        if result["follow"]["action"] == "warn":
            module.warn(result["msg"])
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            repo=dict(type="str", required=True),
            number=dict(type="int"),
            ref=dict(type="str"),
            token=dict(type="str", no_log=True, fallback=(env_fallback, ["GITHUB_TOKEN"])),
            api_url=dict(type="str", default="https://api.github.com"),
            release_from=dict(type="str", choices=["api", "git", "none"], default="api"),
            git_dir=dict(type="path"),
            git_fetch=dict(type="bool", default=False),
            tag_pattern=dict(type="str", default=DEFAULT_TAG_PATTERN),
            max_tag_pages=dict(type="int", default=3),
            cache_dir=dict(type="path", default="~/.cache/llamafleet/github"),
            timeout=dict(type="int", default=30),
            validate_certs=dict(type="bool", default=True),
        ),
        required_if=[("release_from", "git", ("git_dir",))],
        required_one_of=[("number", "ref")],
        mutually_exclusive=[("number", "ref")],
        supports_check_mode=True,
    )
    p = module.params
    repo = _checked_repo(module)
    _resolve_ref(module, repo)
    cache_path = os.path.join(p["cache_dir"], f"{repo.replace('/', '_')}_pull_{p['number']}.json")
    cache = load_cache(cache_path)
    cache.setdefault("contains", {})
    client = Client(module, cache)
    pull, release = _read_pull(module, client, repo)
    _save_changed_cache(module, client, cache_path)
    module.exit_json(**_result(module, client, repo, pull, release))


if __name__ == "__main__":
    main()
