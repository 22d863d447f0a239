#!/usr/bin/env python3
"""Build a signed stand-in of NVIDIA's CUDA apt repositories, for the cuda_toolkit scenario.

NVIDIA's servers cannot be reached from the test machines and the real toolkit is gigabytes,
so this builds what the role talks to, with the same layout and formats: for every
<distro>/<arch> (debian12, debian13, ubuntu2204, ubuntu2404 x x86_64, sbsa) a flat apt
repository (Packages, Release, InRelease signed by a throwaway key) holding
  - cuda-keyring_1.1-1_all.deb: the throwaway public key at
    /usr/share/keyrings/cuda-archive-keyring.gpg and, like NVIDIA's, a conffile
    /etc/apt/sources.list.d/cuda-<distro>-<arch>.list pointing at developer.download.nvidia.com;
  - cuda-toolkit-12-8_12.8.93-1_all.deb: /usr/local/cuda-12.8 with a bin/nvcc STAND-IN that
    prints a real `nvcc --version` capture of CUDA 12.8 and the architecture list of NVIDIA's
    12.8 nvcc reference for --list-gpu-arch (it compiles nothing).
Real apt, dpkg and gpgv verify and install all of it. Needs python3, dpkg-deb and gpg (+agent).

Usage: make_mirror.py OUTDIR   (serve OUTDIR over HTTP; base URL = http://HOST:PORT/compute/cuda/repos)
"""

import gzip
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

DISTROS = ("debian12", "debian13", "ubuntu2204", "ubuntu2404")
ARCHES = ("x86_64", "sbsa")
KEYRING_VERSION = "1.1-1"
NVCC_VERSION = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Fri_Feb_21_20:23:50_PST_2025
Cuda compilation tools, release 12.8, V12.8.93
Build cuda_12.8.r12.8/compiler.35583870_0
"""
ARCHS_12_8 = ("50", "52", "53", "60", "61", "62", "70", "72", "75", "80", "86", "87", "89", "90", "100", "101", "120")


def run(argv, **kw):
    subprocess.run(argv, check=True, **kw)


def control(fields):
    return "".join(f"{k}: {v}\n" for k, v in fields.items())


def build_deb(stage, out):
    run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", stage, out], stdout=subprocess.DEVNULL)


def keyring_deb(work, keyring, distro, arch):
    stage = os.path.join(work, f"keyring-{distro}-{arch}")
    os.makedirs(f"{stage}/DEBIAN")
    os.makedirs(f"{stage}/usr/share/keyrings")
    os.makedirs(f"{stage}/etc/apt/sources.list.d")
    shutil.copy(keyring, f"{stage}/usr/share/keyrings/cuda-archive-keyring.gpg")
    lst = f"/etc/apt/sources.list.d/cuda-{distro}-{arch}.list"
    with open(stage + lst, "w") as fh:
        fh.write(
            "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
            f"https://developer.download.nvidia.com/compute/cuda/repos/{distro}/{arch}/ /\n"
        )
    with open(f"{stage}/DEBIAN/conffiles", "w") as fh:
        fh.write(lst + "\n")
    with open(f"{stage}/DEBIAN/control", "w") as fh:
        fh.write(
            control(
                {
                    "Package": "cuda-keyring",
                    "Version": KEYRING_VERSION,
                    "Architecture": "all",
                    "Maintainer": "llamafleet tests <tests@llamafleet.invalid>",
                    "Description": "stand-in for NVIDIA's CUDA archive keyring (test key)",
                }
            )
        )
    out = os.path.join(work, f"cuda-keyring_{KEYRING_VERSION}_all-{distro}-{arch}.deb")
    build_deb(stage, out)
    return out


def toolkit_deb(work):
    stage = os.path.join(work, "toolkit")
    prefix = f"{stage}/usr/local/cuda-12.8"
    os.makedirs(f"{stage}/DEBIAN")
    os.makedirs(f"{prefix}/bin")
    os.makedirs(f"{prefix}/lib64")
    arch_list = "".join(f"compute_{a}\\n" for a in ARCHS_12_8)
    with open(f"{prefix}/bin/nvcc", "w") as fh:
        fh.write(
            "#!/bin/sh\n# STAND-IN for nvcc 12.8 (llamafleet tests): prints real output, compiles nothing.\n"
            'case "$1" in\n'
            "  --version) cat <<'EOF'\n" + NVCC_VERSION + "EOF\n  ;;\n"
            f"  --list-gpu-arch) printf '{arch_list}' ;;\n"
            '  *) echo "nvcc stand-in: $* is not supported" >&2; exit 1 ;;\n'
            "esac\n"
        )
    os.chmod(f"{prefix}/bin/nvcc", 0o755)
    with open(f"{prefix}/version.json", "w") as fh:
        fh.write('{"cuda": {"name": "CUDA SDK", "version": "12.8.1"}}\n')
    with open(f"{stage}/DEBIAN/control", "w") as fh:
        fh.write(
            control(
                {
                    "Package": "cuda-toolkit-12-8",
                    "Version": "12.8.93-1",
                    "Architecture": "all",
                    "Maintainer": "llamafleet tests <tests@llamafleet.invalid>",
                    "Description": "stand-in for NVIDIA's CUDA Toolkit 12.8 meta-package (nvcc stand-in only)",
                }
            )
        )
    out = os.path.join(work, "cuda-toolkit-12-8_12.8.93-1_all.deb")
    build_deb(stage, out)
    return out


def packages_entry(deb, name):
    fields = subprocess.run(["dpkg-deb", "-f", deb], check=True, capture_output=True, text=True).stdout
    with open(deb, "rb") as fh:
        data = fh.read()
    return (
        fields.rstrip("\n")
        + f"\nFilename: ./{name}\nSize: {len(data)}\nMD5sum: {hashlib.md5(data).hexdigest()}\n"
        + f"SHA256: {hashlib.sha256(data).hexdigest()}\n"
    )


def flat_repo(repo, debs, gpg_env, fpr):
    os.makedirs(repo)
    entries = []
    for src, name in debs:
        shutil.copy(src, os.path.join(repo, name))
        entries.append(packages_entry(os.path.join(repo, name), name))
    packages = "\n".join(entries).encode()
    with open(os.path.join(repo, "Packages"), "wb") as fh:
        fh.write(packages)
    with gzip.open(os.path.join(repo, "Packages.gz"), "wb") as fh:
        fh.write(packages)
    files = {"Packages": packages}
    with open(os.path.join(repo, "Packages.gz"), "rb") as fh:
        files["Packages.gz"] = fh.read()
    release = "Origin: llamafleet-test\nLabel: CUDA repository stand-in\n"
    release += "Date: " + time.strftime("%a, %d %b %Y %H:%M:%S UTC", time.gmtime(time.time() - 3600)) + "\n"
    for title, algo in (("MD5Sum", hashlib.md5), ("SHA256", hashlib.sha256)):
        release += f"{title}:\n" + "".join(f" {algo(d).hexdigest()} {len(d)} {n}\n" for n, d in files.items())
    with open(os.path.join(repo, "Release"), "w") as fh:
        fh.write(release)
    run(
        ["gpg", "--batch", "--yes", "--local-user", fpr, "--clearsign", "-o", "InRelease", "Release"],
        cwd=repo,
        env=gpg_env,
    )


def main():
    out = os.path.abspath(sys.argv[1])
    base = os.path.join(out, "compute", "cuda", "repos")
    if os.path.exists(base):
        shutil.rmtree(base)
    with tempfile.TemporaryDirectory() as work:
        gnupg = os.path.join(work, "gnupg")
        os.makedirs(gnupg, mode=0o700)
        env = dict(os.environ, GNUPGHOME=gnupg)
        uid = "llamafleet test CUDA mirror <cuda-mirror@llamafleet.invalid>"
        run(["gpg", "--batch", "--passphrase", "", "--quick-gen-key", uid, "ed25519", "sign", "never"], env=env,
            stderr=subprocess.DEVNULL)  # fmt: skip
        listing = subprocess.run(
            ["gpg", "--batch", "--with-colons", "--list-secret-keys"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        fpr = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
        keyring = os.path.join(work, "cuda-archive-keyring.gpg")
        with open(keyring, "wb") as fh:
            fh.write(subprocess.run(["gpg", "--export", fpr], env=env, check=True, capture_output=True).stdout)
        toolkit = toolkit_deb(work)
        for distro in DISTROS:
            for arch in ARCHES:
                kr = keyring_deb(work, keyring, distro, arch)
                debs = [(kr, f"cuda-keyring_{KEYRING_VERSION}_all.deb"), (toolkit, os.path.basename(toolkit))]
                flat_repo(os.path.join(base, distro, arch), debs, env, fpr)
        subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=env, check=False)
    print(base)


if __name__ == "__main__":
    main()
