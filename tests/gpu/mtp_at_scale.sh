#!/usr/bin/env bash
# GPU check (a real NVIDIA host; CI does not run it): MTP at the seeds' model scale against the
# memory-bandwidth roofline, and the GPU flag sweep (flash attention, ubatch) against the default.
#   1. the GPU's device-to-device copy bandwidth (tests/gpu/d2d_bandwidth.cu, nvcc) beside the
#      data-sheet figure plugins/module_utils/roofline.py holds for its name;
#   2. tests/bench/mtp_at_scale.py with -ngl 99: generated glm4moe models of the Qwen3.6-27B width
#      (n_embd 5120, n_ff 17408, 40 heads of 128, 8 KV heads; F16; depth LAYERS, default 16 so that
#      one model is generated, loaded and measured within one session's device time; LAYERS=64 is
#      the seeds' depth, about 44 GB per model, generate one at a time) with an agreeing and a
#      partially agreeing (0.7) MTP head: base tokens/s, efficiency, the MTP ratio for draft-n-max
#      1-4 and the draft length autotune keeps; then the flag sweep (SWEEP=0 skips it).
# Usage: tests/gpu/mtp_at_scale.sh LLAMA_SERVER_OR_SRC_TARBALL WHEEL_DIR OUTDIR
#   (the same arguments as calibrate_compute.sh: a CUDA llama-server, or the source tarball to build)
# Results: OUTDIR/d2d.json, mtp_at_scale.json, mtp_at_scale.log, server logs.
set -uo pipefail
arg=${1:?llama-server binary or llama.cpp source tarball}; wheels=${2:?wheel dir}; out=${3:?outdir}
repo=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
work=/tmp/mtp-at-scale; mkdir -p "$work"
python3 -m pip install -q --no-index --no-deps --target "$work/site" "$wheels"/*.whl && export PYTHONPATH=$work/site:$repo/collections:$repo
nvidia-smi --query-gpu=index,name,memory.total,memory.used,compute_cap,driver_version --format=csv | tee "$out/host.txt"
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
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

echo "== 1. device-to-device copy bandwidth"
nvcc -O2 -o "$work/d2d_bandwidth" "$repo/tests/gpu/d2d_bandwidth.cu" && "$work/d2d_bandwidth" | tee "$out/d2d.json"
spec=$(python3 -c "from ansible_collections.llamafleet.mtp.plugins.module_utils.roofline import gpu_bandwidth_spec as s; b = s('$name'); print(b // 10**9 if b else '')")
echo "data sheet: ${spec:-unknown} GB/s for $name"
if [ -n "$spec" ]; then bw=$spec; else bw=$(python3 -c "import json; print(json.load(open('$out/d2d.json'))['read_equiv_bytes_per_s'] / 1e9)"); fi

echo "== 2. MTP at scale (roofline against $bw GB/s)"
timeout "${SCALE_TIMEOUT:-1500}" python3 "$repo/tests/bench/mtp_at_scale.py" --server "$bin" --models "$work/models" \
  --gen "5120,${LAYERS:-16},32000,17408,40,8" --kinds "${KINDS:-agree,partial}" --ngl 99 --bandwidth-gbs "$bw" --n-predict "${N_PREDICT:-128}" --runs 3 \
  $([ "${SWEEP:-1}" = 1 ] && echo --sweep) --logs "$out" --out "$out/mtp_at_scale.json" 2>&1 | tee "$out/mtp_at_scale.log"
