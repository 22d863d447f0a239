#!/usr/bin/env bash
# Make (once) a local git mirror of llama.cpp, so roles clone it by URL exactly as they
# would clone GitHub or an internal mirror. Test harness only: this machine cannot reach GitHub.
#
# Source: the llama.cpp tree vendored in the PyPI sdist of llama-cpp-python 0.3.36, which is
# upstream llama.cpp commit 0c1e570 (2026-10-01, has `--spec-type draft-mtp`). The tree is
# committed with fixed author/committer/date, so the mirror's commit sha is the same on every
# machine.
#
# Refs in the mirror:
#   master, tag mainline-0c1e570      the mainline tree (MTP spelled `draft-mtp`)
#   tag b9180                         STAND-IN for the first release tag that contains the merge of PR
#                                     #22673 (upstream b9180, 2026-05-16): on the mainline commit, so the
#                                     fleet follower (playbooks/follow_pr.yml) finds it with `git tag
#                                     --contains` or the GitHub stand-in (tests/harness/github_standin.py).
#                                     Upstream's b9180 is an older commit than 0c1e570; here both name one.
#   pr-22673, refs/pull/22673/head    STAND-IN for the pre-merge head of PR ggml-org/llama.cpp#22673:
#                                     one small patch commit (pr22673-standin.patch) on top of the
#                                     mainline tree that spells the type `mtp`, rejects `draft-mtp`,
#                                     and prints the `--spec-type` help in the old `[none|mtp|...]`
#                                     form. It is NOT the real PR head (GitHub is unreachable here).
#   slower-standin, tag b9181         STAND-IN for a later, slower release: master + slower-build-standin.patch
#                                     (llama-server sleeps 5 ms per decode call), for the speed gate's test.
#   slower20-standin, tag b9182       STAND-IN for a release about 20 % slower: master +
#                                     slower20-build-standin.patch (compute 1.25x as long), for the gate's
#                                     repeated runs (scripts/gate_repeat.py).
#
# Usage: mirror.sh            create the mirror if missing, print its path
#        mirror.sh serve      also start `git daemon` (git://<host>:9418/llama.cpp.git), idempotent
# Env:   LLAMA_MTP_CACHE (default /var/cache/llama-mtp-fleet)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${LLAMA_MTP_CACHE:-/var/cache/llama-mtp-fleet}
sdist_version=0.3.36
upstream_commit=0c1e570
gitroot=$cache/git
mirror=$gitroot/llama.cpp.git
export GIT_AUTHOR_NAME="llama.cpp mirror" GIT_AUTHOR_EMAIL="mirror@localhost"
export GIT_COMMITTER_NAME="$GIT_AUTHOR_NAME" GIT_COMMITTER_EMAIL="$GIT_AUTHOR_EMAIL"

make_mirror() {
  local src=$cache/src work
  mkdir -p "$src" "$gitroot"
  local tarball=$src/llama_cpp_python-$sdist_version.tar.gz
  if [ ! -f "$tarball" ]; then
    python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$sdist_version" -d "$src"
  fi
  work=$(mktemp -d "$cache/mirror-work.XXXXXX")
  trap 'rm -rf "$work"' RETURN
  tar -C "$work" -xzf "$tarball" "llama_cpp_python-$sdist_version/vendor/llama.cpp"
  mv "$work/llama_cpp_python-$sdist_version/vendor/llama.cpp" "$work/tree"
  rm -f "$work/tree/.git"   # a submodule pointer in the sdist, not a repository
  cd "$work/tree"
  git init -q -b master .
  git add -A -f .
  GIT_AUTHOR_DATE="2026-10-01T00:00:00Z" GIT_COMMITTER_DATE="2026-10-01T00:00:00Z" \
    git commit -q -m "llama.cpp $upstream_commit (webgpu: fix SSM_SCAN binding aliasing (#29750))

Tree vendored in the PyPI sdist llama-cpp-python==$sdist_version; mainline, MTP spelled draft-mtp."
  GIT_COMMITTER_DATE="2026-10-01T00:00:00Z" \
    git tag -a "mainline-$upstream_commit" -m "llama.cpp mainline $upstream_commit (from llama-cpp-python $sdist_version)"
  git checkout -q -b pr-22673
  git apply "$here/pr22673-standin.patch"
  git add -A .
  GIT_AUTHOR_DATE="2026-10-01T00:00:01Z" GIT_COMMITTER_DATE="2026-10-01T00:00:01Z" \
    git commit -q -m "STAND-IN for PR #22673 head (pre-merge MTP branch): spell the type 'mtp'

Test harness only. The real pre-merge head of ggml-org/llama.cpp#22673 accepted
'--spec-type mtp' and printed its help as [none|mtp|...]; it was renamed to
'draft-mtp' before the merge (b9180). This commit reproduces only that interface
on the mainline tree so fleet-upgrade tests have a 'PR branch' to upgrade from."
  git update-ref refs/pull/22673/head HEAD
  git checkout -q master
  git clone -q --bare . "$mirror.tmp"
  git --git-dir="$mirror.tmp" update-ref refs/pull/22673/head "$(git rev-parse refs/pull/22673/head)"
  git --git-dir="$mirror.tmp" config daemon.uploadpack true
  git --git-dir="$mirror.tmp" config uploadpack.allowAnySHA1InWant true
  touch "$mirror.tmp/git-daemon-export-ok"
  cd /
  mv "$mirror.tmp" "$mirror"
}

if [ ! -f "$mirror/git-daemon-export-ok" ]; then
  rm -rf "$mirror" "$mirror.tmp"
  make_mirror
fi
# The release tag of the merge (added to mirrors made before it existed; a lightweight tag, as llama.cpp's).
git --git-dir="$mirror" rev-parse -q --verify refs/tags/b9180 >/dev/null \
  || git --git-dir="$mirror" update-ref refs/tags/b9180 refs/heads/master

# STAND-INs for later releases that are slower, for the speed gate's tests: a tag on a commit on top of master
# with one patch (fixed dates: the same sha on every machine; added to existing mirrors too).
#   b9181  slower-build-standin.patch: llama-server sleeps 5 ms in each decode call (much slower: the follower's
#          test, tests/integration/test_fleet_playbooks.py test 6c)
#   b9182  slower20-build-standin.patch: each model computation is followed by a sleep of a quarter of its own
#          time (the gate's repeated runs, scripts/gate_repeat.py). Meant as about 20 % fewer tokens/s; measured
#          -48 % on the sandbox's tiny model, whose computations last microseconds (the sleep's own overhead
#          dominates), so it is a ~2x-slower build there, not a 20 % one (docs/measurements.md)
standin_release() {   # standin_release TAG BRANCH PATCH DATE MESSAGE
  local tag=$1 branch=$2 patch=$3 date=$4 message=$5 slow
  git --git-dir="$mirror" rev-parse -q --verify "refs/tags/$tag" >/dev/null && return 0
  slow=$(mktemp -d "$cache/mirror-slow.XXXXXX")
  git clone -q --shared "$mirror" "$slow/tree"
  (
    cd "$slow/tree"
    git checkout -q master
    git apply "$here/$patch"
    git add -A .
    GIT_AUTHOR_DATE="$date" GIT_COMMITTER_DATE="$date" git commit -q -m "$message"
    git push -q "$mirror" "HEAD:refs/heads/$branch" "HEAD:refs/tags/$tag"
  )
  rm -rf "$slow"
}
standin_release b9181 slower-standin slower-build-standin.patch 2026-10-01T00:00:02Z \
  "STAND-IN for a slower release: llama-server sleeps 5 ms in each decode call

Test harness only: a build that serves, passes /health and completes, and decodes
measurably slower, so the speed gate's test can take the fleet to it through the PR
follower (tests/integration/test_fleet_playbooks.py, test 6c)."
standin_release b9182 slower20-standin slower20-build-standin.patch 2026-10-01T00:00:03Z \
  "STAND-IN for a release about 20 % slower: each model computation takes 1.25x as long

Test harness only: a build that serves, passes /health and completes, and whose
tokens/s are about 20 % lower on any machine, for the speed gate's repeated runs
(scripts/gate_repeat.py)."

case "${1:-}" in
  serve)
    if ! (exec 3<>/dev/tcp/127.0.0.1/9418) 2>/dev/null; then
      git daemon --detach --reuseaddr --export-all --base-path="$gitroot" \
        --pid-file="$cache/git-daemon.pid" "$gitroot"
      for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/9418) 2>/dev/null && break; sleep 0.1; done
    fi
    ;;
  "") ;;
  *) echo "usage: $0 [serve]" >&2; exit 2 ;;
esac
echo "$mirror"
