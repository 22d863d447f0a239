#!/usr/bin/env python3
"""Lay out the Hub stand-in's repos for the model_fetch scenario (test-only).

Writes real GGUF models with tests/harness/gguf/make_models.py into ROOT/<org>/<repo>/ for
tests/harness/hf_standin.py to serve, a controller-source model, and DIR/hub.json with what the scenario
asserts against (commits, sizes, sha256s). Usage: make_hub.py DIR
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]  # extensions/molecule/model_fetch/make_hub.py
sys.path.insert(0, str(REPO))

from tests.harness.gguf.make_models import build_model, sha256_file  # noqa: E402

ORG = "llamafleet"
GOOD_TOKEN = "hf_molecule_good_token_0001"
OTHER_TOKEN = "hf_molecule_other_token_0002"  # known to the server (--token), authorized for nothing
COMMITS = {
    "tiny-agree-GGUF": "a9ee000000000000000000000000000000000001",
    "tiny-split-GGUF": "a9ee000000000000000000000000000000000002",
}


def main() -> int:
    out = Path(sys.argv[1]).resolve()
    root, gen = out / "root", out / "gen"
    shutil.rmtree(root, ignore_errors=True)
    models = {
        "agree": build_model("agree", gen, name="tiny-agree"),
        "split": build_model("agree", gen, name="tiny-agree-split", split=3),
        "plain": build_model("plain", gen, name="tiny-plain"),
        "mtp": build_model("mtp", gen, name="tiny-mtp"),
        "partial": build_model("partial", gen, name="tiny-partial"),
        "big": build_model("agree", gen, name="big-agree", n_embd=384, n_layer=2),  # ~28 MiB: > 2 client chunks
    }
    repos = {
        "tiny-agree-GGUF": ("agree", {"revisions": {"main": COMMITS["tiny-agree-GGUF"]}}),
        "tiny-split-GGUF": ("split", {"revisions": {"main": COMMITS["tiny-split-GGUF"]}}),
        "tiny-plain-GGUF": ("plain", None),
        "big-agree-GGUF": ("big", None),
        "gated-GGUF": ("agree", {"gated": True, "token": GOOD_TOKEN}),
        "url-files": ("mtp", None),
    }
    for repo, (key, config) in repos.items():
        d = root / ORG / repo
        d.mkdir(parents=True)
        for p in models[key].paths:
            shutil.copy(p, d / p.name)
        if config:
            (d / ".standin.json").write_text(json.dumps(config))
    controller = out / "controller-models"
    controller.mkdir(exist_ok=True)
    shutil.copy(models["partial"].path, controller / models["partial"].path.name)

    files = {}
    for key, m in models.items():
        files[key] = {p.name: {"sha256": sha256_file(p), "size": p.stat().st_size} for p in m.paths}
    doc = {
        "root": str(root),
        "org": ORG,
        "commits": COMMITS,
        "good_token": GOOD_TOKEN,
        "other_token": OTHER_TOKEN,
        "controller_path": str(controller / models["partial"].path.name),
        "files": files,
    }
    (out / "hub.json").write_text(json.dumps(doc, indent=1))
    print(json.dumps({k: sum(f["size"] for f in v.values()) for k, v in files.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
