#!/usr/bin/env bash
# Every molecule scenario (or those named in MOLECULE_SCENARIOS), MOLECULE_JOBS at a time (default 3):
# each scenario has its own containers, network namespace and ephemeral directory, and spends most
# of its time waiting on podman exec and systemd, so two at a time took about 60 % of the wall time
# of one after another on a 2-core machine. Each scenario's output goes to its own log; the logs of
# failed scenarios are printed at the end (their last 200 lines), then one line per scenario.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
jobs=${MOLECULE_JOBS:-3}
logs=${MOLECULE_LOGS:-$(mktemp -d /tmp/molecule-logs.XXXXXX)}
mkdir -p "$logs"
scenarios=()
for s in ${MOLECULE_SCENARIOS:-$(ls -1 extensions/molecule)}; do
  [ -f "extensions/molecule/$s/molecule.yml" ] && scenarios+=("$s")
done
[ ${#scenarios[@]} -gt 0 ] || { echo "no molecule scenario to run" >&2; exit 2; }
# Longest first, so that the short ones fill in at the end: by the wall times of the last run on this
# machine (cache), else by scripts/molecule-times.seed (a clean machine: CI), unknown ones first.
times=${LLAMA_MTP_CACHE:-/var/cache/llama-mtp-fleet}/molecule-times
last_time() { awk -v s="$1" '$1 == s {print $2}' "$2" 2>/dev/null | tail -n 1 | grep .; }
mapfile -t scenarios < <(for s in "${scenarios[@]}"; do
  echo "$(last_time "$s" "$times" || last_time "$s" scripts/molecule-times.seed || echo 99999) $s"
done | sort -s -k1,1nr | cut -d' ' -f2)
echo "molecule: ${#scenarios[@]} scenarios, $jobs at a time; logs in $logs"
export logs
one() {   # one SCENARIO: molecule test, its log, its wall time and result
  local s=$1 t0=$SECONDS rc=0
  echo "  start  $s"
  molecule test -s "$s" > "$logs/$s.log" 2>&1 || rc=$?
  echo "$s $((SECONDS - t0)) $rc" > "$logs/$s.result"
  echo "  end    $s: $((SECONDS - t0)) s, rc=$rc"
  return $rc
}
export -f one
# Each worker takes the next scenario when its last one is done.
printf '%s\n' "${scenarios[@]}" | xargs -P "$jobs" -I{} bash -c 'one "$1"' _ {}
failed=0 table=()
for s in "${scenarios[@]}"; do   # failed scenarios' logs first, then one line per scenario
  read -r _ secs rc < "$logs/$s.result" 2>/dev/null || { secs=?; rc=missing; }
  if [ "$rc" = 0 ]; then result=ok; else
    failed=1 result="FAILED (rc=$rc)"
    echo; echo "== molecule:$s FAILED (rc=$rc), last 200 lines of $logs/$s.log =="
    tail -n 200 "$logs/$s.log"
  fi
  table+=("$(printf '  %-28s %6ss  %s' "$s" "$secs" "$result")")
done
echo; echo "== molecule: scenario wall times ($jobs at a time) =="
printf '%s\n' "${table[@]}"
cat "$logs"/*.result >> "$times" 2>/dev/null   # the last line per scenario counts
exit $failed
