"""llama_caps parsers on real llama-server captures (tests/fixtures/llama-server, see SOURCES.md) and
on the hand-made old-format fixture; probe() against the real CPU builds (slow lane).

The real binaries come from tests/harness/llamacpp/build.sh (CI's full lane exports their paths as
LLAMA_SERVER_BIN / LLAMA_SERVER_PR_BIN); the slow tests skip when they are absent.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from ansible_collections.llamafleet.mtp.plugins.module_utils import llama_caps as lc

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "llama-server"
BUILDS = Path(os.environ.get("LLAMA_MTP_CACHE", "/var/cache/llama-mtp-fleet")) / "builds"
MAINLINE_BIN = Path(os.environ.get("LLAMA_SERVER_BIN") or BUILDS / "0d91d73bb065-cpu" / "bin" / "llama-server")
PR_BIN = Path(os.environ.get("LLAMA_SERVER_PR_BIN") or BUILDS / "13285d49d54f-cpu" / "bin" / "llama-server")
ALL_SPLIT_MODES = ["none", "layer", "row", "tensor"]
KV_TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]


def fixture(name: str) -> str:
    return (FIX / name).read_text()


def needs(binary: Path):
    return pytest.mark.skipif(
        not os.access(binary, os.X_OK),
        reason=f"no llama-server build at {binary} (tests/harness/llamacpp/build.sh makes it; the full lane does)",
    )


def subprocess_run(argv: list[str]) -> tuple[int, str, str]:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"})
    return p.returncode, p.stdout, p.stderr


# ---- parsers on the captures -------------------------------------------------------------


@pytest.mark.parametrize(
    "name, version, build, commit, compiler, target",
    [
        ("mainline-0c1e570", "0.5.0-dev", 1, "0d91d73bb", "GNU 12.2.0", "Linux x86_64"),
        ("pr22673-standin", "0.5.0-dev", 2, "13285d49d", "GNU 12.2.0", "Linux x86_64"),
        ("handmade-old-9333", None, 9333, "35c9b1f39", "cc (Debian 12.2.0-14) 12.2.0", "x86_64-linux-gnu"),
    ],
)
def test_parse_version(name, version, build, commit, compiler, target):
    v = lc.parse_version(fixture(f"{name}.version.txt"))
    assert (v["version"], v["build_number"], v["commit"]) == (version, build, commit)
    assert (v["compiler"], v["target"]) == (compiler, target)
    assert v["build_info"] == f"b{build}-{commit}"


def test_parse_version_finds_the_line_after_log_lines():
    text = "0.00.000.617 I srv  llama_server: initializing ...\n" + fixture("mainline-0c1e570.version.txt")
    assert lc.parse_version(text)["commit"] == "0d91d73bb"


@pytest.mark.parametrize(
    "name, spec_mtp, other",
    [("mainline-0c1e570", "draft-mtp", "mtp"), ("pr22673-standin", "mtp", "draft-mtp")],
)
def test_parse_help_of_the_real_builds(name, spec_mtp, other):
    caps = lc.parse_help(fixture(f"{name}.help.txt"))
    assert caps["mtp_spec_type"] == spec_mtp and caps["mtp_supported"] is True
    assert spec_mtp in caps["spec_types"] and other not in caps["spec_types"]
    assert len(caps["spec_types"]) == 11 and caps["spec_types"][0] == "none" and "ngram-cache" in caps["spec_types"]
    assert caps["split_modes"] == ALL_SPLIT_MODES
    assert caps["fit"] == {"--fit": True, "--fit-target": True, "--fit-ctx": True}
    assert all(caps["spec_flags"].values()) and set(caps["spec_flags"]) == set(lc.SPEC_FLAGS)
    assert caps["cache_types"] == KV_TYPES
    for flag in ("--no-webui", "--metrics", "--api-key-file", "--kv-unified", "--no-kv-unified", "--spec-draft-n-max"):
        assert flag in caps["flags"], flag
    assert {"-ctk", "-ctkd", "-fit", "-fitt", "-fitc", "-sm", "-no-kvu"} <= set(caps["short_flags"])
    # listed, but they only throw "the argument has been removed"
    assert {"--draft", "--draft-max", "--draft-min"} <= set(caps["removed_flags"])
    assert not set(caps["removed_flags"]) & set(caps["flags"])


def test_flags_are_every_long_name_the_help_lists():
    text = fixture("mainline-0c1e570.help.txt")
    caps = lc.parse_help(text)
    # independent count: every --name of an option line, before the 3+ spaces (not after ",") leading to the help
    expected = {
        n
        for line in text.splitlines()
        if line.startswith("-") and not line.startswith("-----")
        for n in re.findall(r"(?:^|, +)(--[a-z0-9][a-z0-9.-]*)", re.split(r"(?<![, ]) {3,}", line)[0])
    }
    assert set(caps["flags"]) | set(caps["removed_flags"]) == expected
    assert len(caps["flags"]) > 250


def test_parse_help_of_the_old_documented_format():
    """Hand-made fixture (SOURCES.md): bracketed `[none|mtp|ngram-cache]`, old draft flags, no fit/tensor."""
    caps = lc.parse_help(fixture("handmade-old-9333.help.txt"))
    assert caps["spec_types"] == ["none", "mtp", "ngram-cache"]
    assert caps["mtp_spec_type"] == "mtp"
    assert caps["split_modes"] == ["none", "layer", "row"]
    assert caps["fit"] == {"--fit": False, "--fit-target": False, "--fit-ctx": False}
    assert caps["spec_flags"] == {
        "--spec-draft-n-max": False,
        "--spec-draft-n-min": False,
        "--spec-draft-p-min": False,
        "--spec-draft-type-k": False,
        "-ctkd": True,
    }
    assert {"--draft-max", "--draft-min", "--draft-p-min", "--no-webui", "--metrics"} <= set(caps["flags"])
    assert "--kv-unified" not in caps["flags"] and caps["removed_flags"] == []
    assert caps["cache_types"] == KV_TYPES


def test_no_spec_type_means_no_mtp():
    text = "".join(ln for ln in fixture("handmade-old-9333.help.txt").splitlines(True) if "--spec-type" not in ln)
    caps = lc.parse_help(text)
    assert caps["spec_types"] == [] and caps["mtp_spec_type"] is None and caps["mtp_supported"] is False


def test_parse_list_devices():
    cpu = lc.parse_list_devices(fixture("mainline-0c1e570.list-devices.txt"))
    assert cpu == {"devices": [], "has_cuda": False}
    cuda = lc.parse_list_devices(fixture("llama-swap-4x-cuda.list-devices.txt"))
    assert cuda["has_cuda"] is True
    assert [d["name"] for d in cuda["devices"]] == ["CUDA0", "CUDA1", "CUDA2", "CUDA3"]
    assert cuda["devices"][1] == {
        "name": "CUDA1",
        "description": "Tesla P40",
        "memory_total_mib": 24438,
        "memory_free_mib": 24290,
    }


@pytest.mark.parametrize(
    "parser, text, words",
    [
        (lc.parse_version, "llama-server: error while loading shared libraries: libcuda.so.1", "no 'version: ...'"),
        (lc.parse_help, "usage: something else\n  --foo   bar\n", "lists no options"),
        (lc.parse_list_devices, "ggml_cuda_init: failed to initialize CUDA\n", "Available devices"),
    ],
)
def test_unrecognised_output_fails_clearly(parser, text, words):
    with pytest.raises(lc.LlamaCapsError) as e:
        parser(text)
    assert words in str(e.value) and text.splitlines()[0] in str(e.value)


def test_unreadable_spec_type_hint_fails():
    text = fixture("mainline-0c1e570.help.txt").replace("--spec-type none,", "--spec-type <TYPES> none,")
    with pytest.raises(lc.LlamaCapsError, match="cannot read the --spec-type values"):
        lc.parse_help(text)


# ---- probe() against the real binaries ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "binary, spelling",
    [
        pytest.param(MAINLINE_BIN, "draft-mtp", marks=needs(MAINLINE_BIN), id="mainline"),
        pytest.param(PR_BIN, "mtp", marks=needs(PR_BIN), id="pr22673-standin"),
    ],
)
def test_probe_real_binary(binary, spelling):
    caps = lc.probe(subprocess_run, str(binary))
    assert caps["confirmed"] is True and caps["mtp_spec_type"] == spelling
    assert caps["split_modes"] == ALL_SPLIT_MODES and caps["has_cuda"] is False and caps["devices"] == []
    _, _, err = subprocess_run([str(binary), "--version"])
    m = re.search(r"\(build (\d+), commit (\w+)\)", err)
    assert (caps["build_number"], caps["commit"]) == (int(m.group(1)), m.group(2))


@pytest.mark.slow
@needs(MAINLINE_BIN)
def test_confirmation_catches_help_that_lies():
    """The binary, not the help, has the last word: claim the PR spelling for the mainline build."""
    with pytest.raises(lc.LlamaCapsError, match="help and the binary disagree") as e:
        lc.confirm_mtp(subprocess_run, str(MAINLINE_BIN), "mtp")
    assert "unknown speculative type: mtp" in e.value.output
    with pytest.raises(lc.LlamaCapsError, match="does not list --spec-type 'draft-mtp'"):
        lc.confirm_mtp(subprocess_run, str(MAINLINE_BIN), None)
