#!/usr/bin/env bash
# promtool from Debian's prometheus package (the one the role llama_monitoring installs), unpacked into the
# cache without installing the service: prints its path. For the rules' unit tests (tests/unit/test_monitoring_rules.py)
# on a controller that runs no Prometheus. Idempotent; downloads once per package version.
set -euo pipefail
cache=${LLAMA_MTP_CACHE:-/var/cache/llama-mtp-fleet}/promtool
mkdir -p "$cache"
candidate() { apt-cache policy prometheus 2>/dev/null | awk '/Candidate:/ {print $2}'; }
version=$(candidate)
if [ -z "$version" ] || [ "$version" = "(none)" ]; then apt-get update -qq >/dev/null 2>&1 || true; version=$(candidate); fi
[ -n "$version" ] && [ "$version" != "(none)" ] || { echo "promtool.sh: apt knows no prometheus package" >&2; exit 1; }
dir=$cache/${version//[^A-Za-z0-9.+~-]/_}
if [ ! -x "$dir/usr/bin/promtool" ]; then
  tmp=$(mktemp -d "$cache/.dl.XXXXXX")
  # stale package lists: refresh once and take the version they name now
  (cd "$tmp" && apt-get download -q "prometheus=$version" >/dev/null 2>&1) \
    || { apt-get update -qq >/dev/null 2>&1 || true; version=$(candidate); dir=$cache/${version//[^A-Za-z0-9.+~-]/_}
         (cd "$tmp" && apt-get download -q "prometheus=$version" >/dev/null 2>&1); } \
    || { rm -rf "$tmp"; echo "promtool.sh: apt-get download prometheus=$version failed" >&2; exit 1; }
  dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"
  rm -rf "$dir" && mkdir -p "$dir/usr/bin" && mv "$tmp/x/usr/bin/promtool" "$dir/usr/bin/promtool"
  rm -rf "$tmp"
fi
"$dir/usr/bin/promtool" --version >/dev/null
echo "$dir/usr/bin/promtool"
