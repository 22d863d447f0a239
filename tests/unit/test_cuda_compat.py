"""CUDA toolkit compatibility rules (plugins/module_utils/cuda_compat.py) and the cuda_toolkit_plan module.

Real parts: gpu_facts come from the nvidia-smi stand-in profiles through the real parser
(tests/unit/nvsmi_profiles.py); nvcc and apt-cache outputs are real captures (sources next to
each); Debian version ordering is checked against the real `dpkg --compare-versions`. nvcc
itself cannot exist here (no CUDA download without NVIDIA's network), so the module tests put
a script that prints a real nvcc capture under a prefix: a stand-in for the toolkit, not for
the logic.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.llamafleet.mtp.plugins.module_utils import cuda_compat as cc
from ansible_run import PLAYBOOK, run_playbook
from nvsmi_profiles import facts_from_profile, profile_path

# Real captures -------------------------------------------------------------------------------
# nvcc 12.8 from conda's cuda-toolkit (a user's WSL session, copied verbatim).
NVCC_12_8 = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Fri_Feb_21_20:23:50_PST_2025
Cuda compilation tools, release 12.8, V12.8.93
Build cuda_12.8.r12.8/compiler.35583870_0
"""
# nvcc 13.0 --list-gpu-arch and --version (lightvector/KataGo PR #1115, 2025-10-24), in nvcc's order.
NVCC_13_0_ARCH = """compute_75
compute_80
compute_86
compute_87
compute_88
compute_89
compute_90
compute_100
compute_110
compute_103
compute_120
compute_121
"""
NVCC_13_0 = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Wed_Aug_20_01:58:59_PM_PDT_2025
Cuda compilation tools, release 13.0, V13.0.88
Build cuda_13.0.r13.0/compiler.36424714_0
"""
# CUDA 12.9's nvcc reference list of architectures (as quoted in galaxyproject/KegAlign PR #38).
ARCHS_12_9 = ["50", "52", "53", "60", "61", "62", "70", "72", "75", "80", "86", "87", "89", "90"]
ARCHS_12_9 += ["100", "101", "103", "120", "121"]
# apt-cache policy nvidia-cuda-toolkit in localhost/debian-systemd:12 and :13 with contrib non-free added.
POLICY_DEB12 = """nvidia-cuda-toolkit:
  Installed: (none)
  Candidate: 11.8.89~11.8.0-5~deb12u1
  Version table:
     11.8.89~11.8.0-5~deb12u1 500
        500 http://deb.debian.org/debian bookworm/non-free amd64 Packages
"""
POLICY_DEB13 = """nvidia-cuda-toolkit:
  Installed: (none)
  Candidate: 12.4.131~12.4.1-2
  Version table:
     12.4.131~12.4.1-2 500
        500 http://deb.debian.org/debian trixie/non-free amd64 Packages
"""
POLICY_NO_CANDIDATE = """linux-headers-6.18.44-fc-v657:
  Installed: (none)
  Candidate: (none)
  Version table:
"""


def gpus(profile: str) -> dict:
    return facts_from_profile(profile_path(profile))


def blackwell(cc_value="12.0", name="NVIDIA GeForce RTX 5090", driver="570.153.02", cuda="12.8") -> dict:
    """gpu_facts shape for a GPU no capture covers yet (fields as the parser publishes them)."""
    return {
        "count": 1,
        "driver_version": driver,
        "cuda_driver_version": cuda,
        "source": "nvidia-smi",
        "gpus": [{"index": 0, "name": name, "compute_capability": cc_value}],
    }


DEB12 = {"distribution": "Debian", "distribution_version": "12", "architecture": "x86_64"}
CPU = {"count": 0, "driver_version": None, "cuda_driver_version": None, "source": "none", "gpus": []}


def run_plan(version, gpu_facts, source="nvidia", host="gpu-a", **kw):
    args = dict(DEB12)
    args.update(kw)
    return cc.plan(host=host, version=version, source=source, gpu_facts=gpu_facts, **args)


def refusal(version, gpu_facts, **kw) -> cc.Refused:
    with pytest.raises(cc.Refused) as info:
        run_plan(version, gpu_facts, **kw)
    return info.value


# Versions and tables ---------------------------------------------------------------------------


@pytest.mark.parametrize("value,expected", [("12.8", (12, 8)), (" 13.0 ", (13, 0)), ("12.10", (12, 10))])
def test_parse_version(value, expected):
    assert cc.parse_version(value) == expected


@pytest.mark.parametrize(
    "value,words",
    [(12.8, "quote it"), ("12.8.1", "MAJOR.MINOR"), ("twelve", "MAJOR.MINOR"), (True, "string"), (None, "string")],
)
def test_parse_version_refuses(value, words):
    with pytest.raises(cc.CudaInputError, match=words):
        cc.parse_version(value)


def test_table_matches_real_nvcc_13_0():
    assert cc.toolkit_architectures((13, 0)) == cc.parse_nvcc_arch_list(NVCC_13_0_ARCH)
    # 13.1..13.4 keep the 13.0 list (NVIDIA drops architectures at major releases only)
    assert cc.toolkit_architectures((13, 4)) == cc.toolkit_architectures((13, 0))


def real_nvccs() -> list[str]:
    """Real nvcc binaries on this machine (e.g. a pip-installed CUDA 13.0 compiler), if any."""
    found = {shutil.which("nvcc")} | {str(p) for p in Path("/usr/local").glob("cuda*/bin/nvcc")}
    return sorted({os.path.realpath(p) for p in found if p and os.access(p, os.X_OK)})


@pytest.mark.skipif(not real_nvccs(), reason="no real nvcc on this machine")
@pytest.mark.parametrize("nvcc", real_nvccs())
def test_table_matches_every_real_nvcc_here(nvcc):
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    archs = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, check=True).stdout
    info = cc.parse_nvcc_version(version)
    assert cc.toolkit_architectures(cc.parse_version(info["version"])) == cc.parse_nvcc_arch_list(archs)


def test_table_matches_nvcc_12_9_reference():
    assert cc.toolkit_architectures((12, 9)) == ARCHS_12_9
    assert cc.toolkit_architectures((12, 8)) == [a for a in ARCHS_12_9 if a not in ("103", "121")]
    assert "100" not in cc.toolkit_architectures((12, 6)) and "90" in cc.toolkit_architectures((12, 6))


def test_table_11_x():
    assert cc.toolkit_architectures((11, 8))[:2] == ["35", "37"] and cc.toolkit_architectures((11, 8))[-1] == "90"
    assert "86" not in cc.toolkit_architectures((11, 0)) and "86" in cc.toolkit_architectures((11, 1))
    assert "35" not in cc.toolkit_architectures((12, 0))


def test_driver_table_is_monotonic_and_matches_the_captured_profiles():
    versions = [cc.DRIVER_MIN[v] for v in sorted(cc.DRIVER_MIN)]
    assert versions == sorted(versions, key=lambda s: tuple(int(x) for x in s.split(".")))
    # every capture's driver branch is at least its reported CUDA version's minimum branch
    for name in ("seed-2x-v100-pcie16", "uts-2x-v100-pcie32", "noderecord-8x-h200-nvswitch", "lentvm-1x-h200"):
        f = gpus(name)
        need = cc.DRIVER_MIN[cc.parse_version(f["cuda_driver_version"])]
        assert cc.driver_branch(f["driver_version"]) >= cc.driver_branch(need), name


def test_newest_toolkit_for_driver():
    assert cc.newest_toolkit_for_driver((12, 2)) == (12, 2)
    assert cc.newest_toolkit_for_driver((12, 7)) == (12, 6)  # there is no 12.7
    assert cc.newest_toolkit_for_driver((10, 2)) is None


# Parsers -------------------------------------------------------------------------------------


def test_parse_nvcc_version_captures():
    assert cc.parse_nvcc_version(NVCC_12_8) == {"version": "12.8", "release": "12.8.93"}
    assert cc.parse_nvcc_version(NVCC_13_0) == {"version": "13.0", "release": "13.0.88"}
    with pytest.raises(cc.CudaInputError, match="cannot read"):
        cc.parse_nvcc_version("bash: nvcc: command not found")


def test_parse_nvcc_arch_list_sorts_and_accepts_sm_and_variants():
    assert cc.parse_nvcc_arch_list(NVCC_13_0_ARCH)[-4:] == ["103", "110", "120", "121"]
    assert cc.parse_nvcc_arch_list("sm_90\nsm_90a\nsm_100f\n") == ["90", "100"]
    assert cc.parse_nvcc_arch_list("") == []


def test_parse_apt_policy_captures():
    assert cc.parse_apt_policy(POLICY_DEB12) == {"installed": None, "candidate": "11.8.89~11.8.0-5~deb12u1"}
    assert cc.parse_apt_policy(POLICY_NO_CANDIDATE) == {"installed": None, "candidate": None}
    assert cc.parse_apt_policy("") == {"installed": None, "candidate": None}  # unknown package: no output
    assert cc.distro_package_toolkit("11.8.89~11.8.0-5~deb12u1") == (11, 8)
    assert cc.distro_package_toolkit(cc.parse_apt_policy(POLICY_DEB13)["candidate"]) == (12, 4)
    assert cc.distro_package_toolkit("12.0.140~12.0.1-4build4") == (12, 0)
    assert cc.distro_package_toolkit(None) is None


def test_nvidia_pci_gpus():
    devices = [("0x10de\n", "0x030200\n"), ("0x10de", "0x040300"), ("0x8086", "0x030000"), ("0x10de", "0x030000")]
    assert cc.nvidia_pci_gpus(devices) == 2  # 3D + VGA; the NVIDIA audio function does not count


DEB_PAIRS = [
    ("1.1-1", "1.0-1"),
    ("1.1-1", "1.1-1"),
    ("1.0-1", "1.0-1ubuntu1"),
    ("12.8.93-1", "12.8.61-1"),
    ("11.8.89~11.8.0-5~deb12u1", "11.8.89~11.8.0-5"),
    ("11.8.89~11.8.0-5~deb12u1", "11.8.89"),
    ("1:1.0-1", "2.0-1"),
    ("1.0~rc1-1", "1.0-1"),
    ("1.0a-1", "1.0-1"),
    ("1.0+b1", "1.0"),
    ("2.30-0", "2.4-9"),
    ("1.01-1", "1.1-1"),
    ("0-1", "0-1~"),
]


@pytest.mark.skipif(not shutil.which("dpkg"), reason="needs dpkg")
@pytest.mark.parametrize("a,b", DEB_PAIRS)
def test_deb_version_compare_agrees_with_dpkg(a, b):
    def dpkg(op):
        return subprocess.run(["dpkg", "--compare-versions", a, op, b], check=False).returncode == 0

    expected = -1 if dpkg("lt") else (0 if dpkg("eq") else 1)
    assert cc.deb_version_compare(a, b) == expected
    assert cc.deb_version_compare(b, a) == -expected


# Repositories --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dist,ver,arch,expected",
    [
        ("Debian", "12", "x86_64", ("debian12", "x86_64")),
        ("Debian", "12.7", "x86_64", ("debian12", "x86_64")),
        ("Debian", "13", "aarch64", ("debian13", "sbsa")),
        ("Ubuntu", "22.04", "x86_64", ("ubuntu2204", "x86_64")),
        ("Ubuntu", "24.04", "arm64", ("ubuntu2404", "sbsa")),
    ],
)
def test_nvidia_repo_path(dist, ver, arch, expected):
    repo = cc.nvidia_repo_path(dist, ver, arch)
    assert (repo["distro"], repo["arch"]) == expected


def test_nvidia_repo_path_refusals_and_overrides():
    with pytest.raises(cc.CudaInputError, match="no NVIDIA CUDA repository for Ubuntu 20.04.*cuda_toolkit_nvidia_repo"):
        cc.nvidia_repo_path("Ubuntu", "20.04", "x86_64")
    with pytest.raises(cc.CudaInputError, match="ppc64le"):
        cc.nvidia_repo_path("Debian", "12", "ppc64le")
    with pytest.raises(cc.CudaInputError, match="one of NVIDIA's repositories"):
        cc.nvidia_repo_path("Debian", "12", "x86_64", distro="debian11")
    with pytest.raises(cc.CudaInputError, match="x86_64 or sbsa"):
        cc.nvidia_repo_path("Debian", "12", "x86_64", arch="arm64")
    assert cc.nvidia_repo_path("Linuxmint", "22", "x86_64", distro="ubuntu2404") == {
        "distro": "ubuntu2404",
        "arch": "x86_64",
    }


@pytest.mark.parametrize("distro", ["debian12", "debian13", "ubuntu2204", "ubuntu2404"])
@pytest.mark.parametrize("arch", ["x86_64", "sbsa"])
def test_nvidia_repo_renders_a_flat_deb822_source(distro, arch):
    repo = cc.nvidia_repo("https://mirror.example/cuda/repos/", {"distro": distro, "arch": arch}, "1.1-1")
    url = f"https://mirror.example/cuda/repos/{distro}/{arch}/"
    assert repo["url"] == url
    assert repo["keyring_url"] == f"{url}cuda-keyring_1.1-1_all.deb"
    assert repo["source_file"] == f"/etc/apt/sources.list.d/cuda-{distro}-{arch}.sources"
    assert repo["keyring_list"] == f"/etc/apt/sources.list.d/cuda-{distro}-{arch}.list"
    [stanza] = cc.parse_deb822(repo["sources"])
    assert stanza == {"Types": "deb", "URIs": url, "Suites": "/", "Signed-By": cc.KEYRING_PATH}


def test_nvidia_repo_refuses_bad_inputs():
    with pytest.raises(cc.CudaInputError, match="base_url"):
        cc.nvidia_repo("developer.download.nvidia.com", {"distro": "debian12", "arch": "x86_64"}, "1.1-1")
    with pytest.raises(cc.CudaInputError, match="keyring_version"):
        cc.nvidia_repo(cc.DEFAULT_BASE_URL, {"distro": "debian12", "arch": "x86_64"}, "1.1")


def test_render_and_parse_deb822():
    text = cc.render_deb822("http://deb.debian.org/debian", ["bookworm", "bookworm-updates"], ["contrib", "non-free"])
    assert cc.parse_deb822(text) == [
        {
            "Types": "deb",
            "URIs": "http://deb.debian.org/debian",
            "Suites": "bookworm bookworm-updates",
            "Components": "contrib non-free",
        }
    ]
    with pytest.raises(cc.CudaInputError, match="flat"):
        cc.render_deb822("http://x/", "/", ["main"])
    with pytest.raises(cc.CudaInputError, match="needs Components"):
        cc.render_deb822("http://x/", "bookworm")
    with pytest.raises(cc.CudaInputError, match="whitespace"):
        cc.render_deb822("http://x/ y", "/")
    with pytest.raises(cc.CudaInputError, match="Field: value"):
        cc.parse_deb822("Types deb\n")
    with pytest.raises(cc.CudaInputError, match="repeated"):
        cc.parse_deb822("Types: deb\nTypes: deb-src\n")


# The plan ------------------------------------------------------------------------------------


def test_cpu_host_skips():
    p = run_plan("12.8", CPU)
    assert p["action"] == "skip" and p["skipped"] and "no NVIDIA GPU" in p["reason"]
    facts = cc.facts_from_plan(p)
    assert facts["skipped"] and facts["version"] is None and facts["architectures"] == []
    assert facts["host_compiler"] is None


def test_cpu_host_required_gpus_is_refused():
    e = refusal("12.8", CPU, require_gpus=True)
    assert "cuda_toolkit_require_gpus" in str(e) and "gpu-a" in str(e)


def test_cpu_build_host_installs_when_asked():
    p = run_plan("12.8", CPU, install_without_gpus=True)
    assert p["action"] == "install" and p["toolkit"]["package"] == "cuda-toolkit-12-8"
    assert p["repo"]["url"] == f"{cc.DEFAULT_BASE_URL}/debian12/x86_64/"
    assert p["driver"]["present"] is False and p["driver"]["new_enough"] is None


def test_gpus_on_pci_without_driver_are_reported():
    p = run_plan("12.8", CPU, observed={"pci_nvidia": 2})
    assert p["skipped"] and "2 NVIDIA GPU(s) on the PCI bus" in p["reason"] and "driver_manage" in p["reason"]


def test_cuda_13_refused_on_v100_before_any_change():
    e = refusal("13.0", gpus("seed-2x-v100-pcie16"), host="v100-a")
    msg = str(e)
    for words in ("v100-a", "Tesla V100-PCIE-16GB", "compute capability 7.0", "CUDA 13.0", "before changing anything"):
        assert words in msg
    assert "GPU 0" in msg and "GPU 1" in msg  # both GPUs named, in one reason
    assert any("dropped in CUDA 13.0" in r and "Volta" in r for r in e.reasons)
    # the seed's driver (535, CUDA 12.2) is too old as well: both problems at once
    assert any("12.2 < 13.0" in r for r in e.reasons) and len(e.reasons) == 2


def test_known_bad_13_2():
    e = refusal("13.2", gpus("lentvm-1x-h200"))
    assert any("known-bad" in r and "13.3" in r for r in e.reasons)
    e = refusal("13.2", gpus("lentvm-1x-h200"), allow_known_bad=True)  # the 13.0 driver is still too old
    assert not any("known-bad" in r for r in e.reasons)
    p = run_plan("13.2", blackwell(driver="595.10", cuda="13.2"), allow_known_bad=True)
    assert any("known-bad" in w for w in p["warnings"]) and p["action"] == "install"
    e = refusal("12.8", gpus("noderecord-8x-h200-nvswitch"), known_bad={"12.8": "site policy"})
    assert "site policy" in str(e)


def test_driver_too_old_names_both_numbers_and_the_fix():
    e = refusal("12.8", gpus("seed-2x-v100-pcie16"))
    [reason] = e.reasons
    assert "535.104.05" in reason and "12.2 < 12.8" in reason and "branch 535 < 570" in reason
    assert "branch >= 570 (570.26 or newer)" in reason and "cuda_toolkit_version <= 12.2" in reason
    assert "cuda_toolkit_driver_manage" in reason


def test_v100_with_its_driver_cuda_is_planned():
    p = run_plan("12.2", gpus("seed-2x-v100-pcie16"))
    assert p["action"] == "install" and p["toolkit"]["package"] == "cuda-toolkit-12-2"
    assert p["driver"]["new_enough"] is True and p["driver"]["branch"] == 535 and p["driver"]["min_branch"] == 535
    assert "70" in p["toolkit"]["architectures"]


def test_explicit_min_branch():
    e = refusal("12.2", gpus("seed-2x-v100-pcie16"), driver_min_branch=550)
    assert "branch 535 < 550" in str(e)


def test_blackwell_needs_12_8():
    e = refusal("12.6", blackwell(driver="560.35.05", cuda="12.6"))
    assert any("sm_120 needs CUDA >= 12.8" in r for r in e.reasons)
    assert run_plan("12.8", blackwell())["action"] == "install"
    e = refusal("12.8", blackwell(cc_value="10.3", name="NVIDIA B300", driver="575.51.03", cuda="12.9"))
    assert "sm_103 needs CUDA >= 12.9" in str(e)
    e = refusal("12.8", blackwell(cc_value="3.0", name="GRID K520"))
    assert "no supported CUDA toolkit targets sm_30" in str(e)


def test_unknown_compute_capability_and_unknown_versions_warn():
    f = blackwell(cc_value=None, name="Tesla T4", driver="580.65.06", cuda="13.0")
    p = run_plan("13.0", f)
    assert any("compute capability unknown" in w for w in p["warnings"])
    p = run_plan("13.9", blackwell(driver="600.1", cuda="13.9"))
    assert any("newer than this role's tables" in w for w in p["warnings"])
    assert p["driver"]["min_branch"] is None
    with pytest.raises(cc.CudaInputError, match="never released"):
        run_plan("12.7", CPU)
    with pytest.raises(cc.CudaInputError, match="older than"):
        run_plan("10.2", CPU)


def test_matching_toolkit_is_left_alone_with_nvcc_architectures():
    observed = {"nvcc": {"/usr/local/cuda-12.8": {"version_output": NVCC_12_8, "arch_output": None}}}
    p = run_plan("12.8", gpus("uts-2x-v100-pcie32"), observed=observed)
    assert p["action"] == "present"
    assert p["installed"]["release"] == "12.8.93" and p["installed"]["nvcc"] == "/usr/local/cuda-12.8/bin/nvcc"
    assert p["installed"]["architectures_source"] == "table"
    observed = {"nvcc": {"/usr/local/cuda-13.0": {"version_output": NVCC_13_0, "arch_output": NVCC_13_0_ARCH}}}
    p = run_plan("13.0", gpus("lentvm-1x-h200"), observed=observed)
    facts = cc.facts_from_plan(p)
    assert facts["installed"] and facts["version"] == "13.0" and facts["architectures_source"] == "nvcc"
    assert facts["host_compiler"] is None  # NVIDIA's toolkit uses the system compiler
    assert facts["architectures"] == cc.parse_nvcc_arch_list(NVCC_13_0_ARCH)


def test_source_none():
    observed = {"nvcc": {"/usr/local/cuda": {"version_output": NVCC_12_8, "arch_output": None}}}
    p = run_plan("12.8", gpus("uts-2x-v100-pcie32"), source="none", observed=observed)
    assert p["action"] == "present" and p["installed"]["prefix"] == "/usr/local/cuda"
    e = refusal("12.6", gpus("uts-2x-v100-pcie32"), source="none", observed=observed)
    assert "CUDA 12.6 is not installed" in str(e) and "found CUDA 12.8 at /usr/local/cuda" in str(e)
    assert "/usr/local/cuda-12.6, /usr/local/cuda, /usr" in str(e)
    assert run_plan("12.6", CPU, source="none")["skipped"]


def test_source_distro():
    e = refusal("12.8", gpus("seed-2x-v100-pcie16"), source="distro", distribution_release="bookworm")
    assert any("ships CUDA 11.8" in r and "cuda_toolkit_version: '11.8'" in r for r in e.reasons)
    p = run_plan("11.8", gpus("seed-2x-v100-pcie16"), source="distro", distribution_release="bookworm")
    assert p["repo"]["enable_components"] and p["repo"]["ships"] == "11.8"
    assert cc.parse_deb822(p["repo"]["sources"])[0]["Components"] == "contrib non-free"
    assert p["toolkit"]["prefix"] == "/usr"
    assert p["toolkit"]["package"] == ["nvidia-cuda-toolkit", "nvidia-cuda-toolkit-gcc"]  # nvcc needs its gcc
    assert cc.facts_from_plan(p)["host_compiler"] == "/usr/bin/cuda-g++"
    # apt's candidate wins over the table; already enabled -> no extra source
    p = run_plan(
        "12.4",
        gpus("uts-2x-v100-pcie32"),
        source="distro",
        distribution_version="13",
        distribution_release="trixie",
        observed={"distro_policy": POLICY_DEB13},
    )
    assert p["repo"]["candidate"] == "12.4.131~12.4.1-2" and not p["repo"]["enable_components"]
    p = run_plan("12.0", CPU, source="distro", distribution="Ubuntu", distribution_version="24.04",
                 distribution_release="noble", architecture="aarch64", install_without_gpus=True)  # fmt: skip
    stanza = cc.parse_deb822(p["repo"]["sources"])[0]
    assert stanza["URIs"] == "http://ports.ubuntu.com/ubuntu-ports" and stanza["Components"] == "universe multiverse"
    with pytest.raises(cc.CudaInputError, match="package_version"):
        run_plan("11.8", CPU, source="distro", package_version="11.8.0-1")


def test_package_version_pin():
    p = run_plan("12.8", CPU, install_without_gpus=True, package_version="12.8.1-1")
    assert p["toolkit"]["package"] == "cuda-toolkit-12-8=12.8.1-1"
    with pytest.raises(cc.CudaInputError, match="does not belong"):
        run_plan("12.8", CPU, package_version="12.9.0-1")


def test_keyring_is_kept_when_same_or_newer():
    def action(installed):
        return run_plan("12.8", CPU, install_without_gpus=True, observed={"keyring_installed": installed})["repo"][
            "keyring_action"
        ]

    assert action(None) == "install"
    assert action("1.0-1") == "install"
    assert action("1.1-1") == "keep"
    assert action("1.2-1") == "keep"


def test_driver_manage_requires_kernel_headers():
    e = refusal(
        "12.8",
        gpus("seed-2x-v100-pcie16"),
        driver_manage=True,
        kernel="6.18.44-fc-v657",
        observed={"headers_policy": POLICY_NO_CANDIDATE},
    )
    [reason] = e.reasons
    assert "linux-headers-6.18.44-fc-v657" in reason and "running kernel" in reason
    p = run_plan(
        "12.8",
        gpus("seed-2x-v100-pcie16"),
        driver_manage=True,
        kernel="6.1.0-25-amd64",
        observed={"headers_policy": POLICY_DEB12.replace("nvidia-cuda-toolkit", "linux-headers-6.1.0-25-amd64")},
    )
    d = p["driver"]
    assert d["action"] == "upgrade" and d["packages"] == ["cuda-drivers-570"] and d["headers_available"]
    assert any("will be upgraded" in w for w in p["warnings"])
    # no driver yet, GPUs on the bus: install it
    p = run_plan(
        "12.8", CPU, driver_manage=True, kernel="k", observed={"pci_nvidia": 1, "headers_policy": POLICY_DEB12}
    )
    assert p["driver"]["action"] == "install" and not p["skipped"]
    # a driver that is new enough is left alone even when managed
    p = run_plan("12.8", gpus("noderecord-8x-h200-nvswitch"), driver_manage=True, kernel="k")
    assert p["driver"]["action"] == "none" and p["driver"]["new_enough"]
    e = refusal("12.8", gpus("seed-2x-v100-pcie16"), source="none", driver_manage=True, kernel="k",
                observed={"headers_policy": POLICY_DEB12})  # fmt: skip
    assert "set cuda_toolkit_driver_packages" in str(e)


def test_bad_inputs():
    with pytest.raises(cc.CudaInputError, match="cuda_toolkit_source"):
        run_plan("12.8", CPU, source="conda")


# The module, run by the real ansible CLI -------------------------------------------------------


def run_module(args: dict, tmp_path) -> dict:
    """Run the module once on localhost with ARGS (written into a one-task playbook); return its result."""
    play = [{"hosts": "localhost", "gather_facts": False, "tasks": [{"llamafleet.mtp.cuda_toolkit_plan": args}]}]
    book = tmp_path / "plan.yml"
    book.write_text(json.dumps(play))
    extra = ["-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}"]
    return run_playbook(book, path="/usr/bin:/bin:/usr/sbin:/sbin", extra_args=extra)


def module_args(version, gpu_facts, **kw):
    args = {"host": "gpu-a", "version": version, "gpu_facts": gpu_facts, "pci_devices_dir": "/nonexistent"}
    args.update(DEB12)
    args.update(kw)
    return args


def nvcc_standin(prefix, version_text, arch_text=None):
    """A script printing a real nvcc capture (stand-in for an installed toolkit)."""
    bindir = prefix / "bin"
    bindir.mkdir(parents=True)
    (prefix / "version.txt").write_text(version_text)
    body = f'#!/bin/sh\ncase "$1" in\n  --version) cat "{prefix}/version.txt" ;;\n'
    if arch_text is not None:
        (prefix / "arch.txt").write_text(arch_text)
        body += f'  --list-gpu-arch) cat "{prefix}/arch.txt" ;;\n'
    body += '  *) echo "nvcc fatal   : Unknown option $1" >&2; exit 1 ;;\nesac\n'
    (bindir / "nvcc").write_text(body)
    (bindir / "nvcc").chmod(0o755)


pytestmark_module = pytest.mark.skipif(not PLAYBOOK.exists(), reason="needs the project venv's ansible")


@pytestmark_module
def test_module_refuses_cuda_13_on_v100(tmp_path):
    r = run_module(module_args("13.0", gpus("seed-2x-v100-pcie16")), tmp_path)
    assert r["failed"] and "Tesla V100-PCIE-16GB" in r["msg"] and len(r["reasons"]) == 2
    assert r["plan"]["action"] == "refuse"


@pytestmark_module
def test_module_detects_installed_toolkit(tmp_path):
    prefix = tmp_path / "cuda-13.0"
    nvcc_standin(prefix, NVCC_13_0, NVCC_13_0_ARCH)
    r = run_module(module_args("13.0", gpus("lentvm-1x-h200"), source="none", prefix=str(prefix)), tmp_path)
    assert not r.get("failed"), r.get("msg")
    assert r["changed"] is False and r["plan"]["action"] == "present"
    assert r["facts"]["nvcc"] == f"{prefix}/bin/nvcc" and r["facts"]["architectures_source"] == "nvcc"
    assert r["facts"]["architectures"] == cc.toolkit_architectures((13, 0))


@pytestmark_module
def test_module_without_list_gpu_arch_uses_the_table(tmp_path):
    prefix = tmp_path / "cuda-12.8"
    nvcc_standin(prefix, NVCC_12_8)
    r = run_module(module_args("12.8", gpus("uts-2x-v100-pcie32"), source="none", prefix=str(prefix)), tmp_path)
    assert r["facts"]["architectures_source"] == "table" and r["facts"]["release"] == "12.8.93"


@pytestmark_module
def test_module_cpu_host_skips_and_reads_pci(tmp_path):
    dev = tmp_path / "pci" / "0000:3b:00.0"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x10de\n")
    (dev / "class").write_text("0x030200\n")
    r = run_module(module_args("12.8", CPU, pci_devices_dir=str(tmp_path / "pci")), tmp_path)
    assert not r.get("failed") and r["plan"]["skipped"] and "1 NVIDIA GPU(s) on the PCI bus" in r["msg"]
    r = run_module(module_args("12.8", CPU), tmp_path)
    assert r["facts"]["skipped"] and r["facts"]["reason"] == "no NVIDIA GPU (gpu_facts.count is 0)"


@pytestmark_module
@pytest.mark.skipif(not real_nvccs(), reason="no real nvcc on this machine")
def test_module_with_a_real_nvcc(tmp_path):
    nvcc = real_nvccs()[0]
    prefix = os.path.dirname(os.path.dirname(nvcc))
    version = cc.parse_nvcc_version(subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout)
    r = run_module(
        module_args(version["version"], CPU, source="none", prefix=prefix, install_without_gpus=True), tmp_path
    )
    assert not r.get("failed"), r.get("msg")
    assert r["facts"]["installed"] and r["facts"]["release"] == version["release"] and r["facts"]["nvcc"] == nvcc
    assert r["facts"]["architectures_source"] == "nvcc"


@pytestmark_module
def test_module_bad_version(tmp_path):
    r = run_module(module_args("12.8.1", CPU), tmp_path)
    assert r["failed"] and "MAJOR.MINOR" in r["msg"]
