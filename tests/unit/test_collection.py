"""The repository is an installable collection: build it with ansible-galaxy, install the
artifact into an empty collections path, and check the installed modules, roles and
playbooks are the same ones, and that ansible-doc renders every module from it."""

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
MODULES = sorted(p.stem for p in (REPO / "plugins" / "modules").glob("*.py"))


def _run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, check=True, timeout=300, **kw)


def test_build_and_install(tmp_path):
    _run([str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(tmp_path), str(REPO)])
    (artifact,) = tmp_path.glob("llamafleet-mtp-*.tar.gz")
    with tarfile.open(artifact) as tar:
        names = set(tar.getnames())
    for m in MODULES:
        assert f"plugins/modules/{m}.py" in names
    assert "playbooks/site.yml" in names and "site.yml" not in names  # the checkout's entry stays behind
    assert "LICENSE" in names
    assert "tests/sanity/ignore-2.22.txt" in names  # ansible-test reads it on the artifact (scripts/sanity.sh)
    # what a user of the installed collection needs: the README, the reference docs and the changelog, not the
    # lab notebook, the test docs or the unreleased fragments
    assert {"README.md", "CHANGELOG.md", "docs/gateway.md", "docs/declared-state.md"} <= names
    assert not {"docs/measurements.md", "docs/testing.md"} & names
    assert not [n for n in names if n.startswith("changelogs/fragments/")]
    dev = (".venv", "collections/", ".git/", "scripts/", "inventories/", "molecule/", "extensions/", ".cache")
    assert not any(n.startswith(dev) for n in names), sorted(n for n in names if n.startswith(dev))
    assert not [n for n in names if n.startswith("tests/") and not n.startswith("tests/sanity")]

    dest = tmp_path / "installed"
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text("[defaults]\n")
    # Outside the checkout, so the collection resolves only from what was installed.
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(dest), ANSIBLE_CONFIG=str(cfg))
    _run(
        [str(BIN / "ansible-galaxy"), "collection", "install", "--offline", "-n", "-p", str(dest), str(artifact)],
        env=env,
        cwd=tmp_path,
    )
    assert (dest / "ansible_collections/llamafleet/mtp/MANIFEST.json").is_file()
    out = _run([str(BIN / "ansible-doc"), "--json", *[f"llamafleet.mtp.{m}" for m in MODULES]], env=env, cwd=tmp_path)
    docs = json.loads(out.stdout)
    assert set(docs) == {f"llamafleet.mtp.{m}" for m in MODULES}, out.stderr[-3000:]
    for m in MODULES:
        entry = docs[f"llamafleet.mtp.{m}"]
        assert entry["doc"]["short_description"]
        assert entry["examples"].strip()
        assert entry["return"]
        assert entry["doc"]["attributes"]["check_mode"]["support"] in ("full", "partial")
    # The fleet playbooks run by FQCN from the installed collection.
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  children:\n    llama_hosts:\n      hosts:\n        h1:\n")
    shipped = sorted(
        n[len("playbooks/") : -len(".yml")]
        for n in names
        if n.startswith("playbooks/") and n.count("/") == 1 and n.endswith(".yml")
    )
    assert shipped and all(re.fullmatch(r"[a-z_][a-z0-9_]*", pb) for pb in shipped), shipped  # a valid FQCN part
    assert {"site", "upgrade", "bench", "follow_pr", "status"} <= set(shipped), shipped
    for pb in shipped:
        _run(
            [str(BIN / "ansible-playbook"), "--syntax-check", "-i", str(inv), f"llamafleet.mtp.{pb}"],
            env=env,
            cwd=tmp_path,
        )


def test_ansible_doc_renders_every_module_from_the_checkout():
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    for m in MODULES:
        out = _run([str(BIN / "ansible-doc"), f"llamafleet.mtp.{m}"], env=env, cwd=REPO)
        assert "OPTIONS" in out.stdout and "RETURN VALUES" in out.stdout, m
