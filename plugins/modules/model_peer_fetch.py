#!/usr/bin/python
# MIT License (see LICENSE)
"""Ansible module llamafleet.mtp.model_peer_fetch: fetch model files from peers' shares, verify, adopt."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_peer_fetch
short_description: Fetch model files from other hosts' shares (rsync), verify each against its pin, adopt it
version_added: "0.9.0"
description:
  - For each of O(files), asks its O(files[].sources) in order (hosts running a llamafleet.mtp.model_share)
    with the distribution's C(rsync) client into the file's temp name C(DIR/.NAME.incoming), resuming what an
    earlier try left there (C(--append-verify)); then checks size and sha256 against the pinned values and
    renames it into place atomically with its sidecar, exactly as a copy from the controller is adopted.
  - A source that cannot be reached, refuses, stalls for O(timeout) seconds, is slower than O(min_rate_kib) on
    average, or sends a file that does not verify (deleted, never adopted) is recorded in the file's
    C(attempts) and the next source is asked. A file no source could deliver ends with status C(failed) and
    the module still succeeds - the model_fetch role then copies it from the controller.
  - A file with O(files[].pieces) is gathered instead - each piece from its holder's share (C(DIR/.NAME.piece-I),
    the controller sent it there), up to O(piece_parallel) at once, each checked against its
    O(files[].piece_sha256) and written at its offset into the temp name; a piece this host already holds (the
    controller's, or one an interrupted run left) is used as it is once it verifies, and a region of the temp name
    that already matches its piece is kept. Then the whole file is verified and adopted as above. A piece no source
    delivers fails the file (the role then copies it whole from the controller); the pieces it fetched are
    deleted once written, the ones it was sent are left for the role to remove after the shares stop.
  - A file already in place and verified (its sidecar vouches for it) is left alone.
  - The share's one-time token goes to rsync in a root-only temporary file (C(--password-file)), never in
    an argument list or the journal.
author:
  - llamafleet maintainers (!UNKNOWN)
options:
  files:
    description: What to fetch.
    type: list
    elements: dict
    required: true
    suboptions:
      model:
        description: The model's name (the share's rsync module on each source).
        type: str
        required: true
      name:
        description: The file's name within the model's directory.
        type: str
        required: true
      path:
        description: Absolute installed path on this host.
        type: path
        required: true
      sha256:
        description: Expected sha256 (the pin).
        type: str
        required: true
      size:
        description: Expected size in bytes.
        type: int
      sources:
        description: Hosts to ask, in order - C(host) (its inventory name) and C(address).
        type: list
        elements: dict
        required: true
      pieces:
        description:
          - Gather the file from pieces - C(index), C(offset), C(size) and C(holder) (the inventory name of the
            host whose share serves it, one of O(files[].sources), or this host for the piece it was sent).
        type: list
        elements: dict
      piece_sha256:
        description: The sha256 of each piece, by index (the controller computes them as it splits the file).
        type: list
        elements: str
  port:
    description: The shares' port.
    type: int
    default: 8873
  secret:
    description: The shares' one-time token.
    type: str
    required: true
  bwlimit_kib:
    description: Bandwidth cap per transfer in KiB/s (rsync C(--bwlimit)); 0 for none.
    type: int
    default: 0
  timeout:
    description: Seconds without progress (or to connect) before a source is given up.
    type: int
    default: 60
  piece_parallel:
    description: Pieces fetched at once (each from its own holder).
    type: int
    default: 16
  min_rate_kib:
    description:
      - A source that has not delivered the file after its size at this average rate (plus O(timeout)) is given
        up and the next one asked (what was received is kept and resumed); 0 for no such limit. Pieces - every
        piece within the whole file's time at this rate (they arrive side by side).
    type: int
    default: 0
  owner:
    description: Owner of adopted files and sidecars.
    type: str
  group:
    description: Group of adopted files and sidecars.
    type: str
  mode:
    description: Mode (octal string) of adopted files and sidecars.
    type: str
requirements:
  - rsync on the host.
attributes:
  check_mode:
    support: full
    description: >-
      Reports which files it would fetch and from which source first, or from which peers in pieces
      (C(would_fetch)); fetches nothing.
  diff_mode:
    support: none
    description: Files are binary model weights.
"""

EXAMPLES = r"""
- name: Fetch the tiny model from a peer, the controller being the role's fallback
  llamafleet.mtp.model_peer_fetch:
    files:
      - model: tiny
        name: tiny.gguf
        path: /var/lib/llama-models/tiny/tiny.gguf
        sha256: "{{ pinned }}"
        sources:
          - host: gpu-01
            address: 10.0.0.11
    secret: "{{ one_time_token }}"
    owner: root
    group: llama-server
    mode: "0640"
"""

RETURN = r"""
files:
  description:
    - Per file - C(model), C(name), C(path), C(status) (C(adopted), C(ok) already in place, C(failed),
      C(would_fetch) in check mode), C(source) (the host it came from), C(seconds), C(bytes) received,
      C(attempts) (C(host), C(error)) for the sources that failed; a gathered file also C(pieces) (how many)
      and C(source) the holders it came from.
  returned: always
  type: list
  elements: dict
"""

import hashlib
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.llamafleet.mtp.plugins.module_utils.model_fanout import piece_name
from ansible_collections.llamafleet.mtp.plugins.module_utils.model_files import (
    SHA256_RE,
    VerifyError,
    adopt,
    check_file,
    fsync_path,
    incoming_path,
    size_or_zero,
)
from ansible_collections.llamafleet.mtp.plugins.module_utils.secret_module import AnsibleModule

RSYNC_ERRORS = {
    5: "the share refused the token",
    10: "cannot connect",
    12: "the transfer broke off",
    23: "the share does not have the file",
    30: "no progress within the timeout",
    35: "cannot connect within the timeout",
}


def source_url(address: str, port: int, model: str, name: str) -> str:
    host = f"[{address}]" if ":" in address and not address.startswith("[") else address
    return f"rsync://llamafleet@{host}:{port}/{model}/{name}"


def rsync_argv(url: str, dest: str, password_file: str, p: dict) -> list[str]:
    argv = [
        "rsync",
        "--inplace",
        "--append-verify",
        "--no-motd",
        f"--timeout={p['timeout']}",
        f"--contimeout={p['timeout']}",
        f"--password-file={password_file}",
    ]
    if p["bwlimit_kib"]:
        argv.append(f"--bwlimit={p['bwlimit_kib']}")
    return argv + [url, dest]


def deadline_of(size: int | None, p: dict) -> float | None:
    if not p["min_rate_kib"] or not size:
        return None
    return size / (p["min_rate_kib"] * 1024.0) + p["timeout"]


def run_rsync(run_command, argv: list[str], deadline: float | None) -> str | None:
    """None on success, else why it failed. ``run_command``: AnsibleModule.run_command; the deadline goes through
    coreutils' timeout (exit 124)."""
    if deadline is not None:
        argv = ["timeout", f"{deadline:.0f}", *argv]
    rc, _out, err = run_command(argv)
    if rc == 0:
        return None
    if deadline is not None and rc == 124:
        return f"slower than the minimum rate (no file after {deadline:.0f} s)"
    why = RSYNC_ERRORS.get(rc, f"rsync exit {rc}")
    detail = (err or "").strip().splitlines()
    return f"{why}: {detail[0]}" if detail else why


def entry(f: dict, status: str, source: str | None = None) -> dict:
    """A file's result before any transfer."""
    return {"model": f["model"], "name": f["name"], "path": f["path"], "status": status, "source": source,
            "seconds": 0.0, "bytes": 0, "attempts": []}  # fmt: skip


def fetch_one(module, f: dict, p: dict, fs: dict, password_file: str) -> dict:
    """Ask the sources in order until one delivers a file that verifies."""
    path = f["path"]
    out = entry(f, "failed")
    incoming = incoming_path(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    started = time.monotonic()
    for src in f["sources"]:
        had = size_or_zero(incoming)
        url = source_url(str(src["address"]), p["port"], f["model"], f["name"])
        why = run_rsync(module.run_command, rsync_argv(url, incoming, password_file, p), deadline_of(f.get("size"), p))
        got = size_or_zero(incoming) - had
        out["bytes"] += max(got, 0)
        if why is None:
            try:
                adopt(
                    incoming, path, f["sha256"].lower(), f.get("size"), source={"origin": f"peer {src['host']}"}, **fs
                )
            except VerifyError as e:
                out["attempts"].append({"host": src["host"], "error": f"refused its copy: {e}"})
                continue
            out.update(status="adopted", source=src["host"])
            break
        out["attempts"].append({"host": src["host"], "error": why})
    out["seconds"] = round(time.monotonic() - started, 2)
    return out


CHUNK = 4 * 1024 * 1024


def region_sha256(path: str, offset: int, size: int) -> str | None:
    """sha256 of ``size`` bytes of ``path`` from ``offset``; None when the file is shorter."""
    if not os.path.exists(path) or os.path.getsize(path) < offset + size:
        return None
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(offset)
        left = size
        while left > 0:
            block = f.read(min(CHUNK, left))
            if not block:
                return None
            h.update(block)
            left -= len(block)
    return h.hexdigest()


def place_piece(piece_path: str, incoming: str, offset: int) -> str:
    """Write a piece at its offset into the temp name, hashing it on the way (one read of the piece): returns its
    sha256. The caller compares it with the piece's own; a piece that does not match leaves its region wrong,
    which the whole file's check refuses and a rerun's region check fetches again. No fsync here: the gathered
    file is synced once, before it is verified and adopted."""
    h = hashlib.sha256()
    fd = os.open(incoming, os.O_WRONLY)
    try:
        with open(piece_path, "rb") as src:
            pos = offset
            while True:
                block = src.read(CHUNK)
                if not block:
                    break
                h.update(block)
                os.pwrite(fd, block, pos)
                pos += len(block)
    finally:
        os.close(fd)
    return h.hexdigest()


def fetch_piece(module, f: dict, piece: dict, ctx: dict, local: str) -> str | None:
    """Fetch a piece from its holder's share into ``local`` (resumed where a shorter copy is there): None, or
    why not."""
    p = ctx["p"]
    name = piece_name(f["name"], piece["index"])
    url = source_url(str(ctx["addresses"][piece["holder"]]), p["port"], f["model"], name)
    why = run_rsync(module.run_command, rsync_argv(url, local, ctx["password_file"], p), ctx["deadline"])
    return None if why is None else f"piece {piece['index'] + 1}: {why}"


def gather_piece(module, f: dict, piece: dict, ctx: dict) -> dict:
    """One piece into the temp name: kept when its region already matches, else the piece file this host holds
    (sent by the controller, or left by an interrupted run) or fetches from its holder, written at its offset
    and checked against its sha256 on the way. Returns {index, holder, bytes, fetched, error}."""
    incoming, n = ctx["incoming"], piece["index"] + 1
    want = str(f["piece_sha256"][piece["index"]]).lower()
    out = {"index": piece["index"], "holder": piece["holder"], "bytes": 0, "fetched": False, "error": None}
    if ctx["resume"] and region_sha256(incoming, piece["offset"], piece["size"]) == want:
        return out
    local = os.path.join(os.path.dirname(f["path"]), os.path.basename(piece_name(f["name"], piece["index"])))
    served = piece["holder"] in ctx["addresses"]  # another host serves it; else it is this host's own
    if size_or_zero(local) == piece["size"] and place_piece(local, incoming, piece["offset"]) == want:
        if served:
            os.unlink(local)  # only this host's own piece stays, for the peers still gathering it
        return out
    if not served:
        out["error"] = f"piece {n}: " + (
            "this host's copy does not match its sha256 and no other host holds it"
            if os.path.exists(local)
            else f"its holder {piece['holder']} is not serving"
        )
        return out
    if size_or_zero(local) >= piece["size"]:
        os.unlink(local)  # whole but wrong (a rerun's leftover): fetched again from the start
    had = size_or_zero(local)
    why = fetch_piece(module, f, piece, ctx, local)
    out["bytes"], out["fetched"] = max(size_or_zero(local) - had, 0), True
    if why is None and size_or_zero(local) != piece["size"]:
        why = f"refused its copy: piece {n} is not {piece['size']} bytes"
    elif why is None and place_piece(local, incoming, piece["offset"]) != want:
        why = f"refused its copy: piece {n} does not match its sha256"
    if why is None or why.startswith("refused"):
        os.unlink(local)  # placed, or refused: never kept
    out["error"] = why
    return out


def gather_one(module, f: dict, p: dict, fs: dict, password_file: str) -> dict:
    """Gather a file from its pieces, then verify and adopt it."""
    path, incoming = f["path"], incoming_path(f["path"])
    out = entry(f, "failed")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    started = time.monotonic()
    resume = os.path.exists(incoming)
    with open(incoming, "ab") as fh:  # the temp name at the file's size; pieces land at their offsets
        fh.truncate(int(f["size"]))
    if p["bwlimit_kib"]:  # the cap is this host's, shared by the pieces that arrive side by side
        p = dict(p, bwlimit_kib=max(1, p["bwlimit_kib"] // max(1, min(p["piece_parallel"], len(f["pieces"])))))
    ctx = {"p": p, "incoming": incoming, "resume": resume, "password_file": password_file,
           "addresses": {s["host"]: s["address"] for s in f["sources"]},
           "deadline": deadline_of(f["size"], p)}  # fmt: skip
    with ThreadPoolExecutor(max_workers=max(1, p["piece_parallel"])) as pool:
        done = list(pool.map(lambda piece: gather_piece(module, f, piece, ctx), f["pieces"]))
    out["bytes"] = sum(d["bytes"] for d in done)
    out["pieces"] = len(done)
    out["attempts"] = [{"host": d["holder"], "error": d["error"]} for d in done if d["error"]]
    holders = sorted({d["holder"] for d in done if d["fetched"] and not d["error"]})
    if not out["attempts"]:
        fsync_path(incoming)  # the pieces were written without a sync: one, before adopting
        try:
            adopt(incoming, path, f["sha256"].lower(), f["size"],
                  source={"origin": "peers " + ", ".join(holders) + " (pieces)"}, **fs)  # fmt: skip
            out.update(status="adopted", source=", ".join(holders) + " (pieces)")
        except VerifyError as e:
            out["attempts"].append({"host": ", ".join(holders), "error": f"refused the gathered file: {e}"})
    out["seconds"] = round(time.monotonic() - started, 2)
    return out


def bad_entries(files: list) -> list[str]:
    out = []
    for f in files:
        if not str(f["path"]).startswith("/"):
            out.append(f"{f['path']}: path must be absolute")
        if not SHA256_RE.match(str(f["sha256"]).lower()):
            out.append(f"{f['path']}: sha256 must be 64 hex digits")
        if any(not isinstance(s, dict) or not s.get("host") or not s.get("address") for s in f["sources"]):
            out.append(f"{f['path']}: each source needs host and address")
        out += bad_pieces(f)
    return out


def bad_pieces(f: dict) -> list[str]:
    """A gathered file's pieces must tile it, each with a holder and (outside check mode) a sha256."""
    if not f.get("pieces"):
        return []
    out, pos = [], 0
    if f.get("size") is None:
        out.append(f"{f['path']}: pieces need the file's size")
    for piece in sorted(f["pieces"], key=lambda x: int(x.get("offset", -1))):
        if not all(k in piece for k in ("index", "offset", "size", "holder")):
            out.append(f"{f['path']}: each piece needs index, offset, size and holder")
            return out
        if int(piece["offset"]) != pos or int(piece["size"]) < 1:
            out.append(f"{f['path']}: the pieces do not tile the file at byte {pos}")
            return out
        pos += int(piece["size"])
    if f.get("size") is not None and pos != int(f["size"]):
        out.append(f"{f['path']}: the pieces cover {pos} bytes of {f['size']}")
    sums = f.get("piece_sha256") or []
    if sums and (len(sums) != len(f["pieces"]) or not all(SHA256_RE.match(str(x).lower()) for x in sums)):
        out.append(f"{f['path']}: piece_sha256 needs one sha256 per piece")
    return out


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "files": {
                "type": "list",
                "elements": "dict",
                "required": True,
                "options": {
                    "model": {"type": "str", "required": True},
                    "name": {"type": "str", "required": True},
                    "path": {"type": "path", "required": True},
                    "sha256": {"type": "str", "required": True},
                    "size": {"type": "int"},
                    "sources": {"type": "list", "elements": "dict", "required": True},
                    "pieces": {"type": "list", "elements": "dict"},
                    "piece_sha256": {"type": "list", "elements": "str"},
                },
            },
            "port": {"type": "int", "default": 8873},
            "secret": {"type": "str", "required": True, "no_log": True},
            "bwlimit_kib": {"type": "int", "default": 0},
            "timeout": {"type": "int", "default": 60},
            "min_rate_kib": {"type": "int", "default": 0},
            "piece_parallel": {"type": "int", "default": 16},
            "owner": {"type": "str"},
            "group": {"type": "str"},
            "mode": {"type": "str"},
        },
        supports_check_mode=True,
    )
    p = module.params
    problems = bad_entries(p["files"])
    if problems:
        module.fail_json(msg="model_peer_fetch: " + "; ".join(problems))
    fs = {"owner": p["owner"], "group": p["group"], "mode": int(p["mode"], 8) if p["mode"] else None}
    results, changed = [], False
    password_file = None
    try:
        for f in p["files"]:
            state = check_file(f["path"], f["sha256"].lower(), f.get("size"), write=False)
            if state["status"] == "ok":
                results.append(entry(f, "ok"))
                continue
            changed = True
            if module.check_mode:
                first = f["sources"][0]["host"] if f["sources"] else None
                if f.get("pieces"):
                    first = ", ".join(sorted({x["holder"] for x in f["pieces"]} & {x["host"] for x in f["sources"]}))
                    first += " (pieces)"
                results.append(entry(f, "would_fetch", first))
                continue
            if f.get("pieces") and len(f.get("piece_sha256") or []) != len(f["pieces"]):
                module.fail_json(msg=f"model_peer_fetch: {f['path']}: piece_sha256 needs one sha256 per piece")
            if password_file is None:
                fd, password_file = tempfile.mkstemp(
                    prefix=".llamafleet-share-",
                    dir="/run" if os.path.isdir("/run") and os.access("/run", os.W_OK) else None,
                )
                with os.fdopen(fd, "w") as pf:
                    pf.write(p["secret"] + "\n")
            gather = gather_one if f.get("pieces") else fetch_one
            results.append(gather(module, f, p, fs, password_file))
    finally:
        if password_file:
            os.unlink(password_file)
    module.exit_json(changed=changed, files=results)


if __name__ == "__main__":
    main()
