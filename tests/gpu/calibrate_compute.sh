#!/usr/bin/env bash
# GPU check (a real NVIDIA host; CI does not run it): calibrate the planner's compute-buffer estimate
# on CUDA. Runs tests/gpu/calibrate_compute.py --backend cuda: the Qwen3.6-27B Q4_K_M MTP header
# stand-in at 9 single-GPU points (context 32768/65536/131072/262144; KV f16/q8_0/q4_0; MTP
# draft-n-max 2-4; parallel 1 and 2) and, with 2+ GPUs, 3 layer-split points over GPUs 0,1; reads
# llama.cpp's `CUDA0/CUDA1 compute buffer size`, `CUDA_Host compute buffer size`, KV / RS buffer and
# MTP-context lines, and nvidia-smi's used memory per GPU (the CUDA context).
# Usage: tests/gpu/calibrate_compute.sh LLAMA_SERVER_OR_SRC_TARBALL WHEEL_DIR OUTDIR
#   LLAMA_SERVER_OR_SRC_TARBALL: a CUDA llama-server binary, or the llama.cpp source tarball that
#   tests/gpu/cuda_mtp_check.sh builds from (the same CMake arguments are used here).
#   WHEEL_DIR: wheels of the Python packages the stand-in generator needs (gguf, numpy), as for
#   cuda_mtp_check.sh. Needs about 17 GB of disk for the sparse model file (11 MB really used) and
#   a GPU with 24 GB or more for the 262144 points (points that do not fit report their exit).
# Results: OUTDIR/calibration.json, calibration.md (the table for docs/measurements.md), *.log.
set -uo pipefail
arg=${1:?llama-server binary or llama.cpp source tarball}; wheels=${2:?wheel dir}; out=${3:?outdir}
repo=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
work=/tmp/calibrate-compute; mkdir -p "$work"
python3 -m pip install -q --no-index --no-deps --target "$work/site" "$wheels"/*.whl && export PYTHONPATH=$work/site:$repo/collections:$repo
nvidia-smi --query-gpu=index,name,memory.total,memory.used,compute_cap,driver_version --format=csv | tee "$out/host.txt"
if [ -x "$arg" ] && [ ! -d "$arg" ]; then
  bin=$arg
else
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
  mkdir -p "$work/src" && tar -C "$work/src" -xJf "$arg"
  cmake -S "$work/src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=OFF -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$cc" -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DGGML_CUDA_FA_QUANTS="f16-f16;q4_0-q4_0;q8_0-q8_0" > "$out/build.log" 2>&1 &&
    cmake --build "$work/build" --target llama-server -j "$(nproc)" >> "$out/build.log" 2>&1
  bin=$work/build/bin/llama-server
  [ -x "$bin" ] || { tail -30 "$out/build.log"; exit 1; }
fi
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
[ "$gpus" -gt 2 ] && gpus=2
timeout "${CALIBRATE_TIMEOUT:-900}" python3 "$repo/tests/gpu/calibrate_compute.py" "$bin" "$work" "$out" \
  --backend cuda --gpus "$gpus" --threads "$(nproc)" 2>&1 | tee "$out/calibrate.log" | tail -30
