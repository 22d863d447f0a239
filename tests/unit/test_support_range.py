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


def _pins(text: str) -> dict[str, str]:
    return dict(re.findall(r"^\s*(?:- )?([A-Za-z0-9_.-]+)==([0-9][^\s#]*)", text, re.M))


def test_follower_ci_example_and_import_gate_pin_the_project_venvs_ansible():
    """Where the collection installs or tells users to install Ansible, it is the project venv's, a supported one:
    the fleet_follower role's venv, the GitHub Actions example and the import gate (no 2.19 left anywhere)."""
    venv = _pins((REPO / "requirements.txt").read_text())
    follower = yaml.safe_load((REPO / "roles" / "fleet_follower" / "defaults" / "main.yml").read_text())
    places = {
        "fleet_follower defaults": _pins("\n".join(follower["fleet_follower_pip_packages"])),
        "the GitHub Actions example": _pins(
            re.search(r"run: pip install (.*)", (REPO / "docs/examples/github-actions-follow-pr.yml").read_text())
            .group(1)
            .replace(" ", "\n")
        ),
        "the import gate": _pins((REPO / "tests" / "requirements-import-gate.txt").read_text()),
    }
    for where, pins in places.items():
        for name in ("ansible-core", "ansible", "cryptography"):
            assert pins.get(name) == venv[name], (where, name, pins.get(name), venv[name])
    spec = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())["requires_ansible"]
    low = re.match(r">=(\d+\.\d+)", spec).group(1)
    assert _minor(venv["ansible-core"]) >= _minor(low)


def test_the_version_is_a_major_step_when_the_unreleased_fragments_break():
    """galaxy.yml's version is the release the fragments go into: a breaking change or a removal in a fragment
    needs a major version above the last released one."""
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    released = yaml.safe_load((REPO / "changelogs" / "changelog.yaml").read_text())["releases"]
    last = max(released, key=lambda v: tuple(map(int, v.split("."))))
    breaking = [
        p.name
        for p in (REPO / "changelogs" / "fragments").glob("*.yml")
        if {"breaking_changes", "removed_features"} & set(yaml.safe_load(p.read_text()) or {})
    ]
    major, last_major = int(galaxy.split(".")[0]), int(last.split(".")[0])
    assert tuple(map(int, galaxy.split("."))) > tuple(map(int, last.split("."))), (galaxy, last)
    if breaking:
        assert major > last_major, f"{breaking} break compatibility: galaxy.yml's {galaxy} must be {last_major + 1}.0.0"
