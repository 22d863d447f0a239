"""State after converge (CUDA 12.8 from the repository stand-in) and the side effects.

Real parts: Debian 12 and 13 systemd hosts, real apt/dpkg/gpgv installing from a signed flat
repository with NVIDIA's layout. Stand-ins (what cannot exist here): the repository's content
(files/make_mirror.py: test signing key, cuda-toolkit-12-8 holding only an nvcc stand-in that
prints a real capture) and nvidia-smi (tests/stand-ins/nvidia-smi) for the GPUs.
"""

import pytest

PREFIX = "/usr/local/cuda-12.8"
MIRROR = "http://127.0.0.1:8765/compute/cuda/repos"


@pytest.fixture
def repo_dir(host):
    return "debian" + host.system_info.release.split(".")[0]


def test_keyring_pinned_and_held(host):
    pkg = host.package("cuda-keyring")
    assert pkg.is_installed and pkg.version == "1.1-1"
    assert "hold" in host.check_output("dpkg --get-selections cuda-keyring")
    assert host.file("/usr/share/keyrings/cuda-archive-keyring.gpg").is_file


def test_one_source_for_the_repository_at_the_mirror(host, repo_dir):
    # the keyring's own .list (pointing at developer.download.nvidia.com) was replaced by the deb822 file
    assert not host.file(f"/etc/apt/sources.list.d/cuda-{repo_dir}-x86_64.list").exists
    src = host.file(f"/etc/apt/sources.list.d/cuda-{repo_dir}-x86_64.sources")
    assert src.mode == 0o644
    assert src.content_string == (
        f"Types: deb\nURIs: {MIRROR}/{repo_dir}/x86_64/\nSuites: /\n"
        "Signed-By: /usr/share/keyrings/cuda-archive-keyring.gpg\n"
    )
    assert "developer.download.nvidia.com" not in host.check_output("cat /etc/apt/sources.list.d/* || true")


def test_toolkit_installed_from_the_repository(host, repo_dir):
    assert host.package("cuda-toolkit-12-8").version == "12.8.93-1"
    policy = host.check_output("apt-cache policy cuda-toolkit-12-8")
    assert f"{MIRROR}/{repo_dir}/x86_64" in policy
    assert "release 12.8, V12.8.93" in host.check_output(f"{PREFIX}/bin/nvcc --version")


def test_login_shells_find_nvcc(host):
    out = host.check_output("bash -lc 'command -v nvcc; echo $CUDA_HOME'").split()
    assert out == [f"{PREFIX}/bin/nvcc", PREFIX]
    # sourcing the profile twice does not stack PATH entries
    twice = host.check_output("bash -lc '. /etc/profile.d/cuda-toolkit.sh; echo $PATH'")
    assert twice.split(":").count(f"{PREFIX}/bin") == 1


def test_library_path(host):
    assert host.file("/etc/ld.so.conf.d/cuda-toolkit.conf").content_string.splitlines()[-1] == f"{PREFIX}/lib64"
    assert f"{PREFIX}/lib64:" in host.check_output("ldconfig -v 2>/dev/null | grep cuda || true")


def test_no_driver_and_no_distro_source(host):
    assert not host.package("cuda-drivers").is_installed
    assert not host.file("/etc/apt/sources.list.d/cuda-toolkit-distro.sources").exists
    assert not host.file("/usr/local/cuda-12.2").exists  # 12.2 was only planned (check mode)
