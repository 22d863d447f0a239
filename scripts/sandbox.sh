#!/usr/bin/env bash
# The local sandbox fleet: Debian systemd hosts in podman containers, reachable by Ansible
# through the containers.podman connection. Molecule scenarios use the same images.
#
#   sandbox.sh images          build localhost/debian-systemd:12, :13 and :12-ssh once (skipped when present;
#                              12-ssh adds OpenSSH's server, for the hosts the tests reach over ssh)
#   sandbox.sh up [N] [SUITE]  start N hosts (default 2) named llama-sandbox-1..N from :SUITE (default 12)
#                              on the podman network "llamafleet", and the gateway host llama-sandbox-gateway
#                              (HAProxy, role llama_gateway; SANDBOX_GATEWAY=0 leaves it out, for inventories
#                              without a llama_gateways group such as scripts/fleet-bench.py's: inventories/sandbox
#                              declares that host, so run-sandbox.sh needs it); idempotent
#   sandbox.sh down            stop and remove the sandbox hosts (the network and images stay)
#   sandbox.sh status          list the sandbox hosts
# Env: LLAMA_MTP_CACHE (default /var/cache/llama-mtp-fleet) keeps image tarballs between runs;
#      SANDBOX_PREFIX (default llama-sandbox), SANDBOX_NETWORK (default llamafleet); SANDBOX_PIN=1 gives each
#      llama host a core of its own (podman --cpuset-cpus, host i on core (i-1) mod nproc; the gateway unpinned),
#      as the fleet tests and benchmarks run it, so that a host's speed gate measures its change, not its neighbour.
set -euo pipefail
cache=${LLAMA_MTP_CACHE:-/var/cache/llama-mtp-fleet}
prefix=${SANDBOX_PREFIX:-llama-sandbox}
network=${SANDBOX_NETWORK:-llamafleet}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

suite_of() { case "${1%-ssh}" in 12) echo bookworm ;; 13) echo trixie ;; *) echo "unknown Debian release $1" >&2; exit 2 ;; esac; }

build_image() {
  local rel=$1 suite tag=localhost/debian-systemd:$1 tarball=$cache/images/debian-systemd-$1.tar
  suite=$(suite_of "$rel")
  local include=systemd,systemd-sysv,dbus,python3,sudo,iproute2,ca-certificates,procps
  case "$rel" in *-ssh) include=$include,openssh-server ;; esac
  if podman image exists "$tag"; then return 0; fi
  mkdir -p "$cache/images"
  if [ ! -s "$tarball" ]; then
    local root; root=$(mktemp -d "$cache/images/rootfs-$rel.XXXXXX")
    echo "building $tag with debootstrap ($suite)..." >&2
    debootstrap --variant=minbase \
      --include="$include" \
      "$suite" "$root" "$mirror" >"$cache/images/debootstrap-$rel.log" 2>&1 \
      || { tail -20 "$cache/images/debootstrap-$rel.log" >&2; rm -rf "$root"; exit 1; }
    # Units that make no sense in a container; keep the journal small.
    for u in systemd-networkd-wait-online.service getty@tty1.service systemd-udevd.service; do
      ln -sf /dev/null "$root/etc/systemd/system/$u"
    done
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
    rm -rf "$root"
  fi
  podman import --change 'CMD ["/lib/systemd/systemd"]' --change 'STOPSIGNAL SIGRTMIN+3' \
    "$tarball" "$tag" >/dev/null
  echo "built $tag" >&2
}

ensure_network() {
  podman network exists "$network" || podman network create "$network" >/dev/null
}

up() {
  local n=${1:-2} rel=${2:-12}
  build_image "$rel"
  ensure_network
  mkdir -p "$cache/ccache"   # shared with the hosts: their llama.cpp compiles reuse it
  local names; names=$(seq 1 "$n")
  [ "${SANDBOX_GATEWAY:-1}" = 0 ] || names="$names gateway"
  for i in $names; do
    local name=$prefix-$i
    if podman container exists "$name"; then
      [ "$(podman inspect -f '{{.State.Running}}' "$name")" = true ] || podman start "$name" >/dev/null
      continue
    fi
    local pin=()   # SANDBOX_PIN=1: llama host i on core (i-1) mod nproc, as separate machines would be
    if [ "${SANDBOX_PIN:-0}" = 1 ] && [[ $i =~ ^[0-9]+$ ]]; then pin=(--cpuset-cpus "$(( (i - 1) % $(nproc) ))"); fi
    podman run -d --name "$name" --hostname "$name" --network "$network" "${pin[@]}" \
      --systemd=always --label llamafleet.sandbox=1 \
      --tmpfs /tmp --tmpfs /run \
      -v "$cache/ccache:/var/cache/ccache" \
      "localhost/debian-systemd:$rel" /lib/systemd/systemd >/dev/null
  done
  # Wait until systemd inside each host is up (running or degraded).
  for i in $names; do
    local state=""
    for _ in $(seq 1 60); do
      state=$(podman exec "$prefix-$i" systemctl is-system-running 2>/dev/null || true)
      case "$state" in running|degraded) break ;; esac
      sleep 1
    done
    echo "$prefix-$i: systemd $state"
  done
}

down() {
  local ids
  ids=$(podman ps -a -q --filter label=llamafleet.sandbox=1 --filter "name=^$prefix-")
  [ -z "$ids" ] || podman rm -f -t 5 $ids >/dev/null
  echo "sandbox hosts removed"
}

case "${1:-}" in
  images) build_image 12; build_image 13; build_image 12-ssh ;;
  up) shift; up "$@" ;;
  down) down ;;
  status) podman ps -a --filter label=llamafleet.sandbox=1 --format '{{.Names}}\t{{.Status}}\t{{.Image}}' ;;
  *) sed -n '2,12p' "$0"; exit 2 ;;
esac
