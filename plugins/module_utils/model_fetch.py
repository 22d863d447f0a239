"""Pure logic of the model_fetch role: model list normalisation, fleet aggregation, Hub error messages.

No Ansible imports, standard library only (unit-tested in tests/unit/test_model_fetch.py).

A model item (role variable ``model_fetch_models``)::

    name: qwen36-27b                      # directory <models_dir>/<name>/ and key of the model_fetch_facts fact
    source: hf                            # hf (default) | url | controller
    repo: unsloth/Qwen3.6-27B-GGUF        # hf
    file: Qwen3.6-27B-Q4_K_M.gguf         # one file ...
    include: ["Q8_0/*-of-*.gguf"]         # ... or globs (split sets: all parts); one of file / include
    revision: 0123...cdef                 # hf: commit sha (recommended) or branch / tag (allowed, warned)
    sha256: <hex> | {file: <hex>, ...}    # optional for hf and controller (else the Hub's LFS sha256 / computed)
    url: https://.../x.gguf | [urls]      # url source; sha256 required
    controller_path: /srv/x.gguf | [paths]  # controller source
    require_mtp: true                     # default: the role's model_fetch_require_mtp
"""

from __future__ import annotations

import posixpath
import re
from urllib.parse import unquote, urlsplit

from ansible_collections.llamafleet.mtp.plugins.module_utils.model_fanout import fanout_plan
from ansible_collections.llamafleet.mtp.plugins.module_utils.model_files import SHA256_RE, check_file_name, gguf_heads

SOURCES = ("hf", "url", "controller")
KNOWN_KEYS = {
    "name",
    "source",
    "repo",
    "file",
    "include",
    "revision",
    "sha256",
    "url",
    "controller_path",
    "require_mtp",
    "dir",
}
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


class ModelSpecError(ValueError):
    """A model item is invalid; the message names the model, the key and what to write instead."""


class ModelFactsError(ValueError):
    """The fetched files cannot serve as declared (e.g. no MTP layers where MTP is required)."""

    def __init__(self, problems: list[str]):
        super().__init__(" ".join(problems))
        self.problems = problems


def is_commit(revision: str | None) -> bool:
    return bool(revision) and bool(COMMIT_RE.match(revision))


def _as_list(value, what: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) and v for v in value):
        return list(value)
    raise ModelSpecError(f"{what} must be a string or a non-empty list of strings, got {value!r}")


def _sha_map(model: str, value, names: list[str]) -> dict[str, str]:
    """sha256 as given (a string for a one-file model, or {file name: sha256}) -> {file name: sha256}."""
    if value in (None, "", {}):
        return {}
    if isinstance(value, str):
        if len(names) != 1:
            raise ModelSpecError(
                f"model {model!r}: sha256 is a single string but the model has {len(names) or 'an unknown number of'}"
                " files; give a mapping {file name: sha256} instead"
            )
        value = {names[0]: value}
    if not isinstance(value, dict):
        raise ModelSpecError(f"model {model!r}: sha256 must be a hex string or a mapping {{file: sha256}}")
    out = {}
    for fname, digest in value.items():
        d = str(digest).strip().lower()
        if d.startswith("sha256:"):
            d = d[len("sha256:") :]
        if not SHA256_RE.match(d):
            raise ModelSpecError(f"model {model!r}: sha256 of {fname!r} must be 64 hex digits, got {digest!r}")
        if names and fname not in names:
            raise ModelSpecError(f"model {model!r}: sha256 given for {fname!r}, which is not one of its files {names}")
        out[str(fname)] = d
    return out


def _url_name(url: str) -> str:
    return posixpath.basename(unquote(urlsplit(url).path))


def _model_base(item, models_dir: str, require_mtp: bool) -> dict:
    """The part of a model item every source shares: a mapping with a valid name, known keys, a known source, a
    boolean require_mtp and an absolute dir. Returns the normalised dict, its per-source fields still empty."""
    if not isinstance(item, dict):
        raise ModelSpecError(f"each model must be a mapping with at least name and repo, got {item!r}")
    name = item.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ModelSpecError(
            f"model name {name!r} is not valid: use letters, digits, '.', '_' and '-' (it names the directory "
            f"{models_dir}/<name>)"
        )
    unknown = sorted(set(item) - KNOWN_KEYS)
    if unknown:
        raise ModelSpecError(f"model {name!r}: unknown keys {unknown}; known keys: {sorted(KNOWN_KEYS)}")
    source = item.get("source") or "hf"
    if source not in SOURCES:
        raise ModelSpecError(f"model {name!r}: source {source!r} is not one of {', '.join(SOURCES)}")
    req = item.get("require_mtp")
    if req is None:
        req = require_mtp
    if not isinstance(req, bool):
        raise ModelSpecError(f"model {name!r}: require_mtp must be true or false, got {req!r}")
    directory = item.get("dir") or posixpath.join(models_dir, name)
    if not isinstance(directory, str) or not directory.startswith("/"):
        raise ModelSpecError(f"model {name!r}: dir must be an absolute path, got {directory!r}")
    return {
        "name": name,
        "source": source,
        "dir": directory.rstrip("/") or "/",
        "require_mtp": req,
        "repo": None,
        "revision": None,
        "pinned": None,
        "files": None,
        "include": None,
        "sha256": {},
        "urls": [],
        "controller_paths": [],
    }


def _hf_fields(item: dict, name: str) -> tuple[dict, list[str]]:
    """Source hf: a valid repo id, exactly one of file / include, a usable revision (a branch or tag is warned
    about). Returns (the fields of the normalised dict, warnings)."""
    repo = item.get("repo")
    if not isinstance(repo, str) or not REPO_RE.match(repo):
        raise ModelSpecError(
            f"model {name!r}: repo must be a Hugging Face repo id 'owner/name' (e.g. unsloth/Qwen3.6-27B-GGUF), "
            f"got {repo!r}"
        )
    has_file = item.get("file") not in (None, "", [])
    has_include = item.get("include") not in (None, "", [])
    if has_file == has_include:
        raise ModelSpecError(
            f"model {name!r}: give exactly one of file (one GGUF, or a list of files) or include (glob patterns,"
            " e.g. '*Q4_K_M-*-of-*.gguf' for all parts of a split GGUF)"
        )
    revision = item.get("revision") or "main"
    if not isinstance(revision, str) or ".." in revision or revision.startswith("/") or revision != revision.strip():
        raise ModelSpecError(f"model {name!r}: revision {revision!r} is not a valid branch, tag or commit")
    fields = {"repo": repo, "revision": revision, "pinned": is_commit(revision)}
    warnings = []
    if not fields["pinned"]:
        warnings.append(
            f"model {name!r}: revision {revision!r} is a branch or tag, so what it downloads can change between "
            "runs; pin the commit sha (40 hex digits) for a reproducible fleet"
        )
    if has_file:
        files = _as_list(item["file"], f"model {name!r}: file")
        for f in files:
            if why := check_file_name(f):
                raise ModelSpecError(f"model {name!r}: file {why}")
        fields["files"] = files
        fields["sha256"] = _sha_map(name, item.get("sha256"), files)
    else:
        fields["include"] = _as_list(item["include"], f"model {name!r}: include")
        fields["sha256"] = _sha_map(name, item.get("sha256"), [])
    return fields, warnings


def _url_fields(item: dict, name: str) -> dict:
    """Source url: http(s)/ftp/file URLs, one usable and distinct file name each (from the URL or file), and a
    pinned sha256 for every file. Returns the fields of the normalised dict."""
    urls = _as_list(item.get("url") or [], f"model {name!r}: url")
    for u in urls:
        if urlsplit(u).scheme not in ("http", "https", "ftp", "file"):
            raise ModelSpecError(f"model {name!r}: url {u!r} must be an http(s), ftp or file URL")
    files = [_url_name(u) for u in urls]
    if item.get("file") not in (None, "", []):
        files = _as_list(item["file"], f"model {name!r}: file")
        if len(files) != len(urls):
            raise ModelSpecError(f"model {name!r}: file must name each url's file ({len(urls)} urls)")
    for f in files:
        if why := check_file_name(f):
            raise ModelSpecError(f"model {name!r}: file name taken from the url is not usable: {why}; set file")
    if len(set(files)) != len(files):
        raise ModelSpecError(f"model {name!r}: two urls end in the same file name; set file to name each")
    sha = _sha_map(name, item.get("sha256"), files)
    missing = [f for f in files if f not in sha]
    if missing:
        raise ModelSpecError(
            f"model {name!r}: source url needs the sha256 of every file (missing for {missing}); a plain URL "
            "has no trusted checksum of its own"
        )
    return {"files": files, "urls": [{"name": files[i], "url": urls[i]} for i in range(len(urls))], "sha256": sha}


def _controller_fields(item: dict, name: str) -> dict:
    """Source controller: no file / include, absolute controller paths with distinct file names. Returns the
    fields of the normalised dict."""
    for key in ("file", "include"):
        if key in item and item[key] not in (None, "", []):
            raise ModelSpecError(f"model {name!r}: {key} is not used with source controller; use controller_path")
    paths = _as_list(item.get("controller_path") or [], f"model {name!r}: controller_path")
    for p in paths:
        if not p.startswith("/") and not p.startswith("~"):
            raise ModelSpecError(f"model {name!r}: controller_path {p!r} must be an absolute path")
    files = [posixpath.basename(p) for p in paths]
    if len(set(files)) != len(files):
        raise ModelSpecError(f"model {name!r}: two controller paths end in the same file name")
    return {
        "files": files,
        "controller_paths": [{"name": files[i], "path": paths[i]} for i in range(len(paths))],
        "sha256": _sha_map(name, item.get("sha256"), files),
    }


def normalize_model(item, *, models_dir: str, require_mtp: bool = True) -> tuple[dict, list[str]]:
    """One model item -> (normalised dict, warnings). Raises ModelSpecError with a fix-it message."""
    out = _model_base(item, models_dir, require_mtp)
    name = out["name"]
    warnings = []
    if out["source"] == "hf":
        fields, warnings = _hf_fields(item, name)
    elif out["source"] == "url":
        fields = _url_fields(item, name)
    else:
        fields = _controller_fields(item, name)
    out.update(fields)
    if out["files"] is not None and not any(f.endswith(".gguf") for f in out["files"]):
        raise ModelSpecError(f"model {name!r}: none of its files ends in .gguf ({out['files']})")
    return out, warnings


def normalize_models(items, *, models_dir: str, require_mtp: bool = True) -> tuple[list[dict], list[str]]:
    if items is None:
        items = []
    if not isinstance(items, list):
        raise ModelSpecError(f"model_fetch_models must be a list of models, got {type(items).__name__}")
    out, warnings, seen = [], [], {}
    for item in items:
        model, warn = normalize_model(item, models_dir=models_dir, require_mtp=require_mtp)
        if model["name"] in seen:
            raise ModelSpecError(f"model name {model['name']!r} is used twice; model names must be unique")
        dirs = {m["dir"]: m["name"] for m in out}
        if model["dir"] in dirs:
            raise ModelSpecError(
                f"models {dirs[model['dir']]!r} and {model['name']!r} share the directory {model['dir']}"
            )
        seen[model["name"]] = True
        out.append(model)
        warnings.extend(warn)
    return out, warnings


IDENTITY_KEYS = ("source", "repo", "revision", "files", "include", "sha256", "urls", "controller_paths")


def aggregate(per_host: dict[str, list[dict]]) -> list[dict]:
    """The distinct models of a fleet (first definition wins), each with the hosts that use it.

    The same name must mean the same model on every host (source, repo, revision, files and checksums); the
    directory and require_mtp may differ per host.
    """
    models: dict[str, dict] = {}
    for host in sorted(per_host):
        for m in per_host[host]:
            ident = {k: m.get(k) for k in IDENTITY_KEYS}
            if m["name"] in models:
                known = models[m["name"]]
                if {k: known.get(k) for k in IDENTITY_KEYS} != ident:
                    raise ModelSpecError(
                        f"model {m['name']!r} is defined differently on {known['hosts'][0]} and {host}; one name must "
                        "mean one model across the fleet (rename one of them)"
                    )
                known["hosts"].append(host)
            else:
                models[m["name"]] = {"name": m["name"], **ident, "hosts": [host]}
    return [models[n] for n in sorted(models)]


# -- Hugging Face errors ---------------------------------------------------------------------------------
def hub_error_message(
    kind: str,
    *,
    repo: str,
    revision: str | None = None,
    filename: str | None = None,
    status: int | None = None,
    token_given: bool = False,
    server_message: str | None = None,
    endpoint: str | None = None,
    available: list[str] | None = None,
) -> str:
    """A message that says which of gated / token / repo / revision / file went wrong and what to do.

    kind: gated | auth | repo | revision | entry | http | network.
    """
    at = f" at revision {revision!r}" if revision else ""
    server = f" (the Hub said: {server_message})" if server_message else ""
    if kind == "gated":
        if status == 403 or token_given:
            return (
                f"403 Forbidden: {repo} is a gated repo and the HF token given is not authorized for it{server}. "
                f"Request access on the repo page ({_page(endpoint, repo)}) with the account the token belongs to, "
                "wait for approval, or set model_fetch_hf_token to a token of an account that has access."
            )
        return (
            f"401 Unauthorized: {repo} is a gated repo and no HF token was given{server}. Accept its terms on "
            f"{_page(endpoint, repo)} and set model_fetch_hf_token (for example export HF_TOKEN on the controller)."
        )
    if kind == "auth":
        return (
            f"401 Unauthorized: the Hub rejected the HF token while fetching {repo}{server}. The token is invalid or "
            "expired: create a new read token and set model_fetch_hf_token (or HF_TOKEN on the controller)."
        )
    if kind == "repo":
        tail = (
            "the token given cannot see it"
            if token_given
            else "it is private and no token was given (set model_fetch_hf_token)"
        )
        return (
            f"repository not found (HTTP {status or 404}): {repo} does not exist on {endpoint or 'the Hub'}, or "
            f"{tail}{server}. Check the repo id (owner/name) of the model."
        )
    if kind == "revision":
        return (
            f"404 Not Found: revision {revision!r} does not exist in {repo}{server}. Use a branch, a tag or a full "
            "commit sha of that repo (see its 'Files and versions' page)."
        )
    if kind == "entry":
        hint = ""
        if available:
            shown = available[:20]
            more = f" and {len(available) - len(shown)} more" if len(available) > len(shown) else ""
            hint = f" Files there: {', '.join(shown)}{more}."
        return (
            f"404 Not Found: file {filename!r} does not exist in {repo}{at}{server}. Check the file name (it is "
            f"case-sensitive, with its folder if it has one) or the revision.{hint}"
        )
    if kind == "network":
        return (
            f"cannot reach the Hub at {endpoint or 'the default endpoint'} while fetching {repo}{server}. Check the "
            "host's network, proxy and model_fetch_hf_endpoint, then run again (a partial download is kept and "
            "resumed)."
        )
    return f"HTTP {status} from the Hub while fetching {repo}{at}{' file ' + filename if filename else ''}{server}."


def _page(endpoint: str | None, repo: str) -> str:
    return f"{(endpoint or 'https://huggingface.co').rstrip('/')}/{repo}"


def expected_sha256(model_sha: dict[str, str], filename: str, etag: str | None, lfs_sha256: str | None = None):
    """What a downloaded file must hash to: the pinned sha256, else the Hub's LFS sha256 (the ETag of an LFS file),
    else None (a non-LFS file: the caller must refuse or rely on a pinned value)."""
    if filename in model_sha:
        return model_sha[filename], "pinned"
    for cand in (lfs_sha256, etag):
        if cand and SHA256_RE.match(cand):
            return cand, "hub"
    return None, None


# -- what each host must end up with ---------------------------------------------------------------------
def host_plan(models: list[dict], manifest: list[dict], *, cache_dir: str, fleet: bool) -> dict:
    """Files this host must hold, and how the ones the role delivers get here.

    models: this host's normalised models. manifest: resolved files ({model, name, sha256, size, path}) known so
    far - the controller's (fleet hf models in its cache, controller-source files) and this host's own hf
    downloads. Returns:

    * expect: files delivered by copy or get_url - {model, name, path (final), sha256, size, via: copy|get_url,
      src (controller path or URL)}; hf models fetched on the host itself are not in it.
    * installed: every file of every model that is known by now - {model, name, path}.
    * heads: model name -> the GGUF path llama.cpp is given (single file or first split part), or None while
      the model's files are not known yet (an include pattern not resolved).
    """
    by_model: dict[str, list[dict]] = {}
    for e in manifest or []:
        by_model.setdefault(e["model"], []).append(e)
    expect, installed, heads = [], [], {}
    for m in models:
        name, directory = m["name"], m["dir"]
        entries = by_model.get(name)
        names = list(m["files"] or [e["name"] for e in entries or []])
        for n in names:
            installed.append({"model": name, "name": n, "path": posixpath.join(directory, n)})
        first = gguf_heads(names)
        heads[name] = posixpath.join(directory, first[0]) if first else None
        if m["source"] == "controller" or (fleet and m["source"] == "hf"):
            for e in entries or []:
                expect.append(
                    {
                        "model": name,
                        "name": e["name"],
                        "path": posixpath.join(directory, e["name"]),
                        "sha256": e.get("sha256"),
                        "size": e.get("size"),
                        "via": "copy",
                        "src": e["path"],
                    }
                )
        elif m["source"] == "url":
            for u in m["urls"]:
                expect.append(
                    {
                        "model": name,
                        "name": u["name"],
                        "path": posixpath.join(directory, u["name"]),
                        "sha256": m["sha256"][u["name"]],
                        "size": None,
                        "via": "copy" if fleet else "get_url",
                        "src": posixpath.join(cache_dir, name, u["name"]) if fleet else u["url"],
                    }
                )
    return {"expect": expect, "installed": installed, "heads": heads}


def controller_work(fleet_models: list[dict], needed: list[dict]) -> dict:
    """What the controller fetches upstream for the hosts (fleet mode).

    needed: the hosts' missing entries ({model, name, path, src, sha256}). Returns ``hf``: the hf models with
    missing files, each with ``only`` (the file names to fetch), and ``url``: one entry per missing URL file
    ({model, name, path (in the controller cache), sha256, src (the URL)}), each once however many hosts miss it.
    """
    by_name = {m["name"]: m for m in fleet_models}
    hf_needs: dict[str, list[str]] = {}
    url, seen = [], set()
    for e in needed or []:
        m = by_name.get(e.get("model"))
        if m is None:
            continue
        if m["source"] == "hf":
            names = hf_needs.setdefault(m["name"], [])
            if e["name"] not in names:
                names.append(e["name"])
        elif m["source"] == "url" and e["src"] not in seen:
            seen.add(e["src"])
            link = next(u["url"] for u in m["urls"] if u["name"] == e["name"])
            url.append(
                {"model": m["name"], "name": e["name"], "path": e["src"], "sha256": e.get("sha256"), "src": link}
            )
    hf = [{**by_name[n], "only": sorted(names)} for n, names in sorted(hf_needs.items())]
    return {"hf": hf, "url": url}


def build_facts(
    models: list[dict],
    verified: list[dict],
    heads: dict,
    ggufs: dict,
    commits: dict,
) -> tuple[dict, list[str]]:
    """The model_fetch_facts fact (model name -> {path, paths, sha256, size_bytes, revision, repo, source, gguf,
    files}) and the problems that must fail the run (a GGUF without MTP layers where MTP is required)."""
    facts, problems = {}, []
    for m in models:
        name = m["name"]
        files = [
            {"path": f["path"], "sha256": f.get("sha256"), "size": f.get("size")}
            for f in verified
            if f.get("model") == name
        ]
        head = heads.get(name)
        gguf = ggufs.get(name)
        head_file = next((f for f in files if f["path"] == head), None)
        facts[name] = {
            "path": head,
            "paths": list(gguf["split"]["paths"])
            if gguf
            else [f["path"] for f in files if f["path"].endswith(".gguf")],
            "sha256": head_file["sha256"] if head_file else None,
            "size_bytes": sum(f["size"] or 0 for f in files),
            "revision": commits.get(name) or m.get("revision"),
            "repo": m.get("repo"),
            "source": m["source"],
            "require_mtp": m["require_mtp"],
            "gguf": gguf,
            "files": files,
        }
        if m["require_mtp"] and gguf is not None and not gguf.get("nextn_predict_layers"):
            problems.append(
                f"model {name!r}: {head} has no MTP layers (nextn_predict_layers = 0, architecture "
                f"{gguf.get('architecture')}), so llama-server cannot use MTP speculative decoding with it. Pick an "
                "MTP GGUF (one converted with the model's nextn/MTP tensors), or set require_mtp: false for this model."
            )
    return facts, problems


# The options of llamafleet.mtp.model_fetch_plan (an action plugin: pure computation on the controller).
PLAN_ARGUMENT_SPEC = {
    "models": {"type": "list", "elements": "raw"},
    "models_dir": {"type": "path", "default": "/var/lib/llama-models"},
    "require_mtp": {"type": "bool", "default": True},
    "warn": {"type": "bool", "default": True},
    "hosts": {"type": "dict"},
    "manifest": {"type": "list", "elements": "dict"},
    "cache_dir": {"type": "path", "default": "/tmp"},
    "fleet": {"type": "bool", "default": False},
    "fleet_models": {"type": "list", "elements": "dict"},
    "needed": {"type": "list", "elements": "dict"},
    "verified": {"type": "list", "elements": "dict"},
    "heads": {"type": "dict"},
    "ggufs": {"type": "dict"},
    "commits": {"type": "dict", "default": {}},
    # Fan-out (model_fanout.fanout_plan): the batch's missing and present files, other hosts' published facts.
    "fanout_missing": {"type": "dict"},
    "fanout_files": {"type": "dict", "default": {}},
    "fanout_facts": {"type": "dict", "default": {}},
    "fanout_concurrency": {"type": "int", "default": 1},
    "fanout_pieces_min": {"type": "int", "default": 0},
}
PLAN_CONSTRAINTS = {
    "required_one_of": [["models", "hosts", "fleet_models", "fanout_missing"]],
    "required_together": [["fleet_models", "needed"]],
    "required_by": {"verified": ["models", "heads", "ggufs"], "manifest": ["models"]},
}


def plan(p: dict) -> tuple[dict, list[str]]:
    """model_fetch_plan's result and warnings for validated options `p`.

    Raises ModelSpecError for a bad model item, ModelFactsError when the files cannot serve as declared."""
    result: dict = {"changed": False}
    warnings: list[str] = []
    if p["models"] is not None:
        models, warned = normalize_models(
            p["models"], models_dir=p["models_dir"].rstrip("/"), require_mtp=p["require_mtp"]
        )
        warnings += warned if p["warn"] else []
        result["models"] = models
        if p["manifest"] is not None:
            result.update(host_plan(models, p["manifest"], cache_dir=p["cache_dir"], fleet=p["fleet"]))
        if p["verified"] is not None:
            facts, problems = build_facts(models, p["verified"], p["heads"], p["ggufs"], p["commits"] or {})
            if problems:
                raise ModelFactsError(problems)
            result["facts"] = facts
    if p["hosts"] is not None:
        result["fleet"] = aggregate({h: list(ms or []) for h, ms in p["hosts"].items()})
    if p["fleet_models"] is not None:
        result["controller_work"] = controller_work(p["fleet_models"], p["needed"])
    if p["fanout_missing"] is not None:
        if p["fanout_concurrency"] < 1:
            raise ModelSpecError(f"model_fetch_peer_concurrency must be at least 1, got {p['fanout_concurrency']}")
        if p["fanout_pieces_min"] < 0:
            raise ModelSpecError(f"model_fetch_fanout_pieces_min must be 0 or more, got {p['fanout_pieces_min']}")
        result["fanout"] = fanout_plan(
            p["fanout_missing"],
            p["fanout_files"] or {},
            p["fanout_facts"] or {},
            p["fanout_concurrency"],
            p["fanout_pieces_min"],
        )
    return result, warnings
