"""Fan-out delivery of model files: who fetches which file from whom, in rounds (pure; no I/O).

The controller sends the first copy of a file that no host holds; from then on every host that holds a verified
copy serves it to up to ``concurrency`` hosts per round, so the number of holders multiplies by
``1 + concurrency`` each round (about log2(N) rounds of one copy each with the default of 1). A receiver gets
an ordered list of sources: the holder the schedule gives it, then the other hosts that hold the file when its
round starts; the controller is the last resort (the role copies from it what is still missing after the rounds).

A file nobody holds that at least ``pieces_min`` hosts need goes out in pieces instead (scatter, then gather):
the controller splits it into one piece per receiver and sends each receiver its piece (one copy in all, through
its link at once), then every receiver fetches the other pieces from their holders at the same time and puts
them together, so the whole fleet has the file after about two copy times whatever its size (a whole-file tree
needs 1 + ceil(log2 N)). Each piece is checked against the sha256 the controller computed as it split the file,
the whole file against its pin, before it is adopted.

The same function plans a real run and predicts it in check mode: with every transfer succeeding, the rounds the
role runs are the rounds it printed.
"""

from __future__ import annotations

# Alternative sources given to a receiver after the one the schedule picked (a failed or slow peer costs a retry
# against another holder, then the controller).
ALTERNATES = 2
# Pieces: none smaller than this (a smaller file goes out in fewer pieces, or whole).
PIECE_MIN_BYTES = 1024 * 1024


def item_key(model: str, name: str) -> str:
    """One file of one model, as the schedule names it."""
    return f"{model}/{name}"


def holders_from_facts(facts_by_host: dict, items: dict) -> dict:
    """Which hosts hold which items, from the model_fetch_facts the hosts published in this run.

    ``facts_by_host``: host -> its model_fetch_facts (None or {} when it has none). ``items``: key ->
    {model, name, sha256, size}. A host holds an item when its facts list a file of that model whose path ends in
    the item's name with the item's sha256 (and size when both are known). Returns key -> [{host, dir}] with
    ``dir`` the model directory on that host (the share exports it)."""
    out: dict = {}
    for host in sorted(facts_by_host):
        facts = facts_by_host[host] or {}
        if not isinstance(facts, dict):
            continue
        for key, it in items.items():
            files = (facts.get(it["model"]) or {}).get("files") or []
            for f in files:
                path = f.get("path") or ""
                if not it.get("sha256") or f.get("sha256") != it["sha256"] or not path.endswith("/" + it["name"]):
                    continue
                if it.get("size") is not None and f.get("size") is not None and int(f["size"]) != int(it["size"]):
                    continue
                out.setdefault(key, []).append({"host": host, "dir": path[: -len(it["name"]) - 1]})
                break
    return out


def _pick_seed_hosts(needs: dict, orphans: list[str]) -> dict:
    """One receiver per item that nobody holds (the controller's copies), spread over the receivers."""
    seeds: dict = {}
    load: dict = {}
    for key in orphans:
        wanting = sorted(h for h, keys in needs.items() if key in keys)
        if not wanting:
            continue
        host = min(wanting, key=lambda h: (load.get(h, 0), wanting.index(h)))
        load[host] = load.get(host, 0) + 1
        seeds.setdefault(host, []).append(key)
    return seeds


def _one_round(pending: dict, holding: dict, concurrency: int) -> dict:
    """The transfers of one round: each receiver gets at most one file, each holder serves at most
    ``concurrency``; the least busy holder first, in the order hosts came to hold the file."""
    served: dict = {}
    transfers: dict = {}
    for key in sorted({k for keys in pending.values() for k in keys}):
        for host in sorted(h for h, keys in pending.items() if key in keys):
            if host in transfers:
                continue
            free = [s for s in holding.get(key, []) if served.get(s, 0) < concurrency and s != host]
            if not free:
                continue
            src = min(free, key=lambda s: (served.get(s, 0), holding[key].index(s)))
            served[src] = served.get(src, 0) + 1
            others = [s for s in holding[key] if s not in (src, host)]
            transfers[host] = {"item": key, "sources": [src] + others[:ALTERNATES]}
    return transfers


def piece_bounds(size: int, receivers: int) -> list[dict]:
    """The pieces of a file of ``size`` bytes for ``receivers`` hosts: one each, none under PIECE_MIN_BYTES (then
    fewer pieces than receivers); ``[]`` when the file is too small for two. Each: ``{index, offset, size}``."""
    if not size or receivers < 2:
        return []
    count = min(receivers, size // PIECE_MIN_BYTES)
    if count < 2:
        return []
    step = -(-size // count)  # ceil: the last piece is the smallest
    out, offset = [], 0
    while offset < size:
        out.append({"index": len(out), "offset": offset, "size": min(step, size - offset)})
        offset += step
    return out


def _piece_items(pending: dict, orphans: list, sizes: dict, pieces_min: int) -> dict:
    """The orphans that go out in pieces: key -> {receivers, pieces (each with its holder)}."""
    out = {}
    for key in orphans:
        receivers = sorted(h for h, keys in pending.items() if key in keys)
        if not pieces_min or len(receivers) < max(pieces_min, 2):
            continue
        bounds = piece_bounds(int(sizes.get(key) or 0), len(receivers))
        if bounds:
            out[key] = {"receivers": receivers, "pieces": [{**b, "holder": receivers[b["index"]]} for b in bounds]}
    return out


def schedule(needs: dict, holders: dict, concurrency: int = 1, sizes: dict | None = None, pieces_min: int = 0) -> dict:
    """Plan a fan-out.

    ``needs``: receiver -> [item keys it misses]. ``holders``: item key -> [hosts that hold a verified copy
    before the run's deliveries], in the order they should be asked. ``sizes``: item key -> bytes (pieces need
    it); ``pieces_min``: the fewest receivers of an orphan that make it go out in pieces (0: never).
    Returns ``{seed: {host: [keys]}, pieces: {key: {receivers, pieces}}, piece_rounds: [key per round], rounds:
    [{host: {item, sources}}], controller_items: [keys nobody holds], copies: {controller: n, peer: n}}``; the
    piece rounds come first, one per piece item, then the whole-file rounds.
    """
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    pending = {h: sorted(set(keys)) for h, keys in needs.items() if keys}
    holding = {k: list(dict.fromkeys(v)) for k, v in holders.items()}
    orphans = sorted({k for keys in pending.values() for k in keys if not holding.get(k)})
    pieces = _piece_items(pending, orphans, sizes or {}, pieces_min)
    for key, p in pieces.items():
        holding[key] = []  # nobody holds the whole file before its gather; the receivers hold it after
        for host in p["receivers"]:
            pending[host].remove(key)
            holding[key].append(host)
    seeds = _pick_seed_hosts(pending, [k for k in orphans if k not in pieces])
    for host, keys in seeds.items():
        for key in keys:
            holding.setdefault(key, []).append(host)
            pending[host].remove(key)
    rounds = []
    while any(pending.values()):
        transfers = _one_round(pending, holding, concurrency)
        if not transfers:  # nothing can move (cannot happen while every item has a holder); keep the rest for
            break  # the controller
        for host, t in transfers.items():
            pending[host].remove(t["item"])
            holding[t["item"]].append(host)
        rounds.append(transfers)
    return {
        "seed": seeds,
        "pieces": pieces,
        "piece_rounds": sorted(pieces),
        "rounds": rounds,
        "controller_items": orphans,
        "left": {h: keys for h, keys in pending.items() if keys},
        "copies": {
            "controller": sum(len(k) for k in seeds.values()) + len(pieces),
            "peer": sum(len(r) for r in rounds) + sum(len(p["receivers"]) - 1 for p in pieces.values()),
        },
    }


def describe(plan: dict) -> list[str]:
    """One line per round, for the run's output and the check-mode prediction."""
    lines = []
    for host, keys in sorted(plan["seed"].items()):
        lines.append(f"round 0: {host} <- controller ({', '.join(keys)})")
    for key in plan.get("piece_rounds", []):
        ps = plan["pieces"][key]["pieces"]
        sent = ", ".join(f"{p['holder']} ({p['index'] + 1}/{len(ps)})" for p in ps)
        lines.append(f"round 0: controller -> pieces of {key}: {sent}")
    for i, key in enumerate(plan.get("piece_rounds", []), start=1):
        lines.append(f"round {i}: {', '.join(plan['pieces'][key]['receivers'])} <- each other's pieces ({key})")
    offset = len(plan.get("piece_rounds", []))
    for i, transfers in enumerate(plan["rounds"], start=1 + offset):
        moves = ", ".join(f"{h} <- {t['sources'][0]} ({t['item']})" for h, t in sorted(transfers.items()))
        lines.append(f"round {i}: {moves}")
    return lines


def piece_name(name: str, index: int) -> str:
    """A piece's file name within the model directory, beside the file (hidden: the share serves only these)."""
    head, base = name.rpartition("/")[::2]
    return f"{head + '/' if head else ''}.{base}.piece-{index}"


def _dir_of(path: str, name: str) -> str:
    return path[: -len(name) - 1] if path.endswith("/" + name) else path.rsplit("/", 1)[0]


def _batch_view(missing_by_host: dict, files_by_host: dict) -> tuple[dict, dict, dict, dict]:
    """From the batch's checks: the items that can fan out, who needs them, who holds them, where they live."""
    items, needs, holders, dirs = {}, {}, {}, {}
    for host in sorted(missing_by_host):
        for m in missing_by_host[host] or []:
            if m.get("via") != "copy" or not m.get("sha256"):
                continue  # only pinned files that come by copy fan out; the others stay with their source
            key = item_key(m["model"], m["name"])
            items.setdefault(
                key, {"model": m["model"], "name": m["name"], "sha256": m["sha256"], "size": m.get("size")}
            )
            needs.setdefault(host, []).append(key)
            dirs[(host, m["model"])] = _dir_of(m["path"], m["name"])
    for host in sorted(files_by_host):
        for f in files_by_host[host] or []:
            key = item_key(f.get("model") or "", f.get("name") or "")
            it = items.get(key)
            if it and f.get("status") == "ok" and f.get("sha256") == it["sha256"]:
                holders.setdefault(key, []).append(host)
                dirs[(host, it["model"])] = _dir_of(f["path"], it["name"])
    return items, needs, holders, dirs


def _piece_rounds(plan: dict, items: dict, paths: dict, dirs: dict, exports: dict, connections: dict) -> tuple:
    """The piece items' rounds (receiver -> file entry with its ``pieces``) and the controller's piece copies
    (host -> [{model, name, index, offset, size, path}])."""
    rounds, seed = [], {}
    for key in plan["piece_rounds"]:
        it, p = items[key], plan["pieces"][key]
        holders = list(dict.fromkeys(x["holder"] for x in p["pieces"]))
        entries = {}
        for r, host in enumerate(p["receivers"]):
            # each receiver starts with the piece after its own, so the holders are asked in turn, not all at once
            ps = [{k: x[k] for k in ("index", "offset", "size", "holder")} for x in p["pieces"]]
            ps = ps[r + 1 :] + ps[: r + 1]
            entries[host] = {**it, "path": paths[(host, key)], "sources": [h for h in holders if h != host],
                             "pieces": ps}  # fmt: skip
        for x in p["pieces"]:
            host = x["holder"]
            seed.setdefault(host, []).append(
                {"model": it["model"], "name": it["name"], "index": x["index"], "offset": x["offset"],
                 "size": x["size"], "count": len(p["pieces"]),
                 "path": f"{_dir_of(paths[(host, key)], it['name'])}/{piece_name(it['name'], x['index'])}"}
            )  # fmt: skip
            dirs[(host, it["model"])] = _dir_of(paths[(host, key)], it["name"])
            exp = {"name": it["model"], "path": dirs[(host, it["model"])]}
            if exp not in exports.setdefault(host, []):
                exports[host].append(exp)
            connections[host] = max(connections.get(host, 1), len(p["receivers"]) - 1)
        rounds.append(entries)
    return rounds, seed


def fanout_plan(
    missing_by_host: dict, files_by_host: dict, facts_by_host: dict, concurrency: int = 1, pieces_min: int = 0
) -> dict:
    """The fan-out of one batch of hosts.

    ``missing_by_host``: batch host -> its model_verify ``missing`` (model, name, path, sha256, size, via).
    ``files_by_host``: host -> model_verify ``files`` (status ok = holds it): the batch's checks, and any other
    host's probe. ``facts_by_host``: other hosts of the fleet -> their published model_fetch_facts.
    Returns the schedule with, per round, each receiver's file entry (``model, name, path, sha256, size,
    sources``; a piece item's entry also has ``pieces``: index, offset, size, holder), ``exports`` (host ->
    [{name: model, path: its directory}]) for the hosts that serve and ``connections`` (host -> how many peers its
    share admits at once), ``controller`` (host -> the item keys the controller copies to it whole),
    ``seed_pieces`` (host -> the pieces the controller copies to it: model, name, index, offset, size, count,
    path) and ``lines`` (describe())."""
    items, needs, holders, dirs = _batch_view(missing_by_host, files_by_host)
    for key, found in holders_from_facts(facts_by_host, items).items():
        for h in found:
            if h["host"] not in holders.get(key, []):
                holders.setdefault(key, []).append(h["host"])
                dirs[(h["host"], items[key]["model"])] = h["dir"]
    sizes = {k: it.get("size") for k, it in items.items()}
    plan = schedule(needs, holders, concurrency, sizes, pieces_min)
    paths = {(h, item_key(m["model"], m["name"])): m["path"] for h, ms in missing_by_host.items() for m in ms or []}
    exports, connections = {}, {}
    rounds, seed_pieces = _piece_rounds(plan, items, paths, dirs, exports, connections)
    for transfers in plan["rounds"]:
        entries = {}
        for host, t in transfers.items():
            it = items[t["item"]]
            entries[host] = {**it, "path": paths[(host, t["item"])], "sources": t["sources"]}
            for src in t["sources"]:
                exp = {"name": it["model"], "path": dirs[(src, it["model"])]}
                if exp not in exports.setdefault(src, []):
                    exports[src].append(exp)
        rounds.append(entries)
    for host in exports:
        connections[host] = max(connections.get(host, 1), concurrency)
    return {
        "items": items,
        "seed": plan["seed"],
        "pieces": {k: v["pieces"] for k, v in plan["pieces"].items()},
        "seed_pieces": seed_pieces,
        "rounds": rounds,
        "exports": exports,
        "connections": connections,
        "controller": plan["seed"],
        "copies": plan["copies"],
        "lines": describe(plan),
    }
