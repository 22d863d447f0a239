"""Every role default is an option of the role's argument_specs, with the same default where both are literal values
(as prometheus-community's lint_arguments_spec.sh checks its roles): a default missing from the specs is not
validated and does not reach the converge digest (fleet_declared hashes the options the specs name), so changing it
would never be applied to converged hosts."""

from pathlib import Path

import pytest
import yaml

ROLES = sorted(p for p in (Path(__file__).resolve().parents[2] / "roles").iterdir() if (p / "meta").is_dir())


def _options(role):
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    out = {}
    for entry in specs.values():
        for name, option in (entry.get("options") or {}).items():
            out.setdefault(name, option)
    return out


def _templated(value):
    return isinstance(value, str) and "{{" in value


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_every_default_is_specified_with_the_same_value(role):
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    options = _options(role)
    missing = sorted(set(defaults) - set(options))
    assert not missing, f"{role.name}: defaults without an argument_specs option: {missing}"
    differ = {
        name: (value, options[name].get("default"))
        for name, value in defaults.items()
        if not _templated(value) and not options[name].get("required") and options[name].get("default") != value
    }
    assert not differ, f"{role.name}: defaults/main.yml vs argument_specs.yml: {differ}"


def test_the_walk_can_fail(tmp_path):
    role = tmp_path / "r"
    (role / "meta").mkdir(parents=True)
    (role / "defaults").mkdir()
    (role / "meta" / "argument_specs.yml").write_text(
        "argument_specs:\n  main:\n    options:\n      r_a: {type: int, default: 1}\n"
    )
    (role / "defaults" / "main.yml").write_text("r_a: 2\nr_b: x\n")
    with pytest.raises(AssertionError, match="r_b"):
        test_every_default_is_specified_with_the_same_value(role)
    (role / "defaults" / "main.yml").write_text("r_a: 2\n")
    with pytest.raises(AssertionError, match="r_a"):
        test_every_default_is_specified_with_the_same_value(role)


def test_the_host_paths_are_written_once():
    """module_utils/host_paths.py holds them; the doc fragment and the roles' defaults and specs say the same (the
    modules' own DOCUMENTATION is held to their argument specs, built from host_paths, by validate-modules)."""
    import ast  # noqa: PLC0415

    from ansible_collections.llamafleet.mtp.plugins.module_utils import host_paths  # noqa: PLC0415

    repo = ROLES[0].parent.parent
    fragment = next(
        n
        for n in ast.walk(ast.parse((repo / "plugins" / "doc_fragments" / "attributes.py").read_text()))
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "HOST_PATHS"
    )
    documented = yaml.safe_load(fragment.value.value)["options"]
    assert {k: v["default"] for k, v in documented.items()} == {
        k: host_paths.DEFAULTS[k] for k in ("config_dir", "unit_dir", "install_root")
    }
    roles = {r.name: (yaml.safe_load((r / "defaults" / "main.yml").read_text()), _options(r)) for r in ROLES}
    want = {
        ("llamacpp_mtp_build", "llamacpp_mtp_build_install_root"): host_paths.INSTALL_ROOT,
        ("llama_server_systemd", "llama_server_systemd_config_dir"): host_paths.CONFIG_DIR,
        ("llama_server_systemd", "llama_server_systemd_snapshot_dir"): host_paths.SNAPSHOT_DIR,
        ("llama_server_systemd", "llama_server_systemd_binary"): host_paths.INSTALL_ROOT + "/current/bin/llama-server",
    }
    for (role, var), value in want.items():
        assert roles[role][0][var] == value == roles[role][1][var]["default"], (role, var)
    # the server role falls back to the build role's root when that role did not run
    assert (
        f"default('{host_paths.INSTALL_ROOT}')" in roles["llama_server_systemd"][0]["llama_server_systemd_install_root"]
    )
