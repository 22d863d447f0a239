#!/usr/bin/env bash
# GPU check (needs a real NVIDIA host; CI does not run it): capture what nvidia-smi prints for
# the command lines gpu_facts uses, so the parser meets real output from more machines, then run
# the real parser (plugins/module_utils/nvidia_smi.py, stdlib only) over the live machine.
# Usage: tests/gpu/capture_nvidia_smi.sh OUTDIR PREFIX
set -uo pipefail
out=${1:?outdir}; prefix=${2:?prefix}
here=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
q=index,uuid,name,pci.bus_id,memory.total,memory.used,memory.free,compute_cap,mig.mode.current,driver_version
nvidia-smi > "$out/$prefix.table.txt" 2>&1
nvidia-smi topo -m > "$out/$prefix.topo.txt" 2>&1
nvidia-smi -L > "$out/$prefix.list.txt" 2>&1
nvidia-smi --query-gpu=$q --format=csv,noheader,nounits > "$out/$prefix.query-nounits.txt" 2>&1
nvidia-smi --query-gpu=$q --format=csv > "$out/$prefix.query.txt" 2>&1
nvidia-smi -q > "$out/$prefix.q.txt" 2>&1
PYTHONPATH=$here/collections python3 - "$out/$prefix.facts.json" <<'PY'
import json, subprocess, sys
from ansible_collections.llamafleet.mtp.plugins.module_utils import nvidia_smi as n

def run(argv):
    p = subprocess.run(argv, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr

facts = n.collect(run, "nvidia-smi")
json.dump(facts, open(sys.argv[1], "w"), indent=1)
print(json.dumps({k: facts[k] for k in ("count", "driver_version", "cuda_driver_version")}), facts["gpus"][0])
PY
ls -la "$out"
