"""Debian 12's real nvidia-cuda-toolkit installed by the role (source distro): a real compile for sm_70."""

KERNEL = "__global__ void twice(float *x) { x[threadIdx.x] *= 2.0f; }\n"


def test_package_from_non_free(host):
    assert host.package("nvidia-cuda-toolkit").version.startswith("11.8.")
    src = host.file("/etc/apt/sources.list.d/cuda-toolkit-distro.sources").content_string
    assert "Components: contrib non-free" in src and "Suites: bookworm bookworm-updates" in src


def test_nvcc_compiles_for_the_v100(host):
    host.run_expect([0], f"printf '%s' '{KERNEL}' > /tmp/twice.cu")
    # Debian 12's default gcc 12 is too new for CUDA 11.8 (and nvcc looks for `gcc`): use the
    # toolkit's host compiler, as cuda_toolkit_facts.host_compiler says
    out = host.run("cd /tmp && nvcc -ccbin /usr/bin/cuda-g++ -arch=sm_70 -c twice.cu -o twice.o")
    assert out.rc == 0, out.stderr
    assert "sm_70" in host.check_output("cuobjdump --list-elf /tmp/twice.o")


def test_no_path_changes_for_usr(host):
    assert not host.file("/etc/profile.d/cuda-toolkit.sh").exists
    assert not host.file("/etc/ld.so.conf.d/cuda-toolkit.conf").exists


def test_host_compiler_wrapper(host):
    assert host.package("nvidia-cuda-toolkit-gcc").is_installed
