"""What a built ``llama-server`` can do, read from its own ``--version``, ``--help`` and ``--list-devices``.

Pure logic, no Ansible imports: the ``llama_server_capabilities`` module and the tests feed it
text (parse_*) or a ``run(argv) -> (rc, stdout, stderr)`` callable (probe).

Formats (shared/LLAMACPP.md sections 1, 3 and 5; llama.cpp common/arg.cpp, build-info.cpp.in):

* ``--version`` prints to stderr, exit 0::

      version: 0.5.0-dev (build 1, commit 0d91d73bb)      # current
      version: 9333 (35c9b1f39)                           # older builds: build number, commit
      built with GNU 12.2.0 for Linux x86_64

  Log lines may come before it; the lines are found anywhere in the output.
* ``--help`` prints to stdout, exit 0. Each option starts at column 0: its names joined with
  ``", "`` (the first padded to 7 characters when there are several), a space and the value
  hint, then the help at column 40 (on the next line when names and hint take more than 37
  characters); help lines are indented by 40 spaces. ``----- ... -----`` lines head sections.
* ``--spec-type`` hint: ``none,draft-simple,...,draft-mtp,...`` now, ``[none|mtp|...]`` on the
  PR #22673 branch; matched with ``\\[?([a-z0-9,|-]+)`` and split on ``,`` or ``|``.
* ``--list-devices``: ``Available devices:`` then ``  CUDA0: <desc> (<total> MiB, <free> MiB free)``
  per non-CPU device, or ``  (none)``. A CUDA build logs ``ggml_cuda_init: ...`` before it, even
  on a host where CUDA cannot start.
* Confirmation: handlers run before usage is printed, so ``llama-server --spec-type X -h`` exits 0
  when X is a known type and 1 with ``unknown speculative type: X`` when it is not.
"""

from __future__ import annotations

import re

MTP_SPELLINGS = ("draft-mtp", "mtp")  # mainline since PR #22964 / the PR #22673 branch
SPEC_FLAGS = ("--spec-draft-n-max", "--spec-draft-n-min", "--spec-draft-p-min", "--spec-draft-type-k", "-ctkd")
FIT_FLAGS = ("--fit", "--fit-target", "--fit-ctx")
REMOVED_MARKER = "the argument has been removed"
UNKNOWN_TYPE_MARKER = "unknown speculative type"
PREVIEW_LINES = 8

VERSION_ARGS = ("--version",)
HELP_ARGS = ("--help",)
LIST_DEVICES_ARGS = ("--list-devices",)

_VERSION_NEW = re.compile(r"^version:\s*(\S+)\s+\(build\s+(\d+),\s*commit\s+([^\s)]+)\)", re.M)
_VERSION_OLD = re.compile(r"^version:\s*(\d+)\s+\(([^\s)]+)\)", re.M)
_BUILT_WITH = re.compile(r"^built with (.+)$", re.M)
_NAME = re.compile(r"-{1,2}[A-Za-z0-9][A-Za-z0-9_.-]*")
_SPEC_HINT = re.compile(r"^\[?([a-z0-9,|-]+)")
_BRACES = re.compile(r"^\{([a-z0-9,_-]+)\}")
_ALLOWED = re.compile(r"allowed values:\s*([a-z0-9_]+(?:,\s*[a-z0-9_]+)*)")
_DEVICE = re.compile(r"^\s+(\S+): (.*) \((\d+) MiB, (\d+) MiB free\)\s*$")
_CUDA_INIT = re.compile(r"^ggml_cuda_init: .*\bCUDA\b", re.M)


class LlamaCapsError(Exception):
    """The binary failed or printed something this parser does not recognise."""

    def __init__(self, msg: str, output: str = ""):
        super().__init__(msg)
        self.output = output


def preview(text: str, n: int = PREVIEW_LINES) -> str:
    """The first n non-empty lines of text, for error messages."""
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    shown = "\n".join(lines[:n]) or "(no output)"
    return shown + ("\n..." if len(lines) > n else "")


def parse_version(text: str) -> dict:
    """version / build_number / commit / build_info / built_with / compiler / target from ``--version``."""
    m = _VERSION_NEW.search(text)
    if m:
        version, build, commit = m.group(1), int(m.group(2)), m.group(3)
    else:
        m = _VERSION_OLD.search(text)
        if not m:
            raise LlamaCapsError(
                "no 'version: ...' line in the output of llama-server --version; is this a llama.cpp "
                f"llama-server? It printed:\n{preview(text)}",
                text,
            )
        version, build, commit = None, int(m.group(1)), m.group(2)
    b = _BUILT_WITH.search(text)
    built_with = b.group(1).strip() if b else None
    compiler = target = None
    if built_with and " for " in built_with:
        compiler, _dummy, target = built_with.rpartition(" for ")
    return {
        "version": version,
        "build_number": build,
        "commit": commit,
        "build_info": f"b{build}-{commit}",
        "built_with": built_with,
        "compiler": compiler,
        "target": target,
    }


def parse_options(text: str) -> list[dict]:
    """The options ``--help`` lists, in order: ``{"names": [...], "hint": str, "help": str}``."""
    options: list[dict] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line[0].isspace():
            if options:
                options[-1]["help"] = (options[-1]["help"] + "\n" + line.strip()).strip()
            continue
        if line.startswith("-----") or not line.startswith("-"):
            continue
        names: list[str] = []
        pos = 0
        while True:
            m = _NAME.match(line, pos)
            if not m:
                break
            names.append(m.group(0))
            pos = m.end()
            sep = re.match(r",\s+", line[pos:])
            if not sep:
                break
            pos += sep.end()
        if not names:
            continue
        rest = line[pos:]
        if re.match(r" \S", rest):  # one space, then the value hint; 3+ spaces before the help
            parts = re.split(r"\s{3,}", rest[1:].rstrip(), maxsplit=1)
            hint, help_text = parts[0], (parts[1] if len(parts) > 1 else "")
        else:  # no hint: padding straight to the help
            hint, help_text = "", rest
        options.append({"names": names, "hint": hint, "help": help_text.strip()})
    return options


def _find(options: list[dict], name: str) -> dict | None:
    return next((o for o in options if name in o["names"]), None)


def parse_help(text: str) -> dict:
    """Capabilities from ``--help``: spec types and MTP spelling, flags, split modes, fit, cache types."""
    options = parse_options(text)
    if not options or _find(options, "--help") is None:
        raise LlamaCapsError(
            "the output of llama-server --help lists no options (no '-h, --help' line); is this a llama.cpp "
            f"llama-server? It printed:\n{preview(text)}",
            text,
        )
    live = [o for o in options if not o["help"].startswith(REMOVED_MARKER)]
    names = {n for o in live for n in o["names"]}
    removed = sorted({n for o in options if o not in live for n in o["names"]} - names)

    spec_types: list[str] = []
    spec = _find(live, "--spec-type")
    if spec is not None:
        m = _SPEC_HINT.match(spec["hint"])
        if not m:
            raise LlamaCapsError(
                f"cannot read the --spec-type values from its help line '--spec-type {spec['hint']}' "
                "(expected 'a,b,c' or '[a|b|c]')",
                text,
            )
        spec_types = [t for t in re.split(r"[,|]", m.group(1)) if t]
    mtp = next((s for s in MTP_SPELLINGS if s in spec_types), None)

    split_modes: list[str] = []
    sm = _find(live, "--split-mode")
    if sm is not None:
        m = _BRACES.match(sm["hint"])
        split_modes = m.group(1).split(",") if m else []

    cache_types: list[str] = []
    ctk = _find(live, "--cache-type-k") or _find(live, "-ctk")
    if ctk is not None:
        m = _ALLOWED.search(ctk["help"])
        cache_types = [t.strip() for t in m.group(1).split(",")] if m else []

    return {
        "spec_types": spec_types,
        "mtp_spec_type": mtp,
        "mtp_supported": mtp is not None,
        "spec_flags": {f: f in names for f in SPEC_FLAGS},
        "split_modes": split_modes,
        "fit": {f: f in names for f in FIT_FLAGS},
        "cache_types": cache_types,
        "flags": sorted(n for n in names if n.startswith("--")),
        "short_flags": sorted(n for n in names if not n.startswith("--")),
        "removed_flags": removed,
    }


def parse_list_devices(text: str) -> dict:
    """``devices`` (name, description, memory_total_mib, memory_free_mib) and ``has_cuda``."""
    lines = text.splitlines()
    try:
        start = next(i for i, ln in enumerate(lines) if ln.strip() == "Available devices:")
    except StopIteration:
        raise LlamaCapsError(
            f"no 'Available devices:' line in the output of llama-server --list-devices. It printed:\n{preview(text)}",
            text,
        ) from None
    devices = []
    for ln in lines[start + 1 :]:
        m = _DEVICE.match(ln)
        if m:
            devices.append(
                {
                    "name": m.group(1),
                    "description": m.group(2),
                    "memory_total_mib": int(m.group(3)),
                    "memory_free_mib": int(m.group(4)),
                }
            )
    has_cuda = bool(_CUDA_INIT.search(text)) or any(re.fullmatch(r"CUDA\d+", d["name"]) for d in devices)
    return {"devices": devices, "has_cuda": has_cuda}


def _run_ok(run, argv: list[str], what: str) -> tuple[str, str]:
    rc, out, err = run(argv)
    if rc != 0:
        both = (err or "") + (out or "")
        raise LlamaCapsError(f"'{' '.join(argv)}' ({what}) exited with code {rc}. It printed:\n{preview(both)}", both)
    return out or "", err or ""


def confirm_mtp(run, binary: str, mtp_spec_type: str | None) -> None:
    """Prove the parsed MTP spelling with the binary itself (``--spec-type X -h``, no model needed).

    The parsed spelling must exit 0; every other MTP spelling must exit 1 with 'unknown speculative
    type'. With no MTP support parsed, every spelling must be rejected that way.
    """
    for spelling in sorted(MTP_SPELLINGS, key=lambda s: s != mtp_spec_type):  # the parsed one first
        argv = [binary, "--spec-type", spelling, "-h"]
        rc, out, err = run(argv)
        both = (err or "") + (out or "")
        if spelling == mtp_spec_type:
            if rc != 0:
                raise LlamaCapsError(
                    f"--help lists --spec-type '{spelling}' but '{' '.join(argv)}' exited with code {rc}; the help and "
                    f"the binary disagree. It printed:\n{preview(both)}",
                    both,
                )
        elif rc != 1 or UNKNOWN_TYPE_MARKER not in both:
            raise LlamaCapsError(
                f"--help does not list --spec-type '{spelling}' (parsed MTP spelling: {mtp_spec_type}) but "
                f"'{' '.join(argv)}' exited with code {rc} without '{UNKNOWN_TYPE_MARKER}'; the help and the "
                f"binary disagree. It printed:\n{preview(both)}",
                both,
            )


def probe(run, binary: str, confirm: bool = True) -> dict:
    """Run ``--version``, ``--help``, ``--list-devices`` (and the confirmation) and build the capabilities.

    ``run(argv)`` returns ``(rc, stdout, stderr)``. None of these commands needs a model; each exits at once.
    """
    out, err = _run_ok(run, [binary, *VERSION_ARGS], "version")
    caps = {"binary": binary, **parse_version(err + "\n" + out)}
    out, _dummy = _run_ok(run, [binary, *HELP_ARGS], "help")
    caps.update(parse_help(out))
    out, err = _run_ok(run, [binary, *LIST_DEVICES_ARGS], "device list")
    caps.update(parse_list_devices(err + "\n" + out))
    if confirm:
        confirm_mtp(run, binary, caps["mtp_spec_type"])
    caps["confirmed"] = confirm
    return caps
