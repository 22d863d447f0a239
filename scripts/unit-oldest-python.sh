#!/usr/bin/env bash
# Unit tests of the host-side code (plugins/module_utils, and modules run by the real ansible CLI with
# ansible_python_interpreter = this Python) under the oldest managed-host Python of the controller under
# test: 3.9 for every supported ansible-core (2.20-2.22). ruff (target py38 for plugins/modules and
# plugins/module_utils) and vermin check the code statically, one step stricter; this runs it on the floor.
# A machine without that Python fails this stage (with how to get one): the floor is never silently untested.
# Env: HOST_PYTHON_FLOOR (default 3.9), OLDEST_PYTHON (an interpreter; default: pythonX.Y on PATH, else
#      pyenv's newest X.Y.z), LLAMAFLEET_ANSIBLE_BIN (the controller venv's bin; default ./.venv/bin).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
floor=${HOST_PYTHON_FLOOR:-3.9}
py=
for cand in ${OLDEST_PYTHON:-} $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/$floor.*/bin/python$floor 2>/dev/null | sort -rV) \
    $(command -v "python$floor" || true); do   # (a pyenv shim on PATH exists but fails unless it is selected)
  if "$cand" -c "import sys; assert '%d.%d' % sys.version_info[:2] == '$floor'" 2>/dev/null; then py=$cand; break; fi
done
if [ -z "$py" ]; then
  echo "unit-oldest-python: no Python $floor here, so the managed-host floor cannot be tested: install one (pyenv install $floor, or uv python install $floor) or name it in OLDEST_PYTHON" >&2
  exit 1
fi
req=tests/requirements-oldest-python.txt
venv=${LLAMA_MTP_CACHE:-/var/cache/llama-mtp-fleet}/venv-py${floor//./}
source "$repo/scripts/venv.sh"
stamped_venv "$py" "$req" "$venv"
controller_python=$(command -v python3)
echo "unit-oldest-python: $("$venv/bin/python" -V) ($py) under $("${LLAMAFLEET_ANSIBLE_BIN:-$repo/.venv/bin}/ansible" --version | sed -n 1p); GGUF fixtures written by $controller_python"
# The venv first on PATH: the nvidia-smi stand-in (#!/usr/bin/env python3) runs on 3.8 too, as on a host.
PATH="$venv/bin:$PATH" LLAMAFLEET_GGUF_PYTHON=$controller_python \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider -n auto --maxprocesses=4 -m "not slow" \
  tests/unit/test_nvidia_smi.py tests/unit/test_tensor_plan.py tests/unit/test_cuda_compat.py \
  tests/unit/test_llama_caps.py tests/unit/test_llamacpp_build.py tests/unit/test_model_fetch.py \
  tests/unit/test_model_files.py tests/unit/test_llama_bench.py \
  tests/unit/test_gpu_facts_module.py tests/unit/test_llama_server_capabilities_module.py
