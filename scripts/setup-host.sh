#!/usr/bin/env bash
# Prepare a Debian 12/13 host (as root) to run the sandbox fleet and the tests:
# podman + runc (crun fails on hybrid cgroups here), debootstrap for local images,
# the build toolchain for llama.cpp, and /etc/containers/containers.conf from HARNESS.md.
# Idempotent: a second run changes nothing.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "setup-host.sh: run as root" >&2; exit 1; }
pkgs=(podman runc debootstrap aardvark-dns netavark uidmap slirp4netns  # netavark needs iptables
      iptables git cmake ninja-build build-essential ccache libssl-dev pkg-config
      curl ca-certificates python3-venv xz-utils openssh-client)  # ssh: the tests' hosts reached over ssh
missing=()
for p in "${pkgs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  echo "installing: ${missing[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
mkdir -p /etc/containers
conf=/etc/containers/containers.conf
want='[containers]
default_ulimits = ["nofile=20000:20000", "nproc=20000:20000"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
[network]
network_backend = "netavark"'
if [ ! -f "$conf" ] || [ "$(cat "$conf")" != "$want" ]; then
  printf '%s\n' "$want" > "$conf"
  echo "wrote $conf"
fi
