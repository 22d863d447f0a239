#!/usr/bin/env python3
"""GitHub REST API stand-in: a small HTTP server for tests (test-only code).

STAND-IN: api.github.com cannot be reached from the test machines, so this server answers the endpoints the
fleet follower (llamafleet.mtp.github_pr_info) uses, with GitHub's contract (REST API version 2022-11-28):

    GET /repos/{owner}/{repo}/pulls/{n}                    the pull request object (number, state, merged,
                                                           merged_at, closed_at, merge_commit_sha, head{sha,ref},
                                                           base{ref}, title, html_url)
    GET /repos/{owner}/{repo}/tags[?per_page=&page=]       [{name, commit{sha,url}, zipball_url, tarball_url}],
                                                           newest release first, Link rel="next"/"last" paging
    GET /repos/{owner}/{repo}/compare/{base}...{head}      {status: ahead|behind|identical|diverged, ahead_by,
                                                           behind_by, base_commit{sha}, merge_base_commit{sha}},
                                                           computed from a real git repository (the mirror)

Every 200 carries a weak ``ETag`` (W/"<sha256 of the body>"); a request whose ``If-None-Match`` matches gets
``304 Not Modified`` with no body, which (as on GitHub for conditional requests) does not use up the rate limit.
Every answer carries ``X-RateLimit-Limit/-Remaining/-Used/-Reset/-Resource``. When the rate limit is used up (or the
state says ``rate_limited``) the answer is GitHub's: ``403`` with ``X-RateLimit-Remaining: 0``, the reset time and
``{"message": "API rate limit exceeded for ..."}``. Unknown repo/pull/ref: ``404 {"message": "Not Found"}``. A
token not in ``tokens`` (when the state lists some): ``401 {"message": "Bad credentials"}``. No GraphQL, no
writes, no search, no webhooks.

The state is a JSON file read on every request, so a test flips it by rewriting the file (atomically)::

    {"rate_limit": {"limit": 60, "remaining": 60, "reset_in": 3600},   # optional
     "rate_limited": false,                                             # optional: answer 403 rate limit
     "tokens": ["..."],                                                 # optional: only these are valid
     "repos": {"ggml-org/llama.cpp": {
         "git_dir": "/var/cache/llama-mtp-fleet/git/llama.cpp.git",     # for shas of tags and compare
         "tags": ["b9180"],                                             # the tags GitHub shows (names in git_dir)
         "pulls": {"22673": {"title": "...", "state": "open" | "closed", "merged": false,
                             "merged_at": null, "closed_at": null, "merge_commit_sha": null,
                             "head_sha": "...", "head_ref": "mtp"}}}}}

Stdlib only. CLI: ``python3 tests/harness/github_standin.py --state F [--port 0] [--port-file F] [--log F]``.
Import: ``serve(state_path, host, port) -> (server, thread)``; ``server.endpoint`` the base URL (the module's
``api_url``), ``server.requests`` the log (method, path, status, auth, if_none_match); stop with
``server.shutdown(); server.server_close()``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

DOCS = "https://docs.github.com/rest"


def _git(git_dir, *args):
    out = subprocess.run(["git", "--git-dir", str(git_dir), *args], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else None


def _sha(git_dir, ref):
    return _git(git_dir, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")


def _tag_key(name):
    m = re.match(r"^b(\d+)$", name)
    return (0, -int(m.group(1)), "") if m else (1, 0, name)


class Handler(BaseHTTPRequestHandler):
    server_version = "GitHub.com-standin"
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def _send(self, status, body=None, extra=None):
        srv = self.server
        data = b"" if body is None else json.dumps(body, indent=1).encode()
        headers = {
            "X-RateLimit-Limit": str(srv.limit),
            "X-RateLimit-Remaining": str(max(0, srv.limit - srv.used)),
            "X-RateLimit-Used": str(srv.used),
            "X-RateLimit-Reset": str(srv.reset),
            "X-RateLimit-Resource": "core",
            "X-GitHub-Api-Version-Selected": "2022-11-28",
            **(extra or {}),
        }
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        if body is not None:
            self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if data and self.command != "HEAD":
            self.wfile.write(data)
        entry = {
            "t": time.time(),
            "method": self.command,
            "path": self.path,
            "status": status,
            "auth": "Authorization" in self.headers,
            "if_none_match": self.headers.get("If-None-Match"),
        }
        srv.requests.append(entry)
        if srv.log:
            with open(srv.log, "a") as f:
                f.write(json.dumps(entry) + "\n")

    def do_GET(self):  # noqa: N802 - http.server's name
        srv = self.server
        try:
            state = json.loads(Path(srv.state_path).read_text())
        except (OSError, ValueError) as e:
            return self._send(500, {"message": f"stand-in state unreadable: {e}"})
        rl = state.get("rate_limit") or {}
        srv.limit = int(rl.get("limit", 60))
        if time.time() >= srv.reset:
            srv.used, srv.reset = 0, int(time.time()) + int(rl.get("reset_in", 3600))
        if "remaining" in rl:
            srv.used = max(srv.used, srv.limit - int(rl["remaining"]))
        auth = self.headers.get("Authorization", "")
        if state.get("tokens") and auth and auth.split(" ", 1)[-1] not in state["tokens"]:
            return self._send(401, {"message": "Bad credentials", "documentation_url": DOCS, "status": "401"})
        if state.get("rate_limited") or srv.used >= srv.limit:  # the flag: this answer only, the count stays
            return self._send(
                403,
                {
                    "message": "API rate limit exceeded for 127.0.0.1. (But here's the good news: Authenticated "
                    "requests get a higher rate limit. Check out the documentation for more details.)",
                    "documentation_url": DOCS + "/overview/resources-in-the-rest-api#rate-limiting",
                },
                {"X-RateLimit-Remaining": "0", "X-RateLimit-Used": str(srv.limit)},
            )
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        m = re.match(r"^/repos/([^/]+)/([^/]+)/(pulls|tags|compare)(?:/(.+))?$", url.path)
        repo = (state.get("repos") or {}).get(f"{m.group(1)}/{m.group(2)}") if m else None
        if not repo:
            return self._send(404, {"message": "Not Found", "documentation_url": DOCS, "status": "404"})
        kind, rest = m.group(3), unquote(m.group(4) or "")
        extra = {}
        if kind == "pulls" and rest.isdigit() and rest in (repo.get("pulls") or {}):
            body = self._pull(m.group(1), m.group(2), int(rest), repo["pulls"][rest])
        elif kind == "tags" and not rest:
            body, extra = self._tags(m.group(1), m.group(2), repo, query)
        elif kind == "compare" and "..." in rest:
            body = self._compare(repo, *rest.split("...", 1))
        else:
            body = None
        if body is None:
            return self._send(404, {"message": "Not Found", "documentation_url": DOCS, "status": "404"})
        etag = 'W/"' + hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest() + '"'
        extra["ETag"] = etag
        if self.headers.get("If-None-Match") in (etag, etag[2:]):
            return self._send(304, None, extra)
        srv.used += 1
        return self._send(200, body, extra)

    def _pull(self, owner, name, n, p):
        merged = bool(p.get("merged"))
        return {
            "url": f"{self.server.endpoint}/repos/{owner}/{name}/pulls/{n}",
            "html_url": f"https://github.com/{owner}/{name}/pull/{n}",
            "number": n,
            "state": "closed" if merged else p.get("state", "open"),
            "title": p.get("title", f"PR {n}"),
            "merged": merged,
            "merged_at": p.get("merged_at") if merged else None,
            "closed_at": p.get("closed_at") or (p.get("merged_at") if merged else None),
            "merge_commit_sha": p.get("merge_commit_sha"),
            "head": {"ref": p.get("head_ref", f"pr-{n}"), "sha": p.get("head_sha")},
            "base": {"ref": p.get("base_ref", "master")},
        }

    def _tags(self, owner, name, repo, query):
        tags = repo.get("tags") or []
        if isinstance(tags, list):
            tags = {t: _sha(repo["git_dir"], f"refs/tags/{t}") for t in tags}
        rows = [
            {
                "name": t,
                "commit": {"sha": sha, "url": f"{self.server.endpoint}/repos/{owner}/{name}/commits/{sha}"},
                "zipball_url": f"{self.server.endpoint}/repos/{owner}/{name}/zipball/refs/tags/{t}",
                "tarball_url": f"{self.server.endpoint}/repos/{owner}/{name}/tarball/refs/tags/{t}",
            }
            for t, sha in sorted(tags.items(), key=lambda kv: _tag_key(kv[0]))
            if sha
        ]
        per_page = max(1, min(100, int(query.get("per_page", 30))))
        page = max(1, int(query.get("page", 1)))
        last = max(1, -(-len(rows) // per_page))
        links = []
        base = f"{self.server.endpoint}/repos/{owner}/{name}/tags?per_page={per_page}"
        if page < last:
            links.append(f'<{base}&page={page + 1}>; rel="next"')
            links.append(f'<{base}&page={last}>; rel="last"')
        return rows[(page - 1) * per_page : page * per_page], ({"Link": ", ".join(links)} if links else {})

    def _compare(self, repo, base, head):
        g = repo["git_dir"]
        b, h = _sha(g, base), _sha(g, head)
        if not b or not h:
            return None
        counts = _git(g, "rev-list", "--left-right", "--count", f"{b}...{h}") or "0\t0"
        behind, ahead = (int(x) for x in counts.split())
        status = "identical" if b == h else "ahead" if behind == 0 else "behind" if ahead == 0 else "diverged"
        return {
            "status": status,
            "ahead_by": ahead,
            "behind_by": behind,
            "total_commits": ahead,
            "base_commit": {"sha": b},
            "merge_base_commit": {"sha": _git(g, "merge-base", b, h)},
        }


def serve(state_path, host="127.0.0.1", port=0, log=None):
    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    server.state_path = str(state_path)
    server.log = log
    server.requests = []
    server.limit, server.used, server.reset = 60, 0, 0
    server.endpoint = f"http://{host}:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--state", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file")
    ap.add_argument("--log")
    a = ap.parse_args()
    server, thread = serve(a.state, a.host, a.port, a.log)
    if a.port_file:
        Path(a.port_file).write_text(str(server.server_address[1]))
    print(server.endpoint, flush=True)
    try:
        thread.join()
    except KeyboardInterrupt:
        server.shutdown()


if __name__ == "__main__":
    main()
