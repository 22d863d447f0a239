"""Pure logic of the llama.cpp build: refs, CUDA architectures, CMake arguments and the build key.

No Ansible imports: used by the llamacpp_build_key module and unit-tested directly.

The build key identifies one artifact: every host whose key is equal can run the same
tarball, so the fleet compiles once per key and distributes. It hashes what changes the
bytes of the binary: the resolved commit, the CMake arguments (which carry the CUDA
switch and architectures), the CUDA toolkit version, the OS release and the compiler.
"""

from __future__ import annotations

import hashlib
import json
import re

SHA_RE = re.compile(r"^[0-9a-f]{7,40}$")
_PULL_RES = (
    re.compile(r"^refs/pull/(\d+)/(?:head|merge)$"),
    re.compile(r"^(?:pull|pr)/(\d+)$", re.I),
    re.compile(r"^#(\d+)$"),
    re.compile(r"^(\d+)$"),
)
# CMake arguments every build gets (llama.cpp's own release builds use GGML_NATIVE=OFF with
# explicit architectures, so one artifact serves every host of its key).
BASE_CMAKE_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",  # one self-contained llama-server
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_OPENSSL=OFF",  # the server never downloads: model_fetch does
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # no download at build time
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
)
KNOWN_TARGETS = ("llama-server", "llama-cli", "llama-bench", "llama-fit-params")
# Flags the role sets itself: an extra flag that overrides one of these would make the key lie.
RESERVED_FLAGS = (
    "GGML_CUDA",
    "CMAKE_CUDA_ARCHITECTURES",
    "GGML_NATIVE",
    "BUILD_SHARED_LIBS",
    "LLAMA_BUILD_NUMBER",
    "LLAMA_BUILD_COMMIT",
    "GGML_CCACHE",
)


class BuildInputError(ValueError):
    """Bad build input; the message says what and how to fix it."""


def parse_ref(ref) -> dict:
    """Classify a user ref: a pull request number, a commit sha, or a tag/branch name.

    Returns {kind: pull|sha|name, ref: what to fetch, pull: N or None}. A pull request
    (``22673``, ``#22673``, ``pull/22673``, ``pr/22673``, ``refs/pull/22673/head``) becomes
    ``refs/pull/N/head``, the ref GitHub (and mirrors of it) serve for the PR's head.
    """
    if isinstance(ref, bool) or ref is None:
        raise BuildInputError(f"ref must be a tag, branch, commit sha or pull request number, got {ref!r}")
    if isinstance(ref, int):
        return {"kind": "pull", "ref": f"refs/pull/{ref}/head", "pull": ref}
    text = str(ref).strip()
    if not text:
        raise BuildInputError("ref is empty: give a tag (b9180), a branch, a commit sha or a pull request number")
    for rx in _PULL_RES:
        m = rx.match(text)
        if m and not (text.isdigit() and len(text) >= 7):
            n = int(m.group(1))
            return {"kind": "pull", "ref": f"refs/pull/{n}/head", "pull": n}
    if text.isdigit():  # 7+ digits: a pull request or a sha prefix? refuse rather than guess
        raise BuildInputError(
            f"ref {text!r} is all digits: write a pull request as 'pull/{text}' or give a tag, branch or sha"
        )
    if SHA_RE.match(text.lower()):
        return {"kind": "sha", "ref": text.lower(), "pull": None}
    if any(c in text for c in " ~^:?*[\\") or text.startswith("-") or ".." in text:
        raise BuildInputError(f"ref {text!r} is not a valid git ref name")
    return {"kind": "name", "ref": text, "pull": None}


def cuda_architecture(compute_capability: str) -> str:
    """'8.6' -> '86', '12.0' -> '120', '9.0' -> '90' (CMAKE_CUDA_ARCHITECTURES spelling)."""
    m = re.match(r"^\s*(\d+)\.(\d+)\s*$", str(compute_capability))
    if not m:
        raise BuildInputError(f"compute capability {compute_capability!r} is not of the form MAJOR.MINOR (e.g. 8.6)")
    return f"{int(m.group(1))}{int(m.group(2))}"


def cuda_architectures(gpu_facts: dict | None, explicit=None) -> list[str]:
    """Architectures to build for: the explicit list, else those of the GPUs gpu_facts found.

    Sorted numerically and de-duplicated. GPUs whose compute capability is unknown (drivers
    older than R510) make an automatic choice impossible: say so.
    """
    if explicit:
        archs = []
        for a in explicit:
            a = str(a).strip()
            if "." in a:
                a = cuda_architecture(a)
            if not re.match(r"^\d{2,3}[a-z]?(-real|-virtual)?$", a):
                raise BuildInputError(f"CUDA architecture {a!r} is not valid (examples: 70, 86, 90, 120a-real)")
            archs.append(a)
    else:
        gpus = (gpu_facts or {}).get("gpus") or []
        if not gpus:
            return []
        unknown = [g.get("index") for g in gpus if not g.get("compute_capability")]
        if unknown:
            raise BuildInputError(
                f"GPU(s) {unknown} report no compute capability (driver older than R510?): "
                "set llamacpp_mtp_build_cuda_architectures explicitly, e.g. ['70']"
            )
        archs = [cuda_architecture(g["compute_capability"]) for g in gpus]
    return sorted(set(archs), key=lambda a: (int(re.match(r"\d+", a).group(0)), a))


def check_extra_flags(flags) -> list[str]:
    out = []
    for f in flags or []:
        f = str(f).strip()
        if not f.startswith("-D"):
            raise BuildInputError(f"extra CMake flag {f!r} must have the form -DNAME=VALUE")
        name = f[2:].split("=", 1)[0].split(":", 1)[0]
        if name in RESERVED_FLAGS:
            raise BuildInputError(f"extra CMake flag {f!r} sets {name}, which the role controls: use its variable")
        out.append(f)
    return out


def cmake_args(cuda: bool, archs, extra_flags=(), ccache: bool = True) -> list[str]:
    """The CMake arguments that define the artifact (build number/commit are added at build time)."""
    args = list(BASE_CMAKE_ARGS)
    args.append("-DGGML_CCACHE=" + ("ON" if ccache else "OFF"))
    if cuda:
        if not archs:
            raise BuildInputError("a CUDA build needs at least one CUDA architecture")
        args += ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=" + ";".join(archs)]
    else:
        args.append("-DGGML_CUDA=OFF")
    args += check_extra_flags(extra_flags)
    return args


def check_targets(targets) -> list[str]:
    targets = list(targets or [])
    if not targets:
        raise BuildInputError("targets is empty: build at least llama-server")
    bad = [t for t in targets if t not in KNOWN_TARGETS]
    if bad:
        raise BuildInputError(f"unknown build target(s) {bad}; known: {list(KNOWN_TARGETS)}")
    if "llama-server" not in targets:
        raise BuildInputError("targets must include llama-server (the role installs and probes it)")
    return sorted(set(targets), key=KNOWN_TARGETS.index)


def build_key(commit: str, args, targets, cuda_version, os_release: str, compiler: str) -> dict:
    """The build key: a sha256 over what makes the artifact, and the install dir name."""
    if not re.match(r"^[0-9a-f]{40}$", commit or ""):
        raise BuildInputError(f"commit {commit!r} is not a full 40-hex sha (resolve the ref first)")
    # ccache does not change the artifact; keep it out of the key.
    key_args = sorted(a for a in args if not a.startswith("-DGGML_CCACHE="))
    material = {
        "commit": commit,
        "cmake_args": key_args,
        "targets": sorted(targets),
        "cuda_version": cuda_version or None,
        "os_release": os_release,
        "compiler": compiler,
    }
    digest = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()
    return {"key": digest, "key8": digest[:8], "name": f"{commit[:12]}-{digest[:8]}", "material": material}


def os_release_id(os_release_text: str) -> str:
    """'debian-12' from /etc/os-release (ID + VERSION_ID; VERSION_CODENAME when no version)."""
    kv = {}
    for line in os_release_text.splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            kv[k.strip()] = v.strip().strip('"')
    ident = kv.get("ID") or "unknown"
    ver = kv.get("VERSION_ID") or kv.get("VERSION_CODENAME") or "unknown"
    return f"{ident}-{ver}"


def compiler_id(version_output: str) -> str:
    """First line of `c++ --version` ('c++ (Debian 12.2.0-14+deb12u1) 12.2.0')."""
    first = (version_output or "").strip().splitlines()
    if not first:
        raise BuildInputError("the C++ compiler printed no version: is build-essential installed?")
    return first[0].strip()


def assign_builds(plans: dict, cached_keys, builders=()) -> dict:
    """Decide, per build key, how the hosts that need it get their artifact.

    plans: {host: plan} in play order, each plan the llamacpp_build_plan result (key8, name,
    installed, up_to_date). cached_keys: key8 values whose artifact is in the controller cache.
    builders: hosts of the llamacpp_builders group (preferred builders of their own key).

    Returns {key8: {name, action, source, hosts}} for every key some host needs, where action is
    'cached' (install from the controller cache), 'package' (a host already has it installed:
    pack its install dir, no compile) or 'compile' (source host builds it), and hosts lists
    the hosts that install it. Exactly one compile per key that is neither cached nor installed.
    """
    cached = set(cached_keys or ())
    builders = list(builders or ())
    out: dict = {}
    for host, plan in plans.items():
        if plan.get("up_to_date"):
            continue
        entry = out.setdefault(plan["key8"], {"name": plan["name"], "action": None, "source": None, "hosts": []})
        entry["hosts"].append(host)
    for key8, entry in out.items():
        same_key = [h for h, p in plans.items() if p.get("key8") == key8]
        if key8 in cached:
            entry["action"] = "cached"
            continue
        installed = [h for h in same_key if plans[h].get("installed")]
        if installed:
            entry.update(action="package", source=installed[0])
            continue
        preferred = [h for h in builders if h in same_key]
        entry.update(action="compile", source=(preferred or same_key)[0])
    return out
