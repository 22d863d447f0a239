#!/usr/bin/env bash
# Bootstrap a Debian 12/13 controller (as root) from a fresh clone: system packages and
# containers.conf (setup-host.sh), then the Python tooling in ./.venv from requirements.txt.
# Idempotent and quick on a second run (the venv is rebuilt only when requirements.txt changes).
# Source it to get the venv on PATH:  . scripts/bootstrap.sh
set -euo pipefail
_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$_repo/scripts/setup-host.sh"
_venv=$_repo/.venv
_stamp=$_venv/.requirements.sha256
_want=$(sha256sum "$_repo/requirements.txt" | cut -d' ' -f1)
if [ ! -x "$_venv/bin/python" ] || [ "$(cat "$_stamp" 2>/dev/null)" != "$_want" ]; then
  python3 -m venv "$_venv"
  "$_venv/bin/pip" install -q --disable-pip-version-check -r "$_repo/requirements.txt"
  echo "$_want" > "$_stamp"
fi
export PATH="$_venv/bin:$PATH"
export ANSIBLE_CONFIG="$_repo/ansible.cfg"
export LLAMA_MTP_CACHE=${LLAMA_MTP_CACHE:-/var/cache/llama-mtp-fleet}
