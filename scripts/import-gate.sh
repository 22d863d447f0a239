#!/usr/bin/env bash
# The Galaxy / Automation Hub import gate on the BUILT artifact: galaxy-importer (the same checks the
# Galaxy and Automation Hub imports run: metadata, docs via ansible-doc, role READMEs, changelog,
# ansible-lint, and Automation Hub's version policy >= 1.0.0), then ansible-builder on the execution
# environment definition. galaxy-importer's ansible-test step needs docker; ansible-test sanity runs in
# scripts/sanity.sh instead. Fails on the importer's exit status, on any ERROR it prints and on any WARNING
# other than the notice that sanity ignore files exist.
# Env: IMPORT_GATE_WORK (scratch dir, default $LLAMA_MTP_CACHE/import-gate).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=${IMPORT_GATE_WORK:-${LLAMA_MTP_CACHE:-/var/cache/llama-mtp-fleet}/import-gate}
req=$repo/tests/requirements-import-gate.txt
venv=$work/venv
source "$repo/scripts/venv.sh"
stamped_venv "$(command -v python3)" "$req" "$venv"
mkdir -p "$work/dist"
: > "$work/empty.cfg"   # no ansible.cfg: the checkout's must not shadow the artifact
rm -f "$work"/dist/*.tar.gz
"$venv/bin/ansible-galaxy" collection build --force --output-path "$work/dist" "$repo" >/dev/null
tarball=$(ls "$work"/dist/llamafleet-mtp-*.tar.gz)
cat > "$work/galaxy-importer.cfg" <<'CFG'
[galaxy-importer]
run_ansible_test = False
run_ansible_lint = True
offline_ansible_lint = True
run_ansible_doc = True
check_changelog = True
require_v1_or_greater = True
CFG
out=$work/importer.log
rc=0
(cd "$work" && PATH="$venv/bin:$PATH" ANSIBLE_CONFIG="$work/empty.cfg" GALAXY_IMPORTER_CONFIG="$work/galaxy-importer.cfg" \
  "$venv/bin/python" -m galaxy_importer.main "$tarball") > "$out" 2>&1 || rc=$?
grep -E 'ERROR|WARNING' "$out" || true
tail -n 1 "$out"
# Every WARNING is a finding (ansible-lint's included) except the notice that ignore files exist: ansible-test
# reads tests/sanity/ignore-<version>.txt, one per tested ansible-core (its lines: the MIT license, not GPLv3).
findings=$(grep -E '^WARNING: ' "$out" | grep -vc 'Ignore files skip ansible-test sanity tests' || true)
if [ $rc -ne 0 ] || grep -q 'ERROR' "$out" || [ "$findings" -gt 0 ]; then
  echo "import-gate: galaxy-importer refused $(basename "$tarball") (rc=$rc); the whole output is in $out" >&2
  exit 1
fi
echo "import-gate: $(basename "$tarball") passes galaxy-importer $("$venv/bin/pip" show galaxy-importer 2>/dev/null | sed -n 's/^Version: //p')"

# The execution environment: `ansible-builder create` renders the build context of execution-environment.yml
# (nothing is downloaded), and `ansible-builder introspect` - the step the image build runs once the collections
# are installed - reads the installed artifact's meta/execution-environment.yml: its Python and system
# requirements must be there.
ctx=$work/ee-context
rm -rf "$ctx" "$work/ee-collections"
"$venv/bin/ansible-builder" create --file "$repo/execution-environment.yml" --context "$ctx" >/dev/null
grep -q 'llamafleet.mtp' "$ctx/_build/requirements.yml"
ANSIBLE_CONFIG="$work/empty.cfg" "$venv/bin/ansible-galaxy" collection install --offline --no-deps \
  -p "$work/ee-collections" "$tarball" >/dev/null
"$venv/bin/ansible-builder" introspect --sanitize "$work/ee-collections" \
  --write-pip "$work/ee-python.txt" --write-bindep "$work/ee-bindep.txt" >/dev/null
echo "import-gate: ansible-builder context $ctx ($(ls "$ctx"))"
echo "  python deps: $(grep -v '^#' "$work/ee-python.txt" | tr '\n' ' ')"
echo "  system deps: $(grep -v '^#' "$work/ee-bindep.txt" | tr '\n' ' ')"
grep -q '^huggingface.hub' "$work/ee-python.txt"
grep -q '^git ' "$work/ee-bindep.txt"
