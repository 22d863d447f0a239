#!/usr/bin/env bash
# The collection on the other supported ansible-cores than the project venv's (2.21, requirements.txt):
#   scripts/core-lane.sh 2.19    Python 3.11: ansible-test sanity on the built artifact, the unit tests that drive
#                                this controller itself (the collection built, installed and documented; playbooks
#                                with the collection's modules, filters and action plugins; secrets in its logs),
#                                and the host-side tests under its managed-host floor (Python 3.8). The rest of
#                                the unit suite is pure Python and runs once, under 2.21 (CI time).
#   scripts/core-lane.sh 2.20    Python 3.12: ansible-test sanity on the built artifact
# Each controller gets a venv under $LLAMA_MTP_CACHE from tests/requirements-core-<version>.txt (its `ansible`
# bundle's collections included); the Python is pyenv's newest <python> (or CORE_LANE_PYTHON).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
core=${1:?usage: $0 2.19|2.20}
case "$core" in
  2.19) python_version=3.11 floor=3.8 unit=1 ;;
  2.20) python_version=3.12 floor=3.9 unit=0 ;;
  *) echo "core-lane: unknown ansible-core $core (2.21 is the project venv: scripts/run-tests.sh)" >&2; exit 2 ;;
esac
py=${CORE_LANE_PYTHON:-}
if [ -z "$py" ]; then
  py=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$python_version".*/bin/python"$python_version" 2>/dev/null | sort -rV | head -1)
  [ -n "$py" ] || py=$(command -v "python$python_version" || true)
fi
if [ -z "$py" ] || ! "$py" -c 'import venv' 2>/dev/null; then
  echo "core-lane: ansible-core $core needs Python $python_version (pyenv or PATH, or CORE_LANE_PYTHON); not tested here" >&2
  exit 1
fi
req=tests/requirements-core-$core.txt
venv=${LLAMA_MTP_CACHE:-/var/cache/llama-mtp-fleet}/venv-core-$core
source "$repo/scripts/venv.sh"
stamped_venv "$py" "$req" "$venv"
echo "core-lane: $("$venv/bin/ansible" --version | head -1), $("$venv/bin/python" -V)"
export PATH="$venv/bin:$PATH" LLAMAFLEET_ANSIBLE_BIN=$venv/bin ANSIBLE_CONFIG=$repo/ansible.cfg
t0=$SECONDS
SANITY_PYTHON=$python_version SANITY_WORK=${LLAMA_MTP_CACHE:-/var/cache/llama-mtp-fleet}/sanity-$core \
  bash scripts/sanity.sh
echo "core-lane $core: sanity ok ($((SECONDS - t0))s)"
if [ "$unit" = 1 ]; then
  t0=$SECONDS
  "$venv/bin/python" -m pytest -q -p no:cacheprovider -n auto --maxprocesses=4 -m "not slow" tests/unit/test_collection.py \
    tests/unit/test_chain_playbook.py tests/unit/test_controller_side_tasks.py tests/unit/test_secret_log.py \
    tests/unit/test_fleet_lock.py tests/unit/test_tensor_split_module.py
  echo "core-lane $core: unit ok ($((SECONDS - t0))s)"
  t0=$SECONDS
  HOST_PYTHON_FLOOR=$floor bash scripts/unit-oldest-python.sh
  echo "core-lane $core: host floor Python $floor ok ($((SECONDS - t0))s)"
fi
