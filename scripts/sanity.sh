#!/usr/bin/env bash
# ansible-test sanity on the BUILT artifact, offline, as the Galaxy / Automation Hub import
# gate checks it: `ansible-galaxy collection build`, install the tarball into a scratch
# collections dir, then `ansible-test sanity --local` inside the installed copy.
#   scripts/sanity.sh [ansible-test sanity options...]   e.g. --test validate-modules
# Env: SANITY_WORK (scratch dir outside any git checkout, default $LLAMA_MTP_CACHE/sanity),
#      SANITY_PYTHON (default: the version of python3 on PATH, the controller's).
#
# ansible-test bootstraps pip into each sanity venv with a get-pip script it downloads from
# ci-files.testing.ansible.com (not reachable here); it uses ~/.ansible/test/cache/
# get_pip_<version>.py when present. We put a stand-in there (under a scratch HOME) that
# installs pip from the interpreter's bundled ensurepip wheel and then lets that pip install
# the requested pip version from the package index.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=${SANITY_WORK:-${LLAMA_MTP_CACHE:-/var/cache/llama-mtp-fleet}/sanity}
python_version=${SANITY_PYTHON:-$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')}
mkdir -p "$work/dist" "$work/home/.ansible/test/cache"
: > "$work/ansible.cfg"   # empty config: the checkout's ansible.cfg must not shadow the artifact

# The get-pip stand-in, for every pip version this ansible-test asks for.
pip_versions=$(python3 - <<'EOF'
import ansible_test._internal.python_requirements as r
import inspect, re
print(" ".join(sorted(set(re.findall(r"pip='([0-9.]+)'", inspect.getsource(r.get_venv_packages))))))
EOF
)
for v in $pip_versions; do
  cat > "$work/home/.ansible/test/cache/get_pip_${v//./_}.py" <<'EOF'
"""Offline stand-in for get-pip.py: pip from ensurepip's bundled wheel, then pip installs the rest."""
import subprocess
import sys

# In a child: ensurepip.bootstrap() sets PIP_CONFIG_FILE=/dev/null in its own process, and the
# pip below must still read the machine's pip.conf (index, CA bundle).
subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade", "--default-pip"])
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", "--upgrade", *args]))
EOF
done

# Requirements of this ansible-test that only resolve from GitHub (a `name @ https://...` line) get their PyPI
# equivalent from scripts/sanity-pypi-equivalents.txt; one without an equivalent there is named and refused.
reqdir=$(python3 -c 'import ansible_test, os; print(os.path.join(os.path.dirname(ansible_test.__file__), "_data", "requirements"))')
for f in "$reqdir"/*.txt; do
  grep -q '^[A-Za-z0-9_.-]* @ https://' "$f" || continue
  while read -r name url_line; do
    pin=$(awk -v n="$name" '$1 == n {print $2}' "$repo/scripts/sanity-pypi-equivalents.txt")
    if [ -z "$pin" ]; then
      echo "sanity: $(basename "$f") of $(ansible --version | sed -n 1p) wants $name from a URL ($url_line); add its PyPI equivalent to scripts/sanity-pypi-equivalents.txt" >&2
      exit 1
    fi
    sed -i "s|^$name @ https://.*|$pin|" "$f"
    echo "sanity: $(basename "$f"): $name from PyPI ($pin, scripts/sanity-pypi-equivalents.txt) instead of a GitHub archive"
  done < <(sed -n 's/^\([A-Za-z0-9_.-]*\) @ \(https:.*\)/\1 \2/p' "$f")
done

# Build and install the artifact (with --force: the checkout's ansible.cfg points
# collections_path at the checkout itself, and without --force install would do nothing).
rm -f "$work"/dist/*.tar.gz
ansible-galaxy collection build --force --output-path "$work/dist" "$repo" >/dev/null
tarball=$(ls "$work"/dist/llamafleet-mtp-*.tar.gz)
rm -rf "$work/collections"
ANSIBLE_CONFIG="$work/ansible.cfg" ansible-galaxy collection install --force --no-deps \
  -p "$work/collections" "$tarball" >/dev/null
echo "sanity: $(basename "$tarball") ($(du -k "$tarball" | cut -f1) KiB), installed under $work/collections"
# galaxy.yml's dependency ranges against the collections this ansible's bundle ships: an offline install
# with dependencies resolves them from the bundle and fails when a range excludes the bundled version.
rm -rf "$work/deps-check"
if ! out=$(ANSIBLE_CONFIG="$work/ansible.cfg" ansible-galaxy collection install --offline -p "$work/deps-check" "$tarball" 2>&1); then
  echo "$out" >&2
  echo "sanity: galaxy.yml's dependencies are not met by the collections of $(ansible --version | sed -n 1p)" >&2
  exit 1
fi
echo "sanity: dependencies met by the bundle: $(echo "$out" | grep -o "'[a-z_.]*:[0-9.]*' is already installed" | cut -d"'" -f2 | tr '\n' ' ')"

cd "$work/collections/ansible_collections/llamafleet/mtp"
# Inside a git checkout ansible-test would list files through git (and see none of these).
if git rev-parse --git-dir >/dev/null 2>&1; then
  echo "sanity: SANITY_WORK=$work is inside a git checkout; put it elsewhere" >&2; exit 2
fi
# ansible-test finds the collection from the cwd; a scratch HOME keeps its venvs and the
# get-pip stand-in out of the user's home, and ANSIBLE_CONFIG="$work/ansible.cfg" keeps the checkout's
# ansible.cfg (collections_path = the checkout) from shadowing the installed artifact.
HOME="$work/home" ANSIBLE_CONFIG="$work/ansible.cfg" \
  ansible-test sanity --local --python "$python_version" --color no "$@"
