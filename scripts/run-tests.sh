#!/usr/bin/env bash
# The test command (README). Lanes:
#   scripts/run-tests.sh          full lane: harness (images, llama.cpp mirror and one shared CPU build
#                                 per ref), then every molecule scenario in the background beside the
#                                 fast lane's stages and the integration tests, then the sandbox fleet
#   scripts/run-tests.sh --fast   fast lane: ansible-lint (production), yamllint, ruff, vermin, unit tests
#                                 (with promtool check/test rules for the monitoring role)
#                                 (and again under Python 3.9, ansible-core 2.21's managed-host floor),
#                                 ansible-test sanity on the built artifact (scripts/sanity.sh), the
#                                 galaxy-importer gate and ansible-builder (scripts/import-gate.sh), and
#                                 ansible-core 2.20 / 2.22 (scripts/core-lane.sh)
# Env: MOLECULE_SCENARIOS="smoke ..." limits the molecule stage, MOLECULE_JOBS (default 3) runs that
# many scenarios at once; LLAMA_MTP_CACHE moves the caches.
# Prints each stage's wall time at the end, and the lane's wall time as its total. Second runs reuse the images, the llama.cpp mirror,
# the builds and ccache under $LLAMA_MTP_CACHE (default /var/cache/llama-mtp-fleet).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
lane=full
case "${1:-}" in --fast) lane=fast ;; --full|"") ;; *) echo "usage: $0 [--fast|--full]" >&2; exit 2 ;; esac

declare -a names=() secs=() results=()
failed=0
bg_name="" bg_pid="" bg_log="" bg_t0=0 cur_name="" cur_t0=0
# Everything this lane starts carries this mark in its environment (test hosts' stand-ins, git daemon, molecule,
# pytest workers): whatever stage ends the lane, cleanup() stops what still runs with it, and removes the
# containers the lane created (those that did not exist before it), so a failed lane leaves nothing behind.
export LLAMAFLEET_LANE_MARK="lane-$$-$(date +%s%N)"
containers_before=$(podman ps -aq --no-trunc 2>/dev/null | sort)
stop_group() {   # stop_group PID: TERM its process group, then KILL what is left after 30 s
  local pid=$1 i
  kill -TERM -- "-$pid" 2>/dev/null || return 0
  for i in $(seq 30); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 1; done
  kill -KILL -- "-$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
}
cleanup() {
  local now c pid gone=0 killed=0
  now=$(podman ps -aq --no-trunc 2>/dev/null | sort)
  for c in $(comm -13 <(echo "$containers_before") <(echo "$now")); do
    podman rm -f -t 2 "$c" >/dev/null 2>&1 && gone=$((gone + 1))
  done
  for pid in $(grep -lzx "LLAMAFLEET_LANE_MARK=$LLAMAFLEET_LANE_MARK" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3); do
    [ "$pid" = $$ ] || [ "$pid" = "$BASHPID" ] && continue
    kill -KILL "$pid" 2>/dev/null && killed=$((killed + 1))
  done
  echo "lane cleanup: removed $gone container(s) and stopped $killed process(es) the lane had started"
}
summary() {
  local rc=$?
  if [ -n "$cur_name" ]; then   # a signal stopped the lane in the middle of this stage
    names+=("$cur_name"); secs+=($((SECONDS - cur_t0))); results+=("FAILED (stopped by a signal, rc=$rc)")
  fi
  if [ -n "$bg_pid" ]; then   # the lane stopped while a background stage ran: stop it too
    stop_group "$bg_pid"
    names+=("$bg_name"); secs+=($((SECONDS - bg_t0))); results+=("stopped (the lane failed beside it)")
  fi
  if [ $rc -ne 0 ] || [ "${LANE_CLEANUP:-always}" = always ]; then cleanup; fi
  echo
  echo "== $lane lane: stage wall times =="
  local i
  for i in "${!names[@]}"; do
    printf '  %-28s %6ss  %s\n' "${names[$i]}" "${secs[$i]}" "${results[$i]}"
  done
  # the lane's wall time (a background stage overlaps the stages run beside it)
  printf '  %-28s %6ss\n' "total" "$SECONDS"
  [ $rc -eq 0 ] || echo "the lane FAILED (rc=$rc): the stage marked FAILED above"
}
trap summary EXIT
trap 'exit 143' TERM
trap 'exit 130' INT   # a lane stopped by a signal cleans up and reports too
stage() {   # stage NAME CMD...: run, time, and stop the lane at the first failure
  local name=$1; shift
  echo; echo "== stage: $name =="
  local t0=$SECONDS rc=0
  cur_name=$name cur_t0=$SECONDS
  if [ "$1" = source ]; then "$@" || rc=$?   # sets this shell's environment
  else   # in the background and waited for, so that a TERM or INT reaches the traps at once, not after the stage
    "$@" & wait $! || rc=$?
  fi
  names+=("$name"); secs+=($((SECONDS - t0))); cur_name=""
  if [ $rc -eq 0 ]; then results+=(ok); else results+=("FAILED (rc=$rc)"); failed=1; exit $rc; fi
}
bg_stage() {   # bg_stage NAME CMD...: start a stage in the background (its own process group), output kept
  bg_name=$1; shift
  bg_log=$(mktemp "/tmp/lane-$bg_name.XXXXXX")
  echo; echo "== stage: $bg_name (in the background beside the next stages; its output when it ends) =="
  bg_t0=$SECONDS
  # its own wall time goes to $bg_log.secs when it ends (the lane may reach bg_wait later)
  setsid bash -c '"$@"; rc=$?; echo "$SECONDS" > "$0.secs"; exit $rc' "$bg_log" "$@" > "$bg_log" 2>&1 &
  bg_pid=$!
}
bg_wait() {    # wait for the background stage, print its output, time it and stop the lane if it failed
  local rc=0 pid=$bg_pid t_wait=$SECONDS
  wait "$pid" || rc=$?
  bg_pid=""
  echo; echo "== stage: $bg_name (ran in the background; its output) =="
  cat "$bg_log"
  echo "($bg_name: the lane waited $((SECONDS - t_wait)) s for it after the stages beside it)"
  names+=("$bg_name (background)"); secs+=("$(cat "$bg_log.secs" 2>/dev/null || echo $((SECONDS - bg_t0)))")
  if [ $rc -eq 0 ]; then results+=(ok); else results+=("FAILED (rc=$rc)"); failed=1; exit $rc; fi
}

stage bootstrap source scripts/bootstrap.sh
# promtool from Debian's prometheus package, for the monitoring rules' unit tests (which fail without it here)
stage promtool bash -c 'bash scripts/promtool.sh > /dev/null'
LLAMAFLEET_PROMTOOL=$(bash scripts/promtool.sh)
export LLAMAFLEET_PROMTOOL LLAMAFLEET_REQUIRE_PROMTOOL=1

if [ "$lane" = full ]; then
  # The harness first (images, the llama.cpp mirror, one shared CPU build per ref; cached after the first run),
  # then every molecule scenario, three at a time, and the integration tests in the background beside the lint,
  # unit and sanity stages: the scenarios spend most of their time waiting on podman exec, systemd and Debian's
  # mirror, the stages beside them on the CPU, and one after the other they took 1,851 s of CI's 4,019 s.
  stage images bash scripts/sandbox.sh images
  stage llamacpp-mirror bash tests/harness/llamacpp/mirror.sh serve
  stage llamacpp-build-mainline bash -c 'tests/harness/llamacpp/build.sh master'
  stage llamacpp-build-pr-standin bash -c 'tests/harness/llamacpp/build.sh refs/pull/22673/head'
  LLAMA_SERVER_BIN=$(tests/harness/llamacpp/build.sh master)/bin/llama-server
  LLAMA_SERVER_PR_BIN=$(tests/harness/llamacpp/build.sh refs/pull/22673/head)/bin/llama-server
  export LLAMA_SERVER_BIN LLAMA_SERVER_PR_BIN
  # scripts/molecule-all.sh prints each scenario's wall time; MOLECULE_SCENARIOS="a b" runs only those,
  # MOLECULE_JOBS=1 one after another. The integration tests follow in the same background job (their capped
  # transfers and llama-server runs wait too): beside the foreground's stages the molecule stage ended about
  # 550 s before them.
  bg_stage molecule+integration bash -c 'bash scripts/molecule-all.sh || exit
    echo; echo "== integration (after molecule, in the background) =="
    t0=$SECONDS; pytest -q --durations=5 tests/integration; rc=$?
    echo "molecule: $t0 s, integration: $((SECONDS - t0)) s (rc=$rc)"; exit $rc'
fi

stage yamllint yamllint -s .
stage ansible-lint ansible-lint --offline -q
stage ruff bash -c 'ruff check . && ruff format --check .'
# Host-side code stays runnable on Python 3.8 (library calls ruff does not know: zip(strict=), removeprefix...)
stage vermin vermin -q -t=3.8- --violations --no-tips plugins/modules plugins/module_utils tests/stand-ins/nvidia-smi
# the unit tests in one worker per core (pytest-xdist, at most 4): 170 s against 298 s on 2 cores
stage unit pytest -q -n auto --maxprocesses=4 --durations=10 -m "not slow" tests/unit
# The host-side code under the managed-host floor of this controller (ansible-core 2.21: Python 3.9)
stage unit-py39 env HOST_PYTHON_FLOOR=3.9 bash scripts/unit-oldest-python.sh
stage sanity bash scripts/sanity.sh
# Galaxy / Automation Hub import gate (galaxy-importer) and the execution environment (ansible-builder)
stage import-gate bash scripts/import-gate.sh
# The other supported controllers: sanity and the controller-driving unit tests on 2.20 (Python 3.12, the oldest)
# and 2.22 (Python 3.13, the newest)
stage core-2.20 bash scripts/core-lane.sh 2.20
stage core-2.22 bash scripts/core-lane.sh 2.22
[ "$lane" = fast ] && exit 0

stage unit-slow pytest -q -m slow tests/unit
bg_wait
# README command 1, end to end on a fresh sandbox fleet, then the fleet playbooks on it
# (idempotence, the PR-merged upgrade, a failing upgrade with rollback, bench --tags autotune), alone on the
# machine: the speed gate and the served-through-the-upgrade checks measure it. Each llama host runs on a core of
# its own (SANDBOX_PIN=1, as the benchmarks do), so that the gate measures a host's change, not its neighbour's
# load on the same two cores (the false alarms of docs/measurements.md, 2026-12-07).
export SANDBOX_PIN=1
stage sandbox-down-before bash scripts/sandbox.sh down
stage sandbox-site bash scripts/run-sandbox.sh
stage fleet-playbooks env FLEET_SANDBOX=1 pytest -q -s --durations=0 tests/integration/test_fleet_playbooks.py   # -s: prints failed requests per host and run times
stage sandbox-down bash scripts/sandbox.sh down
