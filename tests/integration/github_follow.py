"""The GitHub side of the fleet follower test (test_fleet_playbooks.py test_2): the GitHub stand-in with PR #22673
in a chosen state, and what a follow_pr.yml run that must change nothing looks like.

STAND-IN: api.github.com (tests/harness/github_standin.py, its REST contract for pulls/N, tags and compare with
ETag/304 and the 403 rate limit). The PR's head and merge commits and the release tag are the local llama.cpp
mirror's (refs/pull/22673/head, master, tag b9180 - tests/harness/llamacpp/mirror.sh), so the release the
follower picks is one the build role builds from the mirror.
"""

from __future__ import annotations

import json
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

from tests.harness import github_standin

RELEASE = "b9180"  # the mirror's stand-in for the first release that contains the merge
SLOWER = "b9181"  # the mirror's stand-in for a later release whose decode is slower (tests/harness/llamacpp/mirror.sh)
STATES = ("open", "rate_limited", "closed", "merged")


class GitHub:
    """The stand-in serving ggml-org/llama.cpp#22673 from the mirror; ``set(state)`` flips it."""

    def __init__(self, tmp: Path, mirror: Path):
        self.tmp, self.mirror = tmp, mirror
        self.state_path = tmp / "github-state.json"
        self.sha = {
            ref: subprocess.run(
                ["git", "--git-dir", str(mirror), "rev-parse", f"{ref}^{{commit}}"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            for ref in ("refs/pull/22673/head", "refs/heads/master", f"refs/tags/{RELEASE}", f"refs/tags/{SLOWER}")
        }
        self.set("open")
        self.server, _ = github_standin.serve(self.state_path)
        self.flipped_at = None
        # what follow_pr.yml gets: the stand-in's API and a cache of its own
        self.extravars = {
            "llamafleet_follow_api_url": self.server.endpoint,
            "llamafleet_follow_cache_dir": str(tmp / "github-cache"),
        }

    def set(self, state, release=RELEASE):
        """``release``: the tag of the first release that contains the merge (``merged``): RELEASE on the mainline
        commit, or SLOWER, a commit on top of it (the merge commit is then that commit)."""
        assert state in STATES, state
        pull = {"title": "llama : add MTP speculative decoding", "head_sha": self.sha["refs/pull/22673/head"]}
        repo = {"git_dir": str(self.mirror), "tags": ["mainline-0c1e570"], "pulls": {"22673": pull}}
        top = {}
        if state == "closed":
            pull.update(state="closed", closed_at="2026-05-15T10:00:00Z")
        elif state == "merged":
            merged_at = "2026-05-16T09:12:44Z"
            merge = self.sha["refs/heads/master" if release == RELEASE else f"refs/tags/{release}"]
            pull.update(state="closed", merged=True, merged_at=merged_at, merge_commit_sha=merge)
            repo["tags"] += [RELEASE] if release == RELEASE else [RELEASE, release]
        elif state == "rate_limited":
            top["rate_limited"] = True
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"repos": {"ggml-org/llama.cpp": repo}, **top}))
        tmp.replace(self.state_path)
        self.flipped_at = time.time()

    def requests_since(self, n):
        return [(r["path"], r["status"]) for r in self.server.requests[n:]]

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def module_result(run):
    """The github_pr_info result of a follow_pr.yml run (its job event)."""
    (res,) = [
        e["event_data"]["res"]
        for e in run.events
        if e.get("event") == "runner_on_ok" and e["event_data"].get("task", "").startswith("Read the pull request")
    ]
    return res


def warnings(run):
    """Every warning a module returned in the run (job events)."""
    return [w for e in run.events for w in ((e.get("event_data") or {}).get("res") or {}).get("warnings", [])]


def assert_nothing_changed(run, hosts, pin):
    """A follower run that must leave the fleet alone: changed=0 on every host, no host contacted (only the
    controller task ran), the pin as it was."""
    assert run.status == "successful", (run.status, run.failures())
    for h in hosts:
        assert run.changed(h) == 0, (h, run.changed_tasks(h))
    # the facts stage's read of each host (GPU topology and what it runs) is the first contact with a host
    assert run.hosts_in("Read the host - GPU topology") == set() and run.hosts_in("Restart") == set()
    assert pin() == "pull/22673"


def last_host_served(run, hosts):
    """Wall time at which the last host passed its health gate on the new build (the converge's job events)."""
    times = {}
    for e in run.events:
        d = e.get("event_data") or {}
        gate = (d.get("task") or "").startswith("Health gate")
        if e.get("event") == "runner_on_ok" and gate and d.get("host") in hosts:
            t = datetime.fromisoformat(e["created"].replace("Z", "+00:00"))
            t = (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()  # ansible-runner writes UTC
            times[d["host"]] = max(times.get(d["host"], 0), t)
    assert set(times) == set(hosts), times
    return max(times.values())
