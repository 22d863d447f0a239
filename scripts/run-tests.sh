#!/usr/bin/env bash
# The test command (README). Lanes:
#   scripts/run-tests.sh          full lane: fast lane + harness (images, llama.cpp mirror and one
#                                 shared CPU build per ref) + integration tests + every molecule scenario
#   scripts/run-tests.sh --fast   fast lane: ansible-lint (production), yamllint, ruff, vermin, unit tests
#                                 (with promtool check/test rules for the monitoring role)
#                                 (and again under Python 3.9, ansible-core 2.21's managed-host floor),
#                                 ansible-test sanity on the built artifact (scripts/sanity.sh), the
#                                 galaxy-importer gate and ansible-builder (scripts/import-gate.sh), and
#                                 ansible-core 2.19 / 2.20 (scripts/core-lane.sh)
# Env: MOLECULE_SCENARIOS="smoke ..." limits the molecule stage, MOLECULE_JOBS (default 3) runs that
# many scenarios at once; LLAMA_MTP_CACHE moves the caches.
# Prints each stage's wall time at the end. Second runs reuse the images, the llama.cpp mirror,
# the builds and ccache under $LLAMA_MTP_CACHE (default /var/cache/llama-mtp-fleet).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
lane=full
case "${1:-}" in --fast) lane=fast ;; --full|"") ;; *) echo "usage: $0 [--fast|--full]" >&2; exit 2 ;; esac

declare -a names=() secs=() results=()
failed=0
summary() {
  echo
  echo "== $lane lane: stage wall times =="
  local total=0 i
  for i in "${!names[@]}"; do
    printf '  %-28s %6ss  %s\n' "${names[$i]}" "${secs[$i]}" "${results[$i]}"
    total=$((total + secs[i]))
  done
  printf '  %-28s %6ss\n' "total" "$total"
}
trap summary EXIT
stage() {   # stage NAME CMD...: run, time, and stop the lane at the first failure
  local name=$1; shift
  echo; echo "== stage: $name =="
  local t0=$SECONDS rc=0
  "$@" || rc=$?
  names+=("$name"); secs+=($((SECONDS - t0)))
  if [ $rc -eq 0 ]; then results+=(ok); else results+=("FAILED (rc=$rc)"); failed=1; exit $rc; fi
}

stage bootstrap source scripts/bootstrap.sh
# promtool from Debian's prometheus package, for the monitoring rules' unit tests (which fail without it here)
stage promtool bash -c 'bash scripts/promtool.sh > /dev/null'
LLAMAFLEET_PROMTOOL=$(bash scripts/promtool.sh)
export LLAMAFLEET_PROMTOOL LLAMAFLEET_REQUIRE_PROMTOOL=1
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
# The other supported controllers: sanity, unit tests and the Python 3.8 host floor on 2.19 (Python 3.11);
# sanity on 2.20 (Python 3.12)
stage core-2.19 bash scripts/core-lane.sh 2.19
stage core-2.20 bash scripts/core-lane.sh 2.20
[ "$lane" = fast ] && exit 0

stage images bash scripts/sandbox.sh images
stage llamacpp-mirror bash tests/harness/llamacpp/mirror.sh serve
stage llamacpp-build-mainline bash -c 'tests/harness/llamacpp/build.sh master'
stage llamacpp-build-pr-standin bash -c 'tests/harness/llamacpp/build.sh refs/pull/22673/head'
LLAMA_SERVER_BIN=$(tests/harness/llamacpp/build.sh master)/bin/llama-server
LLAMA_SERVER_PR_BIN=$(tests/harness/llamacpp/build.sh refs/pull/22673/head)/bin/llama-server
export LLAMA_SERVER_BIN LLAMA_SERVER_PR_BIN
stage unit-slow pytest -q -m slow tests/unit
stage integration pytest -q tests/integration
# Every molecule scenario, three at a time (scripts/molecule-all.sh prints each one's wall time);
# MOLECULE_SCENARIOS="a b" runs only those, MOLECULE_JOBS=1 one after another.
stage molecule bash scripts/molecule-all.sh
# README command 1, end to end on a fresh sandbox fleet, then the fleet playbooks on it
# (idempotence, the PR-merged upgrade, a failing upgrade with rollback, bench --tags autotune).
stage sandbox-down-before bash scripts/sandbox.sh down
stage sandbox-site bash scripts/run-sandbox.sh
stage fleet-playbooks env FLEET_SANDBOX=1 pytest -q -s --durations=0 tests/integration/test_fleet_playbooks.py   # -s: prints failed requests per host and run times
stage sandbox-down bash scripts/sandbox.sh down
