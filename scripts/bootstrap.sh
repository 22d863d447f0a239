#!/usr/bin/env bash
# Bootstrap a Debian 12/13 controller (as root) from a fresh clone: system packages and
# containers.conf (setup-host.sh), then the Python tooling in ./.venv from requirements.txt.
# Idempotent and quick on a second run (the venv is rebuilt only when requirements.txt changes).
# Source it to get the venv on PATH:  . scripts/bootstrap.sh
set -euo pipefail
_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$_repo/scripts/setup-host.sh"
_venv=$_repo/.venv
# The controller Python: the newest of 3.13 and 3.12 this machine has (pyenv's, else on PATH), for ansible-core
# 2.21 (requirements.txt). With neither: Python 3.11 and ansible-core 2.19, the oldest supported controller (its
# pins from tests/requirements-core-2.19.txt). LLAMAFLEET_PYTHON names an interpreter instead.
_pick_python() {
  local v c
  for v in "$@"; do
    for c in $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/python"$v" 2>/dev/null | sort -rV) \
        $(command -v "python$v" || true); do
      if "$c" -c 'import venv, ensurepip' 2>/dev/null; then echo "$c"; return 0; fi
    done
  done
}
_py=${LLAMAFLEET_PYTHON:-$(_pick_python 3.13 3.12)}
_req=$_repo/requirements.txt
if [ -z "$_py" ] || ! "$_py" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
  _py=${_py:-$(_pick_python 3.11)}
  [ -n "$_py" ] || { echo "bootstrap: no Python 3.11, 3.12 or 3.13 here (pyenv or PATH)" >&2; exit 1; }
  _req=${LLAMA_MTP_CACHE:-/var/cache/llama-mtp-fleet}/requirements-controller-2.19.txt
  mkdir -p "$(dirname "$_req")"
  sed -e "s/^ansible==.*/$(grep '^ansible==' "$_repo/tests/requirements-core-2.19.txt")/" \
      -e "s/^ansible-core==.*/$(grep '^ansible-core==' "$_repo/tests/requirements-core-2.19.txt")/" \
      "$_repo/requirements.txt" > "$_req"
  echo "bootstrap: no Python 3.12+ here: ansible-core 2.19 on $("$_py" -V) (the oldest supported controller)" >&2
fi
source "$_repo/scripts/venv.sh"
stamped_venv "$_py" "$_req" "$_venv" "$_venv/.requirements.sha256"
echo "bootstrap: $("$_venv/bin/ansible" --version | head -1) on $("$_venv/bin/python" -V) in $_venv"
export PATH="$_venv/bin:$PATH"
export ANSIBLE_CONFIG="$_repo/ansible.cfg"
export LLAMA_MTP_CACHE=${LLAMA_MTP_CACHE:-/var/cache/llama-mtp-fleet}
