"""Pure logic of the cuda_toolkit role: which CUDA toolkit a host may get, and from where.

No Ansible imports: used by the llamafleet.mtp.cuda_toolkit_plan module and unit-tested directly.

Rules (sources: NVIDIA's CUDA release notes and nvcc references, shared/LLAMACPP.md section 5):

- A toolkit can only compile for the architectures its nvcc knows (``ARCH_RANGES``). CUDA 13.0
  removed offline compilation for compute capability < 7.5 (Maxwell, Pascal, Volta: the V100 is
  7.0), Blackwell (10.0, 12.0) needs CUDA >= 12.8, 10.3 and 12.1 need 12.9, Thor is 11.0 from 13.0.
- Known-bad versions are refused (``KNOWN_BAD``): CUDA 13.2's nvcc miscompiles some quant kernels.
- The driver's CUDA version (the ``CUDA Version`` nvidia-smi prints, ``gpu_facts.cuda_driver_version``)
  must be >= the toolkit's major.minor; ``DRIVER_MIN`` holds the minimum Linux driver per toolkit.
- NVIDIA's apt repositories live at ``<base>/<distro>/<arch>/`` (flat repositories, ``Suites: /``)
  with distro one of debian12, debian13, ubuntu2204, ubuntu2404 and arch x86_64 or sbsa (aarch64
  servers); the cuda-keyring package there carries the signing key.

``plan()`` takes what was observed on a host (gpu_facts, nvcc outputs, apt-cache policy outputs,
the NVIDIA PCI devices) and returns the plan, or raises ``Refused`` with every reason at once.
"""

from __future__ import annotations

import re

DEFAULT_BASE_URL = "https://developer.download.nvidia.com/compute/cuda/repos"
DEFAULT_KEYRING_VERSION = "1.1-1"
KEYRING_PATH = "/usr/share/keyrings/cuda-archive-keyring.gpg"
MIN_SUPPORTED = (11, 0)
SOURCES = ("nvidia", "distro", "none")

# CUDA toolkit releases (major, minor). There was no 12.7.
RELEASED = [(11, m) for m in range(9)] + [(12, m) for m in range(7)] + [(12, 8), (12, 9)] + [(13, m) for m in range(5)]

# Architecture (CMake spelling: 70 = compute capability 7.0) -> (first toolkit, last toolkit or None).
# Checked against nvcc --list-gpu-arch of 12.9 (50..72, 75..90, 100, 101, 103, 120, 121) and
# 13.0 (75 80 86 87 88 89 90 100 110 103 120 121: 101 became 110, everything below 75 is gone).
ARCH_RANGES = {
    35: ((11, 0), (11, 8)),
    37: ((11, 0), (11, 8)),
    50: ((11, 0), (12, 9)),
    52: ((11, 0), (12, 9)),
    53: ((11, 0), (12, 9)),
    60: ((11, 0), (12, 9)),
    61: ((11, 0), (12, 9)),
    62: ((11, 0), (12, 9)),
    70: ((11, 0), (12, 9)),
    72: ((11, 0), (12, 9)),
    75: ((11, 0), None),
    80: ((11, 0), None),
    86: ((11, 1), None),
    87: ((11, 4), None),
    88: ((13, 0), None),
    89: ((11, 8), None),
    90: ((11, 8), None),
    100: ((12, 8), None),
    101: ((12, 8), (12, 9)),
    103: ((12, 9), None),
    110: ((13, 0), None),
    120: ((12, 8), None),
    121: ((12, 9), None),
}
FAMILY = {35: "Kepler", 37: "Kepler", 50: "Maxwell", 52: "Maxwell", 53: "Maxwell", 60: "Pascal", 61: "Pascal"}
FAMILY.update({62: "Pascal", 70: "Volta", 72: "Volta", 75: "Turing", 80: "Ampere", 86: "Ampere", 87: "Ampere"})
FAMILY.update({88: "Ampere", 89: "Ada", 90: "Hopper", 100: "Blackwell", 101: "Blackwell", 103: "Blackwell"})
FAMILY.update({110: "Blackwell", 120: "Blackwell", 121: "Blackwell"})

# Minimum Linux driver per toolkit (CUDA release notes, "CUDA Toolkit and Corresponding Driver
# Versions"). Newer toolkits are not listed: their check relies on the driver's CUDA version.
DRIVER_MIN = {
    (11, 0): "450.36.06",
    (11, 1): "455.23",
    (11, 2): "460.27.03",
    (11, 3): "465.19.01",
    (11, 4): "470.42.01",
    (11, 5): "495.29.05",
    (11, 6): "510.39.01",
    (11, 7): "515.43.04",
    (11, 8): "520.61.05",
    (12, 0): "525.60.13",
    (12, 1): "530.30.02",
    (12, 2): "535.54.03",
    (12, 3): "545.23.06",
    (12, 4): "550.54.14",
    (12, 5): "555.42.02",
    (12, 6): "560.28.03",
    (12, 8): "570.26",
    (12, 9): "575.51.03",
    (13, 0): "580.65.06",
    (13, 1): "590.44.01",
}

KNOWN_BAD = {
    "13.2": (
        "CUDA 13.2's nvcc (cicc -O2) miscompiles some llama.cpp quant kernels (gibberish with IQ3_S, "
        "IQ3_XXS, IQ2_M; llama.cpp #21255, #21371, unsloth#4849); fixed in 13.3. Use 12.8, 13.1 or 13.3+"
    ),
}

# NVIDIA repository directory per (distribution id, version).
NVIDIA_REPO_DISTROS = {
    ("debian", "12"): "debian12",
    ("debian", "13"): "debian13",
    ("ubuntu", "22.04"): "ubuntu2204",
    ("ubuntu", "24.04"): "ubuntu2404",
}
NVIDIA_REPO_ARCHES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "sbsa", "arm64": "sbsa", "sbsa": "sbsa"}

# The distribution's own toolkit (package nvidia-cuda-toolkit): what each release ships, used when
# apt cannot tell yet (component not enabled). apt's candidate wins when there is one.
DISTRO_PACKAGE = "nvidia-cuda-toolkit"
# nvcc runs `gcc` unless told otherwise, but the toolkit only depends on a versioned g++ it supports
# (g++-11 on Debian 12, whose default gcc 12 is too new for CUDA 11.8); this package adds
# /usr/bin/cuda-gcc and cuda-g++ pointing at it: pass `-ccbin cuda-g++` (CMake:
# -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/cuda-g++). Published as cuda_toolkit_facts.host_compiler.
DISTRO_HOST_COMPILER_PACKAGE = "nvidia-cuda-toolkit-gcc"
DISTRO_HOST_COMPILER = "/usr/bin/cuda-g++"
DISTRO_TOOLKITS = {
    ("debian", "12"): (11, 8),  # 11.8.89~11.8.0-5~deb12u1 (non-free)
    ("debian", "13"): (12, 4),  # 12.4.131~12.4.1-2 (non-free)
    ("ubuntu", "22.04"): (11, 5),  # 11.5.1-1ubuntu1 (multiverse)
    ("ubuntu", "24.04"): (12, 0),  # 12.0.140~12.0.1-4build4 (multiverse)
}
DISTRO_COMPONENTS = {"debian": ["contrib", "non-free"], "ubuntu": ["universe", "multiverse"]}
DISTRO_KEYRINGS = {
    "debian": "/usr/share/keyrings/debian-archive-keyring.gpg",
    "ubuntu": "/usr/share/keyrings/ubuntu-archive-keyring.gpg",
}


class CudaInputError(ValueError):
    """Bad input; the message says what is wrong and what to do."""


class Refused(Exception):
    """The requested toolkit must not be installed on this host; nothing has been changed."""

    def __init__(self, message: str, reasons: list[str], plan: dict):
        super().__init__(message)
        self.reasons = reasons
        self.plan = plan


# ---------------------------------------------------------------------------------------------
# Versions


def parse_version(value, what: str = "cuda_toolkit_version") -> tuple[int, int]:
    """'12.8' -> (12, 8). Refuses floats (YAML 12.10 becomes 12.1), patch levels and garbage."""
    if isinstance(value, bool) or value is None:
        raise CudaInputError(f"{what} must be a string like '12.8', got {value!r}")
    if isinstance(value, float):
        raise CudaInputError(f"{what} is the number {value!r}: quote it ('{value}') so YAML keeps it a string")
    text = str(value).strip()
    m = re.fullmatch(r"(\d+)\.(\d+)", text)
    if not m:
        raise CudaInputError(f"{what}={text!r} is not MAJOR.MINOR (e.g. '12.8'); pin a package version separately")
    return int(m.group(1)), int(m.group(2))


def vstr(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def parse_cc(value) -> tuple[int, int] | None:
    """Compute capability '7.0' -> (7, 0); None/unknown -> None."""
    if value is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", str(value))
    if not m:
        return None
    return int(m.group(1)), int(m.group(2))


def cc_to_arch(cc: tuple[int, int]) -> int:
    return cc[0] * 10 + cc[1]


def arch_to_cc(arch: int) -> str:
    return f"{arch // 10}.{arch % 10}"


def newest_known() -> tuple[int, int]:
    return RELEASED[-1]


def is_released(version: tuple[int, int]) -> bool:
    return version in RELEASED


def toolkit_architectures(version: tuple[int, int]) -> list[str]:
    """Architectures (CMake spelling, ascending) the toolkit's nvcc can compile for (from the table).

    A version newer than the table gets the newest known row (NVIDIA only drops architectures at
    major releases)."""
    row = min(version, newest_known()) if version[0] == newest_known()[0] else version
    out = []
    for arch, (first, last) in sorted(ARCH_RANGES.items()):
        if row >= first and (last is None or row <= last):
            out.append(str(arch))
    return out


def min_toolkit_for_arch(arch: int) -> tuple[int, int] | None:
    rng = ARCH_RANGES.get(arch)
    return rng[0] if rng else None


def max_toolkit_for_arch(arch: int) -> tuple[int, int] | None:
    rng = ARCH_RANGES.get(arch)
    return rng[1] if rng else None


def driver_branch(driver_version) -> int | None:
    m = re.match(r"\s*(\d+)", str(driver_version or ""))
    return int(m.group(1)) if m else None


def min_driver(version: tuple[int, int]) -> str | None:
    return DRIVER_MIN.get(version)


def newest_toolkit_for_driver(cuda_driver_version: tuple[int, int]) -> tuple[int, int] | None:
    """The newest released toolkit a driver reporting CUDA X.Y can run."""
    ok = [v for v in RELEASED if v <= cuda_driver_version]
    return ok[-1] if ok else None


# ---------------------------------------------------------------------------------------------
# Parsers for what the host says


def parse_nvcc_version(text: str) -> dict:
    """`nvcc --version` -> {version: '12.8', release: '12.8.93'}; raises CudaInputError."""
    m = re.search(r"release (\d+)\.(\d+), V(\d+(?:\.\d+)*)", text or "")
    if not m:
        raise CudaInputError(f"cannot read a CUDA release from nvcc --version output: {(text or '').strip()[:200]!r}")
    return {"version": f"{int(m.group(1))}.{int(m.group(2))}", "release": m.group(3)}


def parse_nvcc_arch_list(text: str) -> list[str]:
    """`nvcc --list-gpu-arch` (compute_75 ...) or --list-gpu-code (sm_75 ...) -> ['75', ...] ascending."""
    archs = {int(m.group(1)) for m in re.finditer(r"\b(?:compute|sm)_(\d+)[a-z]?\b", text or "")}
    return [str(a) for a in sorted(archs)]


def parse_apt_policy(text: str) -> dict:
    """`apt-cache policy PKG` -> {installed, candidate} (None for '(none)' or an unknown package)."""
    out = {"installed": None, "candidate": None}
    for line in (text or "").splitlines():
        m = re.match(r"\s+(Installed|Candidate):\s*(\S+)", line)
        if m:
            value = None if m.group(2) == "(none)" else m.group(2)
            out[m.group(1).lower()] = value
    return out


def distro_package_toolkit(package_version: str | None) -> tuple[int, int] | None:
    """nvidia-cuda-toolkit's Debian version -> toolkit: '11.8.89~11.8.0-5~deb12u1' -> (11, 8)."""
    if not package_version:
        return None
    upstream = package_version.split(":", 1)[-1]
    m = re.match(r"(\d+)\.(\d+)", upstream)
    return (int(m.group(1)), int(m.group(2))) if m else None


def nvidia_pci_gpus(devices) -> int:
    """Count NVIDIA display/3D controllers among (vendor, class) pairs read from sysfs."""
    n = 0
    for vendor, klass in devices:
        if str(vendor).strip().lower() == "0x10de" and str(klass).strip().lower().startswith("0x03"):
            n += 1
    return n


def _deb_order(c: str) -> int:
    if c == "~":
        return -1
    if c.isalpha():
        return ord(c)
    return ord(c) + 256


def _deb_cmp_part(a: str, b: str) -> int:
    ia = ib = 0
    while ia < len(a) or ib < len(b):
        first_diff = 0
        while (ia < len(a) and not a[ia].isdigit()) or (ib < len(b) and not b[ib].isdigit()):
            ac = _deb_order(a[ia]) if ia < len(a) and not a[ia].isdigit() else 0
            bc = _deb_order(b[ib]) if ib < len(b) and not b[ib].isdigit() else 0
            if ac != bc:
                return -1 if ac < bc else 1
            ia += 1
            ib += 1
        while ia < len(a) and a[ia] == "0":
            ia += 1
        while ib < len(b) and b[ib] == "0":
            ib += 1
        while ia < len(a) and a[ia].isdigit() and ib < len(b) and b[ib].isdigit():
            if not first_diff:
                first_diff = ord(a[ia]) - ord(b[ib])
            ia += 1
            ib += 1
        if ia < len(a) and a[ia].isdigit():
            return 1
        if ib < len(b) and b[ib].isdigit():
            return -1
        if first_diff:
            return -1 if first_diff < 0 else 1
    return 0


def deb_version_compare(a: str, b: str) -> int:
    """dpkg's version comparison (epoch, upstream, revision): -1, 0 or 1."""

    def split(v: str) -> tuple[int, str, str]:
        v = v.strip()
        epoch = 0
        if ":" in v:
            e, v = v.split(":", 1)
            epoch = int(e) if e.isdigit() else 0
        upstream, _dummy, revision = v.rpartition("-") if "-" in v else (v, "", "")
        return epoch, upstream, revision

    ea, ua, ra = split(a)
    eb, ub, rb = split(b)
    if ea != eb:
        return -1 if ea < eb else 1
    return _deb_cmp_part(ua, ub) or _deb_cmp_part(ra, rb)


# ---------------------------------------------------------------------------------------------
# Repositories


def nvidia_repo_path(distribution: str, distribution_version: str, architecture: str, distro="", arch="") -> dict:
    """(distro dir, arch dir) of NVIDIA's repository for this host; explicit overrides are validated."""
    dist_id = (distribution or "").strip().lower()
    major = str(distribution_version or "").strip()
    key_version = major if dist_id == "ubuntu" else major.split(".", maxsplit=1)[0]
    supported = sorted(set(NVIDIA_REPO_DISTROS.values()))
    if distro:
        if distro not in supported:
            raise CudaInputError(
                f"cuda_toolkit_nvidia_repo_distro={distro!r} is not one of NVIDIA's repositories this role knows "
                f"({', '.join(supported)})"
            )
        repo_distro = distro
    else:
        repo_distro = NVIDIA_REPO_DISTROS.get((dist_id, key_version))
        if not repo_distro:
            raise CudaInputError(
                f"no NVIDIA CUDA repository for {distribution} {distribution_version} "
                f"(supported: {', '.join(supported)}); set cuda_toolkit_nvidia_repo_distro to the closest one, "
                "or use cuda_toolkit_source: distro or none"
            )
    if arch:
        if arch not in ("x86_64", "sbsa"):
            raise CudaInputError(f"cuda_toolkit_nvidia_repo_arch={arch!r} must be x86_64 or sbsa")
        repo_arch = arch
    else:
        repo_arch = NVIDIA_REPO_ARCHES.get((architecture or "").strip().lower())
        if not repo_arch:
            raise CudaInputError(
                f"no NVIDIA CUDA repository for the {architecture} architecture (x86_64, and aarch64 as sbsa)"
            )
    return {"distro": repo_distro, "arch": repo_arch}


def render_deb822(uris, suites, components=(), signed_by: str = "", types="deb") -> str:
    """A deb822 source stanza. A flat repository (suite ending in '/') has no Components."""
    uris = [uris] if isinstance(uris, str) else list(uris)
    suites = [suites] if isinstance(suites, str) else list(suites)
    if not uris or not suites:
        raise CudaInputError("a deb822 source needs at least one URI and one suite")
    flat = any(s.endswith("/") for s in suites)
    if flat and components:
        raise CudaInputError("a flat repository (suite ending in '/') takes no Components")
    if not flat and not components:
        raise CudaInputError("a deb822 source with a named suite needs Components")
    for value in uris + suites + list(components) + [signed_by]:
        if any(c.isspace() for c in value):
            raise CudaInputError(f"whitespace in deb822 value {value!r}")
    lines = [f"Types: {types}", f"URIs: {' '.join(uris)}", f"Suites: {' '.join(suites)}"]
    if components:
        lines.append(f"Components: {' '.join(components)}")
    if signed_by:
        lines.append(f"Signed-By: {signed_by}")
    return "\n".join(lines) + "\n"


def parse_deb822(text: str) -> list[dict]:
    """Parse deb822 stanzas (what apt reads from *.sources) into dicts; raises on malformed lines."""
    stanzas, cur = [], {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            if cur:
                stanzas.append(cur)
                cur = {}
            continue
        if line.startswith("#"):
            continue
        if line[0].isspace():
            raise CudaInputError(f"line {n}: continuation lines are not used in these sources: {line!r}")
        key, sep, value = line.partition(":")
        if not sep or not key or not re.fullmatch(r"[A-Za-z][A-Za-z0-9-]*", key):
            raise CudaInputError(f"line {n}: not 'Field: value': {line!r}")
        if key in cur:
            raise CudaInputError(f"line {n}: field {key} repeated")
        cur[key] = value.strip()
    if cur:
        stanzas.append(cur)
    return stanzas


def nvidia_repo(base_url: str, repo: dict, keyring_version: str) -> dict:
    base = (base_url or "").rstrip("/")
    if not re.match(r"^(https?|file)://\S+$", base):
        raise CudaInputError(
            f"cuda_toolkit_nvidia_repo_base_url={base_url!r} is not an http(s):// or file:// URL "
            f"(default {DEFAULT_BASE_URL})"
        )
    if not re.fullmatch(r"[0-9][0-9A-Za-z.+~]*-[0-9A-Za-z.+~]+", keyring_version or ""):
        raise CudaInputError(f"cuda_toolkit_keyring_version={keyring_version!r} is not a Debian version like 1.1-1")
    url = f"{base}/{repo['distro']}/{repo['arch']}/"
    name = f"cuda-{repo['distro']}-{repo['arch']}"
    return {
        "distro": repo["distro"],
        "arch": repo["arch"],
        "url": url,
        "keyring_version": keyring_version,
        "keyring_deb": f"cuda-keyring_{keyring_version}_all.deb",
        "keyring_url": f"{url}cuda-keyring_{keyring_version}_all.deb",
        "keyring_path": KEYRING_PATH,
        # cuda-keyring ships its own .list pointing at NVIDIA; the role replaces it with this file
        # so that a mirror is the only source (and apt sees no conflicting Signed-By).
        "keyring_list": f"/etc/apt/sources.list.d/{name}.list",
        "source_file": f"/etc/apt/sources.list.d/{name}.sources",
        "sources": render_deb822(url, "/", signed_by=KEYRING_PATH),
    }


def toolkit_package(version: tuple[int, int], package_version: str = "") -> str:
    name = f"cuda-toolkit-{version[0]}-{version[1]}"
    return f"{name}={package_version}" if package_version else name


def nvcc_candidates(version: tuple[int, int], source: str, prefix: str = "") -> list[str]:
    """Prefixes to look for nvcc under, most specific first."""
    if prefix:
        return [prefix.rstrip("/") or "/"]
    if source == "distro":
        return ["/usr"]
    cands = [f"/usr/local/cuda-{vstr(version)}"]
    if source == "none":
        cands += ["/usr/local/cuda", "/usr"]
    return cands


# ---------------------------------------------------------------------------------------------
# The plan


def _gpu_label(g: dict) -> str:
    return f"GPU {g.get('index')} {g.get('name') or '?'} (compute capability {g.get('compute_capability') or '?'})"


def check_gpus(version: tuple[int, int], gpus: list[dict]) -> tuple[list[str], list[str]]:
    """(refusals, warnings) for targeting these GPUs with this toolkit."""
    refusals, warnings = [], []
    by_problem: dict[tuple, list[str]] = {}
    for g in gpus:
        cc = parse_cc(g.get("compute_capability"))
        if cc is None:
            warnings.append(f"{_gpu_label(g)}: compute capability unknown (driver older than R510?), not checked")
            continue
        arch = cc_to_arch(cc)
        first, last = ARCH_RANGES.get(arch, (None, None))
        if first is None:
            if cc < (3, 5):
                by_problem.setdefault(("old", arch), []).append(_gpu_label(g))
            else:
                warnings.append(f"{_gpu_label(g)}: architecture sm_{arch} not in this role's table, not checked")
            continue
        if version < first:
            by_problem.setdefault(("new", arch), []).append(_gpu_label(g))
        elif last is not None and version > last:
            by_problem.setdefault(("dropped", arch), []).append(_gpu_label(g))
    for (kind, arch), labels in by_problem.items():
        who = ", ".join(labels)
        if kind == "old":
            refusals.append(f"{who}: no supported CUDA toolkit targets sm_{arch}")
            continue
        first, last = ARCH_RANGES[arch]
        if kind == "new":
            refusals.append(
                f"CUDA {vstr(version)} cannot compile for {who}: sm_{arch} needs CUDA >= {vstr(first)}"
                + (" (Blackwell needs 12.8+)" if arch in (100, 101, 120) else "")
            )
        else:
            family = FAMILY.get(arch, "")
            dropped_in = next(v for v in RELEASED if v > last)
            extra = ""
            if dropped_in == (13, 0):
                extra = " (CUDA 13 removed offline compilation for compute capability < 7.5: Maxwell, Pascal, Volta)"
            refusals.append(
                f"CUDA {vstr(version)} cannot compile for {who}{' [' + family + ']' if family else ''}: "
                f"sm_{arch} was dropped in CUDA {vstr(dropped_in)}{extra}; use CUDA {vstr(last)} or older "
                f"(e.g. 12.8) on this host"
            )
    return refusals, warnings


def _headers_ok(policy: dict | None) -> bool:
    return bool(policy and (policy.get("installed") or policy.get("candidate")))


def _requested_version(version, source: str, package_version: str, driver_min_branch: int) -> tuple[int, int]:
    """The requested toolkit as (major, minor), or CudaInputError when the request itself is unusable."""
    if source not in SOURCES:
        raise CudaInputError(f"cuda_toolkit_source={source!r} must be one of {', '.join(SOURCES)}")
    want = parse_version(version)
    if want < MIN_SUPPORTED:
        raise CudaInputError(f"CUDA {vstr(want)} is older than this role supports ({vstr(MIN_SUPPORTED)}+)")
    if want <= newest_known() and not is_released(want):
        raise CudaInputError(f"CUDA {vstr(want)} was never released; pick one of 12.6, 12.8, 12.9, 13.x")
    if package_version and source != "nvidia":
        raise CudaInputError("cuda_toolkit_package_version only applies to cuda_toolkit_source: nvidia")
    if package_version and not package_version.startswith(f"{vstr(want)}."):
        raise CudaInputError(
            f"cuda_toolkit_package_version={package_version!r} does not belong to CUDA {vstr(want)} "
            f"(e.g. {vstr(want)}.1-1)"
        )
    if driver_min_branch and int(driver_min_branch) < 0:
        raise CudaInputError("cuda_toolkit_driver_min_branch must be 0 (from the toolkit) or a branch like 570")
    return want


def _new_result(host: str, want: tuple[int, int], source: str, gpus: list[dict], warnings: list[str]) -> dict:
    """The plan before any decision: the request, the GPUs and what the tables say about the toolkit."""
    return {
        "host": host,
        "version": vstr(want),
        "source": source,
        "action": None,
        "skipped": False,
        "reason": None,
        "gpus": [
            {"index": g.get("index"), "name": g.get("name"), "compute_capability": g.get("compute_capability")}
            for g in gpus
        ],
        "toolkit": {
            "known": is_released(want),
            "architectures": toolkit_architectures(want),
            "min_driver": min_driver(want),
            "known_bad": None,
        },
        "installed": None,
        "found": [],
        "repo": None,
        "driver": None,
        "warnings": warnings,
    }


def _check_known_bad(
    want: tuple[int, int], known_bad: dict | None, allow_known_bad: bool, toolkit: dict
) -> tuple[list[str], list[str]]:
    """(refusals, warnings) for a toolkit on the known-bad list; records the entry in ``toolkit``."""
    refusals, warnings = [], []
    bad = dict(KNOWN_BAD)
    bad.update({str(k): str(v) for k, v in (known_bad or {}).items()})
    if vstr(want) in bad:
        toolkit["known_bad"] = bad[vstr(want)]
        if allow_known_bad:
            warnings.append(f"CUDA {vstr(want)} is on the known-bad list (allowed): {bad[vstr(want)]}")
        else:
            refusals.append(
                f"CUDA {vstr(want)} is on the known-bad list: {bad[vstr(want)]} "
                "(cuda_toolkit_allow_known_bad: true overrides)"
            )
    return refusals, warnings


def _find_installed(result: dict, want: tuple[int, int], prefix: str, nvcc_seen: dict) -> list[str]:
    """Fill in every toolkit nvcc reports under the candidate prefixes (found) and the first of the
    requested version (installed); warnings for nvcc outputs that cannot be read."""
    warnings = []
    for pfx in nvcc_candidates(want, result["source"], prefix):
        seen = nvcc_seen.get(pfx)
        if not seen or not seen.get("version_output"):
            continue
        try:
            info = parse_nvcc_version(seen["version_output"])
        except CudaInputError as e:
            warnings.append(f"{pfx}/bin/nvcc: {e}")
            continue
        archs = parse_nvcc_arch_list(seen.get("arch_output") or "")
        entry = {
            "version": info["version"],
            "release": info["release"],
            "prefix": pfx,
            "nvcc": f"{pfx.rstrip('/')}/bin/nvcc",
            "architectures": archs or toolkit_architectures(parse_version(info["version"])),
            "architectures_source": "nvcc" if archs else "table",
        }
        result["found"].append(entry)
        if info["version"] == vstr(want) and result["installed"] is None:
            result["installed"] = entry
    return warnings


def _check_gpus_present(
    result: dict,
    want: tuple[int, int],
    gpus: list[dict],
    no_gpus: bool,
    pci: int | None,
    require_gpus: bool,
    install_without_gpus: bool,
    driver_manage: bool,
) -> tuple[list[str], list[str]]:
    """(refusals, warnings) for the host's GPUs; a host without a working one is marked skipped
    unless something asks to go on (require_gpus refuses it instead)."""
    if not no_gpus:
        return check_gpus(want, gpus)
    why = "no NVIDIA GPU (gpu_facts.count is 0)"
    if pci:
        why = f"{pci} NVIDIA GPU(s) on the PCI bus but no working driver (nvidia-smi missing or failing)" + (
            "" if driver_manage else "; install the driver or set cuda_toolkit_driver_manage: true"
        )
    if require_gpus:
        return [f"cuda_toolkit_require_gpus is true but this host has {why}"], []
    if not install_without_gpus and not (pci and driver_manage):
        result.update(action="skip", skipped=True, reason=why)
    return [], []


def _driver_state(
    want: tuple[int, int], facts: dict, driver_min_branch: int, no_gpus: bool, driver_manage: bool, kernel: str
) -> tuple[dict, list[str], list[str]]:
    """(driver, too_old, warnings): the plan's driver entry, why the driver is too old for the toolkit
    (empty when new enough or absent), and a warning when its version is unknown."""
    drv_version = facts.get("driver_version")
    branch = driver_branch(drv_version)
    drv_cuda = parse_cc(facts.get("cuda_driver_version"))  # same X.Y shape
    table_min = min_driver(want)
    if want > newest_known():
        table_min = None
    min_branch = int(driver_min_branch or 0) or (driver_branch(table_min) if table_min else None)
    too_old, warnings = [], []
    if not no_gpus:
        if drv_cuda is not None and drv_cuda < want:
            too_old.append(f"its CUDA version is {vstr(drv_cuda)} < {vstr(want)}")
        if branch is not None and min_branch and branch < min_branch:
            too_old.append(f"branch {branch} < {min_branch}")
        if drv_cuda is None and branch is None:
            warnings.append("driver version unknown: the driver/toolkit match is not checked")
    driver = {
        "present": not no_gpus,
        "version": drv_version,
        "branch": branch,
        "cuda_version": facts.get("cuda_driver_version"),
        "min_branch": min_branch,
        "min_version": table_min,
        "new_enough": None if no_gpus else not too_old,
        "manage": bool(driver_manage),
        "action": "none",
        "packages": [],
        "headers_package": f"linux-headers-{kernel}" if kernel else None,
        "headers_available": None,
    }
    return driver, too_old, warnings


def _driver_too_old_refusal(want: tuple[int, int], driver: dict, too_old: list[str]) -> str:
    """The refusal for a too old driver the role may not upgrade: both numbers and the fixes."""
    min_branch, table_min = driver["min_branch"], driver["min_version"]
    fix_target = f"branch >= {min_branch}" + (f" ({table_min} or newer)" if table_min else "")
    if not min_branch:
        fix_target = f"whose nvidia-smi reports CUDA Version >= {vstr(want)}"
    drv_cuda = parse_cc(driver["cuda_version"])
    newest = newest_toolkit_for_driver(drv_cuda) if drv_cuda else None
    return (
        f"the driver {driver['version']} is too old for CUDA {vstr(want)}: {' and '.join(too_old)}. Fix: install a "
        f"driver {fix_target} (or set cuda_toolkit_driver_manage: true)"
        + (f", or request cuda_toolkit_version <= {vstr(newest)}" if newest else "")
    )


def _plan_driver_install(
    want: tuple[int, int], driver: dict, source: str, dist_id: str, driver_packages, headers, kernel: str
) -> list[str]:
    """Fill in the driver install or upgrade the role does; refusals when it cannot (branch unknown,
    no packages, no kernel headers)."""
    refusals = []
    min_branch = driver["min_branch"]
    if not min_branch:
        refusals.append(
            f"cuda_toolkit_driver_manage is true but the driver branch for CUDA {vstr(want)} is not in this "
            "role's table: set cuda_toolkit_driver_min_branch"
        )
    pkgs = list(driver_packages or []) or default_driver_packages(source, dist_id, min_branch or 0)
    if not pkgs:
        refusals.append(
            "cuda_toolkit_driver_manage is true with cuda_toolkit_source: none: set cuda_toolkit_driver_packages"
        )
    driver["packages"] = pkgs
    driver["action"] = "upgrade" if driver["present"] else "install"
    driver["headers_available"] = _headers_ok(parse_apt_policy(headers) if isinstance(headers, str) else headers)
    if not driver["headers_available"]:
        refusals.append(
            f"the driver must be built for the running kernel {kernel or '?'}, but {driver['headers_package']} is "
            "neither installed nor available from apt (kernel upgraded without a reboot, or a custom kernel): "
            "reboot into a kernel with headers available, or install them, then rerun"
        )
    return refusals


def _check_driver(
    result: dict,
    want: tuple[int, int],
    facts: dict,
    no_gpus: bool,
    observed: dict,
    distribution: str,
    manage: bool,
    min_branch: int,
    packages,
    kernel: str,
) -> tuple[list[str], list[str]]:
    """(refusals, warnings) for the host's driver and the toolkit; fills in the plan's driver entry,
    with the install or upgrade when cuda_toolkit_driver_manage lets the role do it."""
    driver, too_old, warnings = _driver_state(want, facts, min_branch, no_gpus, manage, kernel)
    result["driver"] = driver
    refusals = []
    if too_old and not manage:
        refusals.append(_driver_too_old_refusal(want, driver, too_old))
    if manage and ((too_old and not no_gpus) or (no_gpus and observed.get("pci_nvidia"))):
        dist_id = (distribution or "").strip().lower()
        headers = observed.get("headers_policy")
        refusals += _plan_driver_install(want, driver, result["source"], dist_id, packages, headers, kernel)
    if driver["new_enough"] is False and manage:
        warnings.append(
            f"the driver {driver['version']} is too old for CUDA {vstr(want)} ({' and '.join(too_old)}): "
            "it will be upgraded; the new driver is used after a reboot"
        )
    return refusals, warnings


def _plan_nvidia_source(
    result: dict,
    want: tuple[int, int],
    repo_args: tuple,
    base_url: str,
    keyring: tuple,
    package_version: str,
    prefix: str,
) -> list[str]:
    """Fill in NVIDIA's repository (repo_args: nvidia_repo_path's; keyring: wanted, installed version) and
    the toolkit package; warnings. No repository is an error unless the host is skipped or has the toolkit."""
    keyring_version, keyring_installed = keyring
    warnings = []
    try:
        repo = nvidia_repo_path(*repo_args)
        result["repo"] = nvidia_repo(base_url, repo, keyring_version)
    except CudaInputError as e:
        if not result["skipped"] and result["installed"] is None:
            raise
        result["repo"] = None
        warnings.append(str(e))
    if result["repo"] is not None:
        result["repo"]["keyring_installed"] = keyring_installed
        result["repo"]["keyring_action"] = (
            "keep" if keyring_installed and deb_version_compare(keyring_installed, keyring_version) >= 0 else "install"
        )
    result["toolkit"]["package"] = toolkit_package(want, package_version)
    result["toolkit"]["package_name"] = toolkit_package(want)
    result["toolkit"]["prefix"] = prefix or f"/usr/local/cuda-{vstr(want)}"
    return warnings


def _plan_distro_source(
    result: dict,
    want: tuple[int, int],
    dist: tuple,
    architecture: str,
    distro_mirror: str,
    policy,
    prefix: str,
) -> tuple[list[str], list[str]]:
    """Fill in the distribution's toolkit package and sources (dist: name, version, release); (refusals,
    warnings) when it is not Debian or Ubuntu, or ships another CUDA than requested."""
    refusals, warnings = [], []
    distribution, distribution_version, distribution_release = dist
    dist_id = (distribution or "").strip().lower()
    dist_version = str(distribution_version or "")
    dist_key = (dist_id, dist_version if dist_id == "ubuntu" else dist_version.split(".", maxsplit=1)[0])
    pol = parse_apt_policy(policy) if isinstance(policy, str) else (policy or {"installed": None, "candidate": None})
    cand = pol.get("candidate")
    ships = distro_package_toolkit(cand) or DISTRO_TOOLKITS.get(dist_key)
    result["repo"] = {
        "package": DISTRO_PACKAGE,
        "candidate": cand,
        "ships": vstr(ships) if ships else None,
        "enable_components": cand is None,
        "components": DISTRO_COMPONENTS.get(dist_id, []),
        "source_file": "/etc/apt/sources.list.d/cuda-toolkit-distro.sources",
        "sources": None,
    }
    if dist_id in DISTRO_COMPONENTS and distribution_release:
        mirror = distro_mirror or _default_distro_mirror(dist_id, architecture)
        result["repo"]["sources"] = render_deb822(
            mirror,
            [distribution_release, f"{distribution_release}-updates"],
            DISTRO_COMPONENTS[dist_id],
            DISTRO_KEYRINGS[dist_id],
        )
    elif dist_id not in DISTRO_COMPONENTS and not result["skipped"]:
        refusals.append(f"cuda_toolkit_source: distro supports Debian and Ubuntu, not {distribution}")
    if ships is None and dist_id in DISTRO_COMPONENTS:
        warnings.append(f"{distribution} {distribution_version}: which CUDA its {DISTRO_PACKAGE} ships is unknown")
    elif ships is not None and ships != want and result["installed"] is None and not result["skipped"]:
        refusals.append(
            f"{distribution} {distribution_version} ships CUDA {vstr(ships)} ({DISTRO_PACKAGE} "
            f"{cand or 'from its table'}), not {vstr(want)}: set cuda_toolkit_version: '{vstr(ships)}' "
            "or use cuda_toolkit_source: nvidia"
        )
    result["toolkit"]["package"] = [DISTRO_PACKAGE, DISTRO_HOST_COMPILER_PACKAGE]
    result["toolkit"]["package_name"] = DISTRO_PACKAGE
    result["toolkit"]["prefix"] = prefix or "/usr"
    return refusals, warnings


def _plan_preinstalled(result: dict, want: tuple[int, int], source: str, prefix: str) -> list[str]:
    """Fill in a preinstalled toolkit (cuda_toolkit_source: none); refusals when it is missing."""
    result["toolkit"]["package"] = None
    result["toolkit"]["package_name"] = None
    result["toolkit"]["prefix"] = prefix or f"/usr/local/cuda-{vstr(want)}"
    if result["installed"] is None and not result["skipped"]:
        found = ", ".join(f"CUDA {f['version']} at {f['prefix']}" for f in result["found"]) or "no nvcc"
        return [
            f"cuda_toolkit_source is none (preinstalled) but CUDA {vstr(want)} is not installed: looked under "
            f"{', '.join(nvcc_candidates(want, source, prefix))}, found {found}. Install it, set "
            "cuda_toolkit_prefix, or use cuda_toolkit_source: nvidia"
        ]
    return []


def _refusal_message(result: dict, want: tuple[int, int], facts: dict, refusals: list[str]) -> str:
    """The message of a refusal: the request, the host's GPUs and driver, then every reason numbered."""
    drv_version = facts.get("driver_version")
    gpu_text = ", ".join(f"{g['name']} ({g['compute_capability']})" for g in result["gpus"]) or "no GPUs"
    drv_text = f"driver {drv_version}, CUDA {facts.get('cuda_driver_version')}" if drv_version else "no driver"
    return (
        f"cuda_toolkit refuses CUDA {vstr(want)} (source {result['source']}) on {result['host']} [{gpu_text}; "
        f"{drv_text}] before changing anything: " + " | ".join(f"({i}) {r}" for i, r in enumerate(refusals, 1))
    )


def _newer_than_tables(want: tuple[int, int]) -> list[str]:
    """The warning for a toolkit newer than this module's tables (their newest row is assumed)."""
    if want > newest_known():
        return [
            f"CUDA {vstr(want)} is newer than this role's tables ({vstr(newest_known())}): architectures and the "
            "driver minimum are assumed from the newest known release"
        ]
    return []


def _gather(refusals: list[str], warnings: list[str], found: tuple[list[str], list[str]]) -> None:
    """Append one stage's (refusals, warnings) to the plan's, in order."""
    refusals += found[0]
    warnings += found[1]


def _decide_action(result: dict) -> list[str]:
    """Set the action of a plan that is neither skipped nor refused (present or install); warnings."""
    matching = result["installed"]
    result["action"] = "present" if matching else "install"
    if matching is None and result["found"]:
        others = ", ".join(f"{f['version']} at {f['prefix']}" for f in result["found"])
        return [f"other CUDA toolkits found ({others}); they are left alone"]
    return []


def plan(
    *,
    host: str,
    version,
    source: str,
    gpu_facts: dict | None,
    distribution: str,
    distribution_version: str,
    architecture: str,
    distribution_release: str = "",
    require_gpus: bool = False,
    install_without_gpus: bool = False,
    prefix: str = "",
    package_version: str = "",
    known_bad: dict | None = None,
    allow_known_bad: bool = False,
    driver_manage: bool = False,
    driver_min_branch: int = 0,
    driver_packages=None,
    kernel: str = "",
    base_url: str = DEFAULT_BASE_URL,
    repo_distro: str = "",
    repo_arch: str = "",
    keyring_version: str = DEFAULT_KEYRING_VERSION,
    distro_mirror: str = "",
    observed: dict | None = None,
) -> dict:
    """Decide what to do on one host. ``observed`` holds what the module read on the host:

    nvcc: {prefix: {"version_output": str|None, "arch_output": str|None}} for nvcc_candidates();
    distro_policy: apt-cache policy of nvidia-cuda-toolkit (text) or None; headers_policy: of
    linux-headers-<kernel>; keyring_installed: installed cuda-keyring version or None;
    pci_nvidia: NVIDIA GPUs on the PCI bus (int) or None.
    """
    observed = observed or {}
    want = _requested_version(version, source, package_version, driver_min_branch)
    facts = gpu_facts or {}
    gpus = list(facts.get("gpus") or [])
    no_gpus = int(facts.get("count") or len(gpus)) == 0
    warnings: list[str] = []
    refusals: list[str] = []
    result = _new_result(host, want, source, gpus, warnings)
    warnings += _newer_than_tables(want)
    _gather(refusals, warnings, _check_known_bad(want, known_bad, allow_known_bad, result["toolkit"]))
    warnings += _find_installed(result, want, prefix, observed.get("nvcc") or {})
    pci = observed.get("pci_nvidia")
    found = _check_gpus_present(result, want, gpus, no_gpus, pci, require_gpus, install_without_gpus, driver_manage)
    _gather(refusals, warnings, found)
    found = _check_driver(
        result, want, facts, no_gpus, observed, distribution, driver_manage, driver_min_branch, driver_packages, kernel
    )
    _gather(refusals, warnings, found)
    if source == "nvidia":
        repo_args = (distribution, distribution_version, architecture, repo_distro, repo_arch)
        keyring = (keyring_version, observed.get("keyring_installed"))
        warnings += _plan_nvidia_source(result, want, repo_args, base_url, keyring, package_version, prefix)
    elif source == "distro":
        dist = (distribution, distribution_version, distribution_release)
        policy = observed.get("distro_policy")
        found = _plan_distro_source(result, want, dist, architecture, distro_mirror, policy, prefix)
        _gather(refusals, warnings, found)
    else:
        refusals += _plan_preinstalled(result, want, source, prefix)
    if refusals:
        message = _refusal_message(result, want, facts, refusals)
        result["action"] = "refuse"
        raise Refused(message, refusals, result)
    if result["action"] is None:
        warnings += _decide_action(result)
    return result


def default_driver_packages(source: str, dist_id: str, branch: int) -> list[str]:
    if source == "nvidia":
        return [f"cuda-drivers-{branch}"] if branch else ["cuda-drivers"]
    if source == "distro":
        if dist_id == "debian":
            return ["nvidia-driver"]
        if dist_id == "ubuntu" and branch:
            return [f"nvidia-headless-{branch}-server", f"nvidia-utils-{branch}-server"]
    return []


def _default_distro_mirror(dist_id: str, architecture: str) -> str:
    if dist_id == "debian":
        return "http://deb.debian.org/debian"
    if (architecture or "").lower() in ("aarch64", "arm64"):
        return "http://ports.ubuntu.com/ubuntu-ports"
    return "http://archive.ubuntu.com/ubuntu"


def facts_from_plan(result: dict) -> dict:
    """The cuda_toolkit_facts the role publishes (after install, or planned in check mode)."""
    inst = result.get("installed")
    driver = result.get("driver") or {}
    base = {
        "source": result.get("source"),
        "requested": result.get("version"),
        "skipped": bool(result.get("skipped")),
        "reason": result.get("reason"),
        "driver": {k: driver.get(k) for k in ("version", "branch", "cuda_version", "min_branch", "new_enough")},
    }
    if result.get("skipped"):
        base.update(
            version=None, release=None, nvcc=None, prefix=None, architectures=[], installed=False, host_compiler=None
        )
        return base
    base["host_compiler"] = DISTRO_HOST_COMPILER if result.get("source") == "distro" else None
    if inst:
        base.update(
            version=inst["version"],
            release=inst["release"],
            nvcc=inst["nvcc"],
            prefix=inst["prefix"],
            architectures=inst["architectures"],
            architectures_source=inst["architectures_source"],
            installed=True,
        )
    else:
        prefix = result["toolkit"]["prefix"]
        base.update(
            version=result["version"],
            release=None,
            nvcc=f"{prefix.rstrip('/')}/bin/nvcc",
            prefix=prefix,
            architectures=result["toolkit"]["architectures"],
            architectures_source="table",
            installed=False,
        )
    return base
