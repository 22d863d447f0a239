#!/usr/bin/env bash
# GPU check (needs a real NVIDIA host; CI does not run it): run the cuda_toolkit role's detection on
# this machine and print the facts it exports. It installs and changes nothing: connection local,
# cuda_toolkit_source none (detect a preinstalled toolkit), check mode.
#
# Usage: tests/gpu/check_cuda_toolkit.sh [CUDA_VERSION [PREFIX]] [-o OUTDIR]
#   CUDA_VERSION  MAJOR.MINOR to look for; default: what nvcc says (PATH, /usr/local/cuda, /usr/local/cuda-*)
#   PREFIX        install prefix holding bin/nvcc; default: the role's search (/usr/local/cuda-X.Y,
#                 /usr/local/cuda, /usr)
#   -o OUTDIR     also write OUTDIR/cuda_toolkit_facts.json and OUTDIR/gpu_facts.json
# Works from a plain copy of the repository. With ansible-core (ansible-playbook on PATH or in
# .venv/bin) it runs llamafleet.mtp.gpu_facts and the llamafleet.mtp.cuda_toolkit role. Without it,
# it prints what nvidia-smi and nvcc say and runs the same rules (plugins/module_utils/nvidia_smi.py
# and cuda_compat.py, standard library only) with python3.
# Exit: 0 facts printed, 1 the role refused (its message says why), 2 usage, 3 no python3.
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
out=""
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -o) out=${2:?-o needs a directory}; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
version=${args[0]:-}
prefix=${args[1]:-}
[ -n "$out" ] && mkdir -p "$out"

echo "== nvidia-smi"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,compute_cap,driver_version --format=csv,noheader 2>&1
  nvidia-smi 2>&1 | grep -m1 -o 'CUDA Version: *[0-9.]*'
else
  echo "nvidia-smi not found"
fi

echo "== nvcc"
nvccs=()
for n in "$(command -v nvcc 2>/dev/null)" /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc /usr/bin/nvcc; do
  [ -n "$n" ] && [ -x "$n" ] && nvccs+=("$(readlink -f "$n")")
done
mapfile -t nvccs < <(printf '%s\n' "${nvccs[@]}" | awk 'NF && !seen[$0]++')
for n in "${nvccs[@]}"; do
  printf '%s: %s\n' "$n" "$("$n" --version 2>&1 | grep -o 'release [0-9.]*, V[0-9.]*')"
done
[ ${#nvccs[@]} -eq 0 ] && echo "no nvcc found"
if [ -z "$version" ] && [ ${#nvccs[@]} -gt 0 ]; then
  version=$("${nvccs[0]}" --version 2>/dev/null | sed -n 's/.*release \([0-9]*\.[0-9]*\),.*/\1/p')
  [ -z "$prefix" ] && prefix=$(dirname "$(dirname "${nvccs[0]}")")
fi
version=${version:-12.8}
echo "checking CUDA $version${prefix:+ under $prefix}"

playbook=$(command -v ansible-playbook || true)
[ -z "$playbook" ] && [ -x "$here/.venv/bin/ansible-playbook" ] && playbook=$here/.venv/bin/ansible-playbook

if [ -n "$playbook" ]; then
  echo "== cuda_toolkit role (detection only, check mode) with $playbook"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  printf '[defaults]\ncollections_path = %s/collections\ninterpreter_python = auto_silent\nstdout_callback = ansible.builtin.default\nresult_format = yaml\n' \
    "$here" > "$tmp/ansible.cfg"
  cat > "$tmp/check.yml" <<'YAML'
- name: Detect the CUDA toolkit and the driver
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Read the GPUs
      llamafleet.mtp.gpu_facts:
    - name: Run the role's detection (source none, check mode)
      ansible.builtin.include_role:
        name: llamafleet.mtp.cuda_toolkit
        apply:
          check_mode: true
      vars:
        cuda_toolkit_source: none
        cuda_toolkit_version: "{{ check_version }}"
        cuda_toolkit_prefix: "{{ check_prefix }}"
        cuda_toolkit_require_gpus: true
        cuda_toolkit_set_environment: false
    - name: The exported facts
      ansible.builtin.debug:
        var: cuda_toolkit_facts
    - name: Save them
      ansible.builtin.copy:
        content: "{{ {'cuda_toolkit_facts': cuda_toolkit_facts, 'gpu_facts': ansible_facts.gpu_facts} | to_nice_json }}"
        dest: "{{ check_out }}/facts.json"
        mode: "0644"
      check_mode: false
YAML
  ANSIBLE_CONFIG=$tmp/ansible.cfg "$playbook" -i localhost, "$tmp/check.yml" \
    -e "check_version=$version" -e "check_prefix=$prefix" -e "check_out=$tmp" -e "ansible_python_interpreter=$(command -v python3)"
  rc=$?
  if [ $rc -ne 0 ]; then echo "the role failed or refused (rc $rc): see its message above"; exit 1; fi
  if [ -n "$out" ]; then
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))
for k in d: json.dump(d[k], open(sys.argv[2]+"/"+k+".json","w"), indent=1)' "$tmp/facts.json" "$out"
  fi
  exit 0
fi

echo "== ansible-playbook not found: running the role's rules with python3 instead"
command -v python3 >/dev/null || { echo "no python3 either"; exit 3; }
PYTHONPATH=$here/collections python3 - "$version" "$prefix" "$out" <<'PY'
import json, os, platform, subprocess, sys
from ansible_collections.llamafleet.mtp.plugins.module_utils import cuda_compat as cc, nvidia_smi as ns

version, prefix, out = sys.argv[1], sys.argv[2], sys.argv[3]

def run(argv):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, LC_ALL="C"))
    except OSError as e:
        return 127, "", str(e)
    return p.returncode, p.stdout, p.stderr

try:
    gpu_facts = ns.collect(run, "nvidia-smi")
except ns.NvidiaSmiError as e:
    print(f"gpu_facts: {e}")
    gpu_facts = ns.empty_facts()
osr = dict(l.rstrip("\n").split("=", 1) for l in open("/etc/os-release") if "=" in l)
osr = {k: v.strip('"') for k, v in osr.items()}
want = cc.parse_version(version)
observed = {"nvcc": {}}
for pfx in cc.nvcc_candidates(want, "none", prefix):
    nvcc = os.path.join(pfx, "bin", "nvcc")
    if os.access(nvcc, os.X_OK):
        rc, vout, _ = run([nvcc, "--version"])
        rc2, aout, _ = run([nvcc, "--list-gpu-arch"])
        observed["nvcc"][pfx] = {"version_output": vout if rc == 0 else None, "arch_output": aout if rc2 == 0 else None}
try:
    result = cc.plan(host=platform.node(), version=version, source="none", gpu_facts=gpu_facts, require_gpus=True,
                     distribution=osr.get("NAME", "").split()[0], distribution_version=osr.get("VERSION_ID", ""),
                     architecture=platform.machine(), prefix=prefix, observed=observed)
except cc.Refused as e:
    print(str(e))
    sys.exit(1)
facts = cc.facts_from_plan(result)
for w in result["warnings"]:
    print("warning:", w)
print(json.dumps(facts, indent=1))
if out:
    json.dump(facts, open(os.path.join(out, "cuda_toolkit_facts.json"), "w"), indent=1)
    json.dump(gpu_facts, open(os.path.join(out, "gpu_facts.json"), "w"), indent=1)
PY
