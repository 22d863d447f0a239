#!/usr/bin/env python3
"""Let apt itself read sources files: `apt-get update` with nothing but them configured.

stdin: {"groups": {NAME: {FILENAME: CONTENT, ...}}, "urls": [URL, ...]}
stdout: {"groups": {NAME: {"rc", "output", "seconds"}}, "urls": {URL: HTTP status or error}}
Each group gets a scratch apt tree (its own lists and cache) under /tmp/cuda-source-check/NAME,
so the host's apt configuration and lists are untouched.
"""

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

ROOT = "/tmp/cuda-source-check"


def apt_update(name, files):
    tree = os.path.join(ROOT, name)
    shutil.rmtree(tree, ignore_errors=True)
    for sub in ("sources", "lists/partial", "cache/archives/partial"):
        os.makedirs(os.path.join(tree, sub))
    for filename, content in files.items():
        with open(os.path.join(tree, "sources", filename), "w") as fh:
            fh.write(content)
    opts = {
        "Dir::Etc::SourceList": "/dev/null",
        "Dir::Etc::SourceParts": f"{tree}/sources",
        "Dir::State::Lists": f"{tree}/lists",
        "Dir::Cache": f"{tree}/cache",
        "Acquire::Retries": "0",
        "Acquire::http::Timeout": "10",
        "Acquire::https::Timeout": "10",
    }
    argv = ["apt-get", "update", "--error-on=any"]
    for k, v in opts.items():
        argv += ["-o", f"{k}={v}"]
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, LC_ALL="C"), check=False)
    return {"rc": proc.returncode, "output": proc.stdout + proc.stderr, "seconds": round(time.monotonic() - t0, 1)}


def head(url):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError as e:
        return str(e)


def main():
    payload = json.load(sys.stdin)
    result = {"groups": {n: apt_update(n, f) for n, f in payload.get("groups", {}).items()}}
    result["urls"] = {u: head(u) for u in payload.get("urls", [])}
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
