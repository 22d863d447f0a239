"""Pure build logic: refs, CUDA architectures, CMake arguments, build keys, build assignments."""

import pytest
from ansible_collections.llamafleet.mtp.plugins.module_utils.llamacpp_build import (
    BuildInputError,
    assign_builds,
    build_key,
    check_extra_flags,
    check_targets,
    cmake_args,
    compiler_id,
    cuda_architecture,
    cuda_architectures,
    os_release_id,
    parse_ref,
)

SHA = "0d91d73bb06540eb9b765a132bd7037e29683040"


@pytest.mark.parametrize("ref", [22673, "22673", "#22673", "pull/22673", "PR/22673", "refs/pull/22673/head"])
def test_pull_request_forms(ref):
    assert parse_ref(ref) == {"kind": "pull", "ref": "refs/pull/22673/head", "pull": 22673}


@pytest.mark.parametrize(
    "ref,kind",
    [("b9180", "name"), ("master", "name"), ("mainline-0c1e570", "name"), (SHA, "sha"), ("ABCDEF1", "sha")],
)
def test_names_and_shas(ref, kind):
    assert parse_ref(ref)["kind"] == kind


@pytest.mark.parametrize("ref", ["", None, True, "1234567", "a b", "-x", "a..b", "x~1"])
def test_bad_refs(ref):
    with pytest.raises(BuildInputError):
        parse_ref(ref)


@pytest.mark.parametrize("cc,arch", [("7.0", "70"), ("8.6", "86"), ("8.9", "89"), ("9.0", "90"), ("12.0", "120")])
def test_cuda_architecture(cc, arch):
    assert cuda_architecture(cc) == arch


def test_architectures_from_gpu_facts_are_sorted_unique():
    facts = {"gpus": [{"index": i, "compute_capability": c} for i, c in enumerate(["8.6", "12.0", "7.0", "8.6"])]}
    assert cuda_architectures(facts) == ["70", "86", "120"]
    assert cuda_architectures({"count": 0, "gpus": []}) == []


def test_architectures_explicit_and_unknown():
    assert cuda_architectures(None, ["8.9", "120a-real", "70"]) == ["70", "89", "120a-real"]
    with pytest.raises(BuildInputError, match="no compute capability"):
        cuda_architectures({"gpus": [{"index": 0, "compute_capability": None}]})
    with pytest.raises(BuildInputError, match="not valid"):
        cuda_architectures(None, ["sm_86"])


def test_cmake_args_cpu_and_cuda():
    cpu = cmake_args(False, [], [], ccache=True)
    assert "-DGGML_CUDA=OFF" in cpu and "-DGGML_NATIVE=OFF" in cpu and "-DBUILD_SHARED_LIBS=OFF" in cpu
    assert "-DLLAMA_USE_PREBUILT_UI=OFF" in cpu and "-DGGML_CCACHE=ON" in cpu
    cuda = cmake_args(True, ["70", "86"], ["-DGGML_CUDA_FA_ALL_QUANTS=ON"])
    assert "-DCMAKE_CUDA_ARCHITECTURES=70;86" in cuda and "-DGGML_CUDA=ON" in cuda
    assert cuda[-1] == "-DGGML_CUDA_FA_ALL_QUANTS=ON"
    with pytest.raises(BuildInputError, match="at least one CUDA architecture"):
        cmake_args(True, [])


@pytest.mark.parametrize(
    "flag", ["-DGGML_NATIVE=ON", "-DCMAKE_CUDA_ARCHITECTURES=86", "-DGGML_CUDA:BOOL=ON", "GGML_X=1"]
)
def test_reserved_or_malformed_flags_refused(flag):
    with pytest.raises(BuildInputError):
        check_extra_flags([flag])


def test_targets():
    assert check_targets(["llama-bench", "llama-server"]) == ["llama-server", "llama-bench"]
    with pytest.raises(BuildInputError, match="must include llama-server"):
        check_targets(["llama-cli"])
    with pytest.raises(BuildInputError, match="unknown"):
        check_targets(["llama-server", "main"])


def _key(**kw):
    base = dict(
        commit=SHA,
        args=cmake_args(False, []),
        targets=["llama-server"],
        cuda_version=None,
        os_release="debian-12",
        compiler="g++=4:12.2.0-3",
    )
    base.update(kw)
    return build_key(**base)


def test_build_key_is_stable_and_sensitive():
    k = _key()
    assert k == _key()
    assert k["name"] == f"{SHA[:12]}-{k['key8']}" and len(k["key"]) == 64
    # ccache does not change the artifact
    assert _key(args=cmake_args(False, [], ccache=False))["key"] == k["key"]
    # everything that changes the binary changes the key
    others = [
        _key(commit="1" * 40),
        _key(args=cmake_args(True, ["86"])),
        _key(cuda_version="12.8"),
        _key(os_release="debian-13"),
        _key(compiler="g++=4:14.2.0-1"),
        _key(targets=["llama-server", "llama-bench"]),
    ]
    assert len({o["key"] for o in others} | {k["key"]}) == len(others) + 1
    with pytest.raises(BuildInputError, match="full 40-hex"):
        _key(commit="0d91d73")


def test_os_release_and_compiler_ids():
    assert os_release_id('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n') == "debian-12"
    assert os_release_id("ID=debian\nVERSION_CODENAME=trixie\n") == "debian-trixie"
    assert compiler_id("c++ (Debian 12.2.0-14+deb12u1) 12.2.0\nCopyright") == "c++ (Debian 12.2.0-14+deb12u1) 12.2.0"
    with pytest.raises(BuildInputError):
        compiler_id("")


def _plan(key8, installed=False, current=False):
    return {"key8": key8, "name": f"{SHA[:12]}-{key8}", "installed": installed, "up_to_date": current}


def test_assign_one_compile_per_key_in_play_order():
    plans = {"a": _plan("k1"), "b": _plan("k1"), "c": _plan("k2"), "d": _plan("k2")}
    out = assign_builds(plans, cached_keys=[])
    assert out["k1"] == {"name": f"{SHA[:12]}-k1", "action": "compile", "source": "a", "hosts": ["a", "b"]}
    assert out["k2"]["source"] == "c" and out["k2"]["action"] == "compile"


def test_assign_prefers_cache_then_installed_then_builders():
    plans = {"a": _plan("k1"), "b": _plan("k1", installed=True, current=True), "c": _plan("k2"), "d": _plan("k3")}
    out = assign_builds(plans, cached_keys=["k3"], builders=["x", "c"])
    assert out["k1"]["action"] == "package" and out["k1"]["source"] == "b" and out["k1"]["hosts"] == ["a"]
    assert out["k2"] == {"name": f"{SHA[:12]}-k2", "action": "compile", "source": "c", "hosts": ["c"]}
    assert out["k3"]["action"] == "cached"


def test_assign_nothing_when_up_to_date():
    assert assign_builds({"a": _plan("k1", installed=True, current=True)}, []) == {}
