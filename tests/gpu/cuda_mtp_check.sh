#!/usr/bin/env bash
# GPU check (a real NVIDIA host; CI does not run it). One prepared run, in this order:
#   1. what the host has: nvidia-smi, nvcc;
#   2. a static CUDA llama-server build of the pinned tree with the build role's CMake arguments
#      (GGML_NATIVE=OFF, explicit CMAKE_CUDA_ARCHITECTURES from the GPU's compute capability);
#   3. the capability probe on the CUDA binary (has_cuda, MTP spelling, devices);
#   4. the planner against reality: the Qwen3.6-27B Q4_K_M MTP header stand-in (a sparse
#      16.8 GB GGUF of zeros with the real tensor table) loaded on the GPU at the planner's
#      settings; llama.cpp's own buffer sizes and nvidia-smi's used memory vs the plan;
#   5. MTP on the GPU: a generated agree model (its MTP head always agrees) and a partial one,
#      tokens/s without MTP and with --spec-draft-n-max 1..4, through llama_bench's logic.
# Usage: tests/gpu/cuda_mtp_check.sh SRC_TARBALL WHEEL_DIR OUTDIR
# Results: OUTDIR/*.json and *.log; each step is time-boxed so later steps still report.
set -uo pipefail
src=${1:?llama.cpp source tarball}; wheels=${2:?wheel dir}; out=${3:?outdir}
repo=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
work=/tmp/cuda-mtp-check; mkdir -p "$work"
log() { echo "[$(date +%T)] $*" | tee -a "$out/steps.log"; }

log "1. host"
nvidia-smi --query-gpu=name,memory.total,memory.used,compute_cap,driver_version --format=csv | tee "$out/host.txt"
nvcc --version | tail -2 | tee -a "$out/host.txt"
python3 -m pip install -q --no-index --no-deps --target "$work/site" "$wheels"/*.whl && export PYTHONPATH=$work/site:$repo/collections:$repo
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)

log "2. CUDA build for sm_$cc"
mkdir -p "$work/src" && tar -C "$work/src" -xJf "$src"
t0=$SECONDS
timeout "${BUILD_TIMEOUT:-340}" bash -c "cmake -S $work/src -B $work/build -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$cc -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DGGML_CUDA_FA_QUANTS=\"f16-f16;q4_0-q4_0;q8_0-q8_0\" -DLLAMA_BUILD_NUMBER=1 -DLLAMA_BUILD_COMMIT=0d91d73bb >/dev/null && \
  cmake --build $work/build --target llama-server -j $(nproc)" > "$out/build.log" 2>&1
rc=$?
log "build rc=$rc in $((SECONDS - t0)) s"
bin=$work/build/bin/llama-server
[ -x "$bin" ] || { tail -30 "$out/build.log"; exit 1; }

log "3. capability probe"
python3 - "$bin" > "$out/capabilities.json" <<'PY'
import json, subprocess, sys
from ansible_collections.llamafleet.mtp.plugins.module_utils import llama_caps
def run(argv):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr
caps = llama_caps.probe(run, sys.argv[1], True)
print(json.dumps(caps, indent=1, default=str))
PY
python3 -c "import json;c=json.load(open('$out/capabilities.json'));print({k:c.get(k) for k in ('mtp_spec_type','has_cuda','devices','build_info')})"

log "4. planner vs llama.cpp on the GPU"
timeout "${PLAN_TIMEOUT:-110}" python3 "$repo/tests/gpu/plan_vs_gpu.py" "$bin" "$work" "$out" 2>&1 | tee "$out/plan_vs_gpu.log" | tail -25

log "5. MTP speed-up on the GPU"
timeout "${SPEED_TIMEOUT:-130}" python3 "$repo/tests/gpu/mtp_speedup.py" "$bin" "$work" "$out" 2>&1 | tee "$out/mtp_speedup.log" | tail -25
log "done"
