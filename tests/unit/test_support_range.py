"""The support range the collection claims is the one CI tests: meta/runtime.yml's requires_ansible covers
exactly the ansible-core versions the lanes run (the project venv's, and each scripts/core-lane.sh version),
each tested version has its own ansible-test ignore file, and those files say the same thing."""

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def _tested_cores() -> set[str]:
    venv_core = re.search(r"^ansible-core==(\d+\.\d+)\.", (REPO / "requirements.txt").read_text(), re.M).group(1)
    lane = (REPO / "scripts" / "core-lane.sh").read_text()
    others = set(re.findall(r"^  (2\.\d+)\) python_version=", lane, re.M))
    for core in others:  # each lane's requirements pin that ansible-core
        req = (REPO / "tests" / f"requirements-core-{core}.txt").read_text()
        assert re.search(rf"^ansible-core=={re.escape(core)}\.\d+$", req, re.M), core
    run_tests = (REPO / "scripts" / "run-tests.sh").read_text()
    for core in others:  # ... and the fast lane runs it
        assert f"scripts/core-lane.sh {core}" in run_tests, core
    return {venv_core, *others}


def _minor(v: str) -> tuple[int, int]:
    major, minor = v.split(".")[:2]
    return int(major), int(minor)


def test_requires_ansible_is_exactly_the_tested_range():
    cores = sorted(_tested_cores(), key=_minor)
    spec = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())["requires_ansible"]
    low, high = cores[0], cores[-1]
    nxt = f"{_minor(high)[0]}.{_minor(high)[1] + 1}.0"
    assert spec == f">={low}.0,<{nxt}", (spec, cores)
    # no gap: every minor version inside the range is tested
    assert [m for _, m in map(_minor, cores)] == list(range(_minor(low)[1], _minor(high)[1] + 1)), cores


def test_one_ignore_file_per_tested_version_all_alike():
    files = {p.name: p.read_text() for p in (REPO / "tests" / "sanity").glob("ignore-*.txt")}
    assert set(files) == {f"ignore-{c}.txt" for c in _tested_cores()}, sorted(files)
    assert len(set(files.values())) == 1, "the ignore files differ: keep one list of reasons for every version"
    modules = sorted(p.name for p in (REPO / "plugins" / "modules").glob("*.py"))
    listed = sorted({line.split()[0].rsplit("/", 1)[-1] for line in next(iter(files.values())).splitlines() if line})
    assert listed == modules, "each module's license line, no stale one"


def test_execution_environment_pins_the_roles_huggingface_hub():
    """meta/ee-requirements.txt (what an execution environment installs for model_fetch's controller side)
    pins the huggingface_hub that model_fetch installs into its own venvs when the controller has none."""
    ee = yaml.safe_load((REPO / "meta" / "execution-environment.yml").read_text())
    python_file = REPO / ee["dependencies"]["python"]
    pins = [ln.split("#")[0].strip() for ln in python_file.read_text().splitlines() if ln.split("#")[0].strip()]
    defaults = yaml.safe_load((REPO / "roles" / "model_fetch" / "defaults" / "main.yml").read_text())
    assert pins == defaults["model_fetch_hf_pip_packages"], (pins, defaults["model_fetch_hf_pip_packages"])
    assert (REPO / ee["dependencies"]["system"]).is_file()
