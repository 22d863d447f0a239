"""The README (the collection's front page, as Galaxy shows it) and the reference pages under docs/ stay true.

- The set-up section holds exactly the two set-up commands, in one code block.
- Every relative markdown link in README.md and docs/*.md points to a file that exists, and an ``#anchor``
  into a markdown file to one of its headings (GitHub's heading slugs).
- Every ``scripts/...`` and ``playbooks/...`` path in the code (blocks and inline) of README.md and of the
  reference pages exists (docs/measurements.md is a dated log of past runs and is left out of the command checks).
- Every ``ansible-playbook <playbook> -i inventories/<x> ...`` in those code blocks names a playbook that
  exists (a checkout path, or ``llamafleet.mtp.<name>`` -> ``playbooks/<name>.yml``), and the playbook passes
  ``ansible-playbook --syntax-check -i inventories/sandbox <playbook>``. Only the base playbook is checked:
  its ``-e`` options (vault files among them) are dropped. inventories/sandbox is a static YAML inventory
  (hosts.yml and group_vars, no inventory plugin), so nothing that only the sandbox creates is read and the
  check needs no sandbox, containers or network.
- Every ``-e name=value`` (or ``-e '{"name": ...}'``) variable in the commands of README.md and docs/*.md,
  code blocks and inline code alike, appears somewhere under playbooks/ or roles/: renaming a variable
  without the docs fails here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [README, *DOCS]
COMMAND_PAGES = [p for p in PAGES if p.name != "measurements.md"]

SETUP_HEADING = "## Set-up: the two commands"
SETUP_COMMANDS = [
    "bash scripts/run-sandbox.sh     # the main job on the embedded default",
    "bash scripts/run-tests.sh       # the tests (full lane; add --fast for lint + unit only)",
]

FENCE = re.compile(r"^ {0,3}```[^\n]*\n(.*?)^ {0,3}```[ \t]*$", re.M | re.S)
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
PATH_IN_CODE = re.compile(r"(?<![\w./<-])((?:scripts|playbooks)/[\w./-]*)")
EXTRA_VAR_OPTIONS = ("-e", "--extra-vars")


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def code_blocks(text: str) -> list[str]:
    """The contents of the fenced code blocks (``` ... ```), indented ones (in list items) included."""
    return [m.group(1) for m in FENCE.finditer(text)]


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code: where markdown links are links."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def inline_code(text: str) -> list[str]:
    return [m.group(2) for m in INLINE_CODE.finditer(FENCE.sub("", text))]


def command_lines(block: str) -> list[str]:
    """A code block's lines with backslash continuations joined and trailing comments dropped."""
    lines, cur = [], ""
    for raw in block.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        lines.append(cur + line)
        cur = ""
    if cur:
        lines.append(cur)
    return [line for line in lines if line.strip()]


def split_command(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError:  # not shell (Python, YAML): no command here
        return []


def playbook_commands(text: str) -> list[tuple[str, list[str]]]:
    """(line, argv from ansible-playbook on) of every ansible-playbook command with -i inventories/<x>."""
    found = []
    for block in code_blocks(text):
        for line in command_lines(block):
            argv = split_command(line)
            if "ansible-playbook" not in argv:
                continue
            argv = argv[argv.index("ansible-playbook") :]
            inv = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("-i", "--inventory")]
            if inv and all(i.startswith("inventories/") for i in inv):
                found.append((line, argv))
    return found


def playbook_of(argv: list[str]) -> str:
    """The playbook argument: the first positional argument after ansible-playbook."""
    takes_value = {"-i", "--inventory", "-e", "--extra-vars", "-t", "--tags", "--skip-tags", "-l", "--limit"}
    takes_value |= {"-u", "--user", "--vault-password-file", "--vault-id", "-f", "--forks", "-c", "--connection"}
    args = iter(argv[1:])
    for a in args:
        if a in takes_value:
            next(args, None)
        elif not a.startswith("-"):
            return a
    raise AssertionError(f"no playbook in {' '.join(argv)}")


def playbook_path(playbook: str) -> Path:
    m = re.fullmatch(r"llamafleet\.mtp\.(\w+)", playbook)
    return REPO / "playbooks" / f"{m.group(1)}.yml" if m else REPO / playbook


def extra_var_names(argv: list[str]) -> list[str]:
    """The variable names the -e / --extra-vars options of one command set (@file options name no variable)."""
    names = []
    for i, a in enumerate(argv):
        value = None
        if a in EXTRA_VAR_OPTIONS and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith("--extra-vars="):
            value = a.split("=", 1)[1]
        if value is None or value.startswith("@"):
            continue
        if value.lstrip().startswith("{"):
            names += list(yaml.safe_load(value))
        else:
            names += [pair.split("=", 1)[0] for pair in value.split() if "=" in pair]
    return names


def commands_in(text: str) -> list[list[str]]:
    """argv of every shell-like command line in the code blocks and inline code spans of a page."""
    lines = [line for block in code_blocks(text) for line in command_lines(block)] + inline_code(text)
    return [argv for line in lines if (argv := split_command(line))]


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {github_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M)}


def test_setup_section_holds_exactly_the_two_commands():
    text = README.read_text()
    assert text.count(SETUP_HEADING + "\n") == 1, f"README needs one heading {SETUP_HEADING!r}"
    section = text.split(SETUP_HEADING + "\n", 1)[1]
    section = re.split(r"^## ", section, maxsplit=1, flags=re.M)[0]
    blocks = code_blocks(section)
    assert blocks, "no code block under the set-up heading"
    assert [line.rstrip() for line in blocks[0].splitlines() if line.strip()] == SETUP_COMMANDS
    holding = [b for b in code_blocks(text) if any(c in b for c in SETUP_COMMANDS)]
    assert len(holding) == 1, "the set-up commands belong in one code block"
    for command in SETUP_COMMANDS:
        assert (REPO / command.split()[1]).is_file()


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:, ...
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {rel(dest)}")
    assert not broken, f"{rel(page)}: broken links:\n  " + "\n  ".join(broken)


@pytest.mark.parametrize("page", COMMAND_PAGES, ids=rel)
def test_paths_in_code_exist(page):
    text = page.read_text()
    paths = {p.rstrip(".,:;") for code in code_blocks(text) + inline_code(text) for p in PATH_IN_CODE.findall(code)}
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert not missing, f"{rel(page)} names paths that do not exist: {missing}"


def _playbooks() -> list[str]:
    return sorted({playbook_of(argv) for page in COMMAND_PAGES for _, argv in playbook_commands(page.read_text())})


def test_readme_has_playbook_commands():
    commands = [line for line, _ in playbook_commands(README.read_text())]
    assert any("site.yml" in c for c in commands) and any("upgrade.yml" in c for c in commands), commands


@pytest.mark.parametrize("playbook", _playbooks())
def test_documented_playbook_passes_syntax_check(playbook):
    path = playbook_path(playbook)
    assert path.is_file(), f"documented playbook {playbook} does not exist ({rel(path)})"
    ansible_playbook = BIN / "ansible-playbook"
    if not ansible_playbook.exists():
        pytest.skip(f"no ansible-playbook next to {sys.executable}")
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    r = subprocess.run(
        [str(ansible_playbook), "--syntax-check", "-i", "inventories/sandbox", rel(path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, f"{playbook}: syntax check failed\n{r.stdout}\n{r.stderr}"


def _defined_names() -> str:
    texts = []
    for top in ("playbooks", "roles"):
        for f in (REPO / top).rglob("*"):
            if f.is_file() and f.suffix in (".yml", ".yaml", ".j2", ".py", ".md", ".sh", ""):
                texts.append(f.read_text(errors="replace"))
    return "\n".join(texts)


def test_extra_vars_in_commands_exist():
    known = _defined_names()
    used = {}
    for page in PAGES:
        for argv in commands_in(page.read_text()):
            for name in extra_var_names(argv):
                used.setdefault(name, rel(page))
    assert "llamafleet_upgrade_ref" in used, "the README's upgrade command sets llamafleet_upgrade_ref"
    unknown = {n: p for n, p in used.items() if not re.search(rf"\b{re.escape(n)}\b", known)}
    assert not unknown, f"-e variables that no playbook or role uses: {json.dumps(unknown)}"


def test_extra_var_parsing():
    argv = split_command("ansible-playbook x.yml -e a=1 -e 'b=2 c=3' -e '{\"d\": 4}' -e @vault.yml --extra-vars=e=5")
    assert extra_var_names(argv) == ["a", "b", "c", "d", "e"]
    assert playbook_of(split_command("ansible-playbook -i inventories/prod -e x=1 playbooks/bench.yml")) == (
        "playbooks/bench.yml"
    )
    assert github_slug("From AWX / Ansible Automation Platform") == "from-awx--ansible-automation-platform"
    assert github_slug("The benchmark: `playbooks/bench.yml`") == "the-benchmark-playbooksbenchyml"
