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
# 2.21 (requirements.txt). Every supported ansible-core (2.20-2.22) needs 3.12+ on the controller: a machine with
# neither gets a message saying how to get one, not an unsupported ansible-core. LLAMAFLEET_PYTHON names an
# interpreter instead.
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
  cat >&2 <<MSG
bootstrap: no Python 3.12 or 3.13 with venv here (${_py:-none found}; python3 is $(python3 -V 2>&1 || echo missing)).
  ansible-core 2.20-2.22, the versions this collection supports, need Python 3.12+ on the controller
  (ansible-core 2.19, the last for Python 3.11, reached its end of life in November 2026). Get one, then run this again:
    - Debian 13: its python3 is 3.13 (apt-get install python3-venv)
    - uv (from PyPI):  python3 -m pip install --user uv && ~/.local/bin/uv python install 3.13
                       then LLAMAFLEET_PYTHON=\$(~/.local/bin/uv python find 3.13) bash scripts/bootstrap.sh
    - pyenv:           pyenv install 3.13 (bootstrap finds pyenv's versions by itself)
MSG
  exit 1
fi
source "$_repo/scripts/venv.sh"
stamped_venv "$_py" "$_req" "$_venv" "$_venv/.requirements.sha256"
echo "bootstrap: $("$_venv/bin/ansible" --version | sed -n 1p) on $("$_venv/bin/python" -V) in $_venv"
export PATH="$_venv/bin:$PATH"
export ANSIBLE_CONFIG="$_repo/ansible.cfg"
export LLAMA_MTP_CACHE=${LLAMA_MTP_CACHE:-/var/cache/llama-mtp-fleet}
