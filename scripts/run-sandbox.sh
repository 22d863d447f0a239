#!/usr/bin/env bash
# The main job on the embedded default (README, command 1), from a fresh clone, as root:
# bootstrap the controller, bring up the local sandbox fleet (2 Debian 12 systemd hosts in
# podman), serve the local llama.cpp mirror, generate the sandbox model, then run the product's own command:
#     ansible-playbook site.yml -i inventories/sandbox
# Extra arguments go to ansible-playbook (e.g. --check --diff, --tags facts).
# Tear the fleet down with: bash scripts/sandbox.sh down
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
. scripts/bootstrap.sh
bash scripts/sandbox.sh up 2 12
bash tests/harness/llamacpp/mirror.sh serve >/dev/null   # the sandbox's stand-in for GitHub
models=$LLAMA_MTP_CACHE/models/sandbox
if [ ! -f "$models/sandbox-mtp.gguf" ]; then
  mkdir -p "$models"
  python3 tests/harness/gguf/make_models.py --kind agree --name sandbox-mtp --out "$models"
fi
ansible-playbook site.yml -i inventories/sandbox "$@"
