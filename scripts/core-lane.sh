#!/usr/bin/env bash
# The collection on the supported ansible-cores other than the project venv's (2.21, requirements.txt):
#   scripts/core-lane.sh 2.20    Python 3.12 (the oldest supported controller)
#   scripts/core-lane.sh 2.22    Python 3.13 (the newest)
# Each: ansible-test sanity on the built artifact, and the unit tests that drive this controller itself (the
# collection built, installed and documented; playbooks with the collection's modules, filters and action plugins;
# secrets in its logs; no warning the collection causes). The rest of the unit suite is pure Python and runs once,
# under 2.21 (CI time); the managed-host floor (Python 3.9 for every supported ansible-core) is the fast lane's
# unit-py39 stage.
# Each controller gets a venv under $LLAMA_MTP_CACHE from tests/requirements-core-<version>.txt (and, installed
# with --no-deps, tests/requirements-core-<version>.nodeps.txt where it exists: the collections of an `ansible`
# bundle whose pip requirement pins another ansible-core); the Python is pyenv's newest <python> (or
# CORE_LANE_PYTHON).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
core=${1:?usage: $0 2.20|2.22}
case "$core" in
  2.20) python_version=3.12 ;;
  2.22) python_version=3.13 ;;
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
nodeps=tests/requirements-core-$core.nodeps.txt
[ -f "$nodeps" ] || nodeps=
venv=${LLAMA_MTP_CACHE:-/var/cache/llama-mtp-fleet}/venv-core-$core
source "$repo/scripts/venv.sh"
stamped_venv "$py" "$req" "$venv" "$venv/.stamp" "$nodeps"
echo "core-lane: $("$venv/bin/ansible" --version | sed -n 1p), $("$venv/bin/python" -V)"
export PATH="$venv/bin:$PATH" LLAMAFLEET_ANSIBLE_BIN=$venv/bin ANSIBLE_CONFIG=$repo/ansible.cfg
t0=$SECONDS
SANITY_PYTHON=$python_version SANITY_WORK=${LLAMA_MTP_CACHE:-/var/cache/llama-mtp-fleet}/sanity-$core \
  bash scripts/sanity.sh
echo "core-lane $core: sanity ok ($((SECONDS - t0))s)"
t0=$SECONDS
"$venv/bin/python" -m pytest -q -p no:cacheprovider -n auto --maxprocesses=4 -m "not slow" tests/unit/test_collection.py \
  tests/unit/test_chain_playbook.py tests/unit/test_controller_side_tasks.py tests/unit/test_secret_log.py \
  tests/unit/test_fleet_lock.py tests/unit/test_tensor_split_module.py tests/unit/test_no_warnings.py
echo "core-lane $core: unit ok ($((SECONDS - t0))s)"
