#!/usr/bin/env bash
# Build a static, CPU-only llama-server from the local mirror, once per commit, for the tests.
# Every scenario that needs a llama-server binary shares the artifact this prints; ccache
# (CCACHE_BASEDIR set so the two refs share objects) keeps rebuilds of a changed tree short.
#
# Usage: build.sh [REF]    REF: a branch, tag, sha or refs/pull/N/head (default master)
# Prints the install dir (<cache>/builds/<sha12>-cpu), which holds bin/llama-server and
# build-info.json. Env: LLAMA_MTP_CACHE (default /var/cache/llama-mtp-fleet), JOBS.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${LLAMA_MTP_CACHE:-/var/cache/llama-mtp-fleet}
ref=${1:-master}
mirror=$("$here/mirror.sh")
sha=$(git --git-dir="$mirror" rev-parse --verify "$ref^{commit}")
short=${sha:0:12}
dest=$cache/builds/$short-cpu
if [ -x "$dest/bin/llama-server" ] && [ -f "$dest/build-info.json" ]; then
  echo "$dest"; exit 0
fi
count=$(git --git-dir="$mirror" rev-list --count "$sha")
work=$cache/work            # one fixed path for every ref: ccache hits across refs
mkdir -p "$work" "$cache/ccache" "$cache/builds"
rm -rf "$work/src"
git clone -q --no-checkout "$mirror" "$work/src"
git -C "$work/src" fetch -q origin "$sha" 2>/dev/null || true
git -C "$work/src" checkout -q "$sha"
# Same ccache settings as the llamacpp_mtp_build role, so builds in the test hosts (which mount
# this ccache dir) hit what this build stored: content compiler check, paths relative to $work, and
# the role's locale (ccache hashes LANG and LC_ALL/CTYPE/MESSAGES: another one misses every object).
export CCACHE_DIR=$cache/ccache CCACHE_BASEDIR=$work CCACHE_NOHASHDIR=true CCACHE_MAXSIZE=5G CCACHE_COMPILERCHECK=content
export LANG=C.UTF-8 LC_ALL=C.UTF-8 LC_CTYPE=C.UTF-8 LC_MESSAGES=C.UTF-8
start=$(date +%s)
cmake -S "$work/src" -B "$work/build" -G Ninja >&2 \
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DGGML_CUDA=OFF \
  -DGGML_CCACHE=ON -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_NUMBER="$count" -DLLAMA_BUILD_COMMIT="${sha:0:9}"
cmake --build "$work/build" --target llama-server -j "${JOBS:-$(nproc)}" >&2
rm -rf "$dest.tmp"; mkdir -p "$dest.tmp/bin"
cp "$work/build/bin/llama-server" "$dest.tmp/bin/"
cat > "$dest.tmp/build-info.json" <<JSON
{"ref": "$ref", "commit": "$sha", "build_number": $count, "cuda": false,
 "built_at": "$(date -u +%FT%TZ)", "build_seconds": $(( $(date +%s) - start ))}
JSON
mv "$dest.tmp" "$dest"
echo "$dest"
