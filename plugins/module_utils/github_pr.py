"""Pure logic of following a pull request: which PR a pin names, what GitHub's answers mean, which release
tag first contains the merge, and what the follower does about it.

No Ansible imports and no I/O: the github_pr_info module does the HTTP (or git) and hands the answers here;
unit-tested directly (tests/unit/test_github_pr.py).
"""

from __future__ import annotations

import json
import re
import time

from ansible_collections.llamafleet.mtp.plugins.module_utils.llamacpp_build import BuildInputError, parse_ref

# llama.cpp tags every master build b<N>; N grows along master, so "contains the merge" is monotonic in N.
DEFAULT_TAG_PATTERN = r"^b(\d+)$"
# The REST API version this follows (sent as X-GitHub-Api-Version).
API_VERSION = "2022-11-28"


class GitHubAnswerError(ValueError):
    """An answer the follower cannot use; the message says which request and why."""


def pr_of_ref(ref):
    """The pull request number a declared llama.cpp ref names (pull/N, refs/pull/N/head, #N, pr/N), else None."""
    try:
        parsed = parse_ref(ref)
    except BuildInputError:
        return None
    return parsed["pull"] if parsed["kind"] == "pull" else None


def tag_number(tag, pattern=DEFAULT_TAG_PATTERN):
    """The release number of a tag name (b9180 -> 9180) or None when it is not a release tag."""
    m = re.match(pattern, str(tag or ""))
    return int(m.group(1)) if m else None


def release_tags(names, pattern=DEFAULT_TAG_PATTERN):
    """Release tag names, oldest first (by number); other names dropped, duplicates once."""
    return sorted({n for n in names if tag_number(n, pattern) is not None}, key=lambda n: tag_number(n, pattern))


def first_release(tags, contains):
    """The oldest tag of ``tags`` (oldest first) that contains the merge, or None.

    ``contains(tag) -> bool`` is asked O(log n) times (binary search; containment is monotonic along master).
    """
    if not tags or not contains(tags[-1]):
        return None
    lo, hi = 0, len(tags) - 1  # tags[hi] contains
    while lo < hi:
        mid = (lo + hi) // 2
        if contains(tags[mid]):
            hi = mid
        else:
            lo = mid + 1
    return tags[hi]


def compare_contains(body):
    """GET compare/{merge}...{tag}: the tag contains the merge commit when it is ahead of it or identical."""
    status = (body or {}).get("status")
    if status not in ("ahead", "behind", "identical", "diverged"):
        raise GitHubAnswerError(f"compare answer without a known status: {status!r}")
    return status in ("ahead", "identical")


def pull_summary(body):
    """What the follower needs from GET pulls/N."""
    if not isinstance(body, dict) or "state" not in body or "number" not in body:
        raise GitHubAnswerError("the pulls answer is not a pull request object (no state/number)")
    merged = bool(body.get("merged")) or bool(body.get("merged_at"))
    return {
        "number": int(body["number"]),
        "title": body.get("title"),
        "url": body.get("html_url"),
        "state": body["state"],
        "merged": merged,
        "merged_at": body.get("merged_at"),
        "closed_at": body.get("closed_at"),
        "merge_commit_sha": body.get("merge_commit_sha") if merged else None,
        "head_sha": (body.get("head") or {}).get("sha"),
    }


def _header(headers, name):
    for k, v in (headers or {}).items():
        if str(k).lower() == name.lower():
            return v
    return None


def rate_limit_line(status, headers, body=None, now=None, what="GitHub API"):
    """One line for a rate-limit answer (403 or 429 with X-RateLimit-Remaining 0, Retry-After, or a rate-limit
    message), naming when it resets; None when the answer is not a rate limit."""
    if status not in (403, 429):
        return None
    remaining = _header(headers, "x-ratelimit-remaining")
    retry_after = _header(headers, "retry-after")
    message = ""
    if isinstance(body, (bytes, str)):
        try:
            body = json.loads(body)
        except ValueError:
            body = {}
    if isinstance(body, dict):
        message = str(body.get("message") or "")
    if not (str(remaining) == "0" or retry_after is not None or "rate limit" in message.lower()):
        return None
    now = time.time() if now is None else now
    reset = _header(headers, "x-ratelimit-reset")
    if retry_after is not None and str(retry_after).isdigit():
        at = now + int(retry_after)
    elif reset is not None and str(reset).isdigit():
        at = int(reset)
    else:
        at = None
    limit = _header(headers, "x-ratelimit-limit")
    used = f"{remaining} of {limit} requests left" if limit is not None and remaining is not None else "limit hit"
    when = (
        f"resets at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(at))} (in {max(0, int(at - now)) // 60} min)"
        if at is not None
        else "reset time not given"
    )
    return f"{what} rate limit ({status}, {used}): {when}; nothing was changed"


def decide(pin_ref, pull, release, repo="ggml-org/llama.cpp"):
    """What the follower does: {action, msg[, ref]}.

    action: ``none`` (the pin names no PR, or the PR is open, or merged but not yet in a release),
    ``warn`` (closed without merging), ``upgrade`` (merged and ``release`` contains it: ref = release).
    """
    n = pr_of_ref(pin_ref)
    if n is None:
        return {"action": "none", "msg": f"the pin {pin_ref} names no pull request: nothing to follow"}
    where = f"{repo}#{n}"
    if pull is None:
        return {"action": "none", "msg": f"{where}: no answer"}
    if pull["merged"]:
        if release:
            return {
                "action": "upgrade",
                "ref": release,
                "msg": f"{where} merged {pull['merged_at']} as {pull['merge_commit_sha']}; first release {release}: "
                f"upgrading the fleet from {pin_ref} to {release}",
            }
        return {
            "action": "none",
            "msg": f"{where} merged {pull['merged_at']} as {pull['merge_commit_sha']}; no release contains it yet",
        }
    if pull["state"] == "closed":
        return {
            "action": "warn",
            "msg": f"{where} was closed without merging ({pull.get('closed_at')}); the fleet stays on {pin_ref}: "
            "declare another ref in group_vars/all/llamafleet_release.yml",
        }
    return {"action": "none", "msg": f"{where} is open (head {pull['head_sha']}): the fleet stays on {pin_ref}"}


def git_tags_containing(output, pattern=DEFAULT_TAG_PATTERN):
    """``git tag --contains SHA`` output -> release tags, oldest first."""
    return release_tags([line.strip() for line in (output or "").splitlines() if line.strip()], pattern)
