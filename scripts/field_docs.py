#!/usr/bin/env python3
"""Write the instance fields' documentation from the one field table (fleet_instances.FIELDS).

Two generated blocks, each between a "BEGIN FIELDS" and an "END FIELDS" comment line:
  roles/llama_server_systemd/meta/argument_specs.yml   llama_server_systemd_instances' options
  plugins/modules/llama_server_args.py                 DOCUMENTATION's instances suboptions
Each field: its description ("doc"), type, elements, choices, default, required (and no_log in the argument
spec, which Ansible validates with it). Edit FIELDS, then run:
    python3 scripts/field_docs.py          # rewrite both blocks
    python3 scripts/field_docs.py --check  # exit 1 and name the stale files (the unit test runs this)
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "collections"))

from ansible_collections.llamafleet.mtp.plugins.module_utils.fleet_instances import FIELDS  # noqa: E402

BEGIN = "# BEGIN FIELDS: generated from fleet_instances.FIELDS by scripts/field_docs.py; edit FIELDS, not this"
END = "# END FIELDS"
TARGETS = (
    # (file, indentation of the field names, keys written)
    ("roles/llama_server_systemd/meta/argument_specs.yml", 10, ("no_log",)),
    ("plugins/modules/llama_server_args.py", 6, ()),
)
KEYS = ("type", "elements", "choices", "default", "required")


class _Dumper(yaml.SafeDumper):
    """Lists indented under their key (yamllint's indentation rule, as the hand-written files are)."""

    def increase_indent(self, flow=False, indentless=False):
        return super().increase_indent(flow, False)


def _description(doc: str, indent: int) -> list:
    """``description:`` on one line when it fits in 120 columns, else a folded scalar (the same string)."""
    one = yaml.dump({"description": doc}, Dumper=_Dumper, width=10_000).rstrip("\n")
    if indent + len(one) <= 120 and "\n" not in one:
        return [one]
    lines = textwrap.wrap(doc, 118 - indent - 2, break_long_words=False, break_on_hyphens=False)
    return ["description: >-"] + ["  " + line for line in lines]


def block(indent: int, extra=()) -> list:
    """The fields as YAML lines at ``indent`` (the BEGIN/END comments included)."""
    pad = " " * indent
    out = [pad + BEGIN]
    for name, spec in FIELDS.items():
        entry = {}
        for key in KEYS + tuple(extra):
            value = spec.get(key)
            if value is not None:
                entry[key] = list(value) if isinstance(value, tuple) else value
        out += [pad + name + ":"] + [pad + "  " + line for line in _description(spec["doc"], indent + 2)]
        text = yaml.dump(entry, Dumper=_Dumper, sort_keys=False, default_flow_style=False)
        out += [pad + "  " + line for line in text.rstrip("\n").split("\n")]
    out.append(pad + END)
    return out


def regenerate(path: Path, indent: int, extra=()) -> str:
    lines = path.read_text().split("\n")
    starts = [i for i, line in enumerate(lines) if line.strip() == BEGIN]
    ends = [i for i, line in enumerate(lines) if line.strip() == END]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise SystemExit(f"{path}: expected one '{BEGIN}' line and one '{END}' line after it")
    return "\n".join(lines[: starts[0]] + block(indent, extra) + lines[ends[0] + 1 :])


def main(argv) -> int:
    check = "--check" in argv
    stale = []
    for rel, indent, extra in TARGETS:
        path = REPO / rel
        new = regenerate(path, indent, extra)
        if new != path.read_text():
            stale.append(rel)
            if not check:
                path.write_text(new)
    if check and stale:
        print("stale (run python3 scripts/field_docs.py): " + ", ".join(stale))
        return 1
    if not check:
        print("rewrote: " + (", ".join(stale) or "nothing (both up to date)"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
