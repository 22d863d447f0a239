#!/usr/bin/env bash
# The fleet's status table (playbooks/status.yml), and nothing else on stdout:
#     bash scripts/fleet-status.sh [--json] [ansible-playbook options: -i inventories/prod, --limit ...]
# One row per instance (host, instance, URL, build, MTP, model, health, slots, tokens/s, acceptance, draft-n-max,
# declared); --json prints the rows as JSON instead. Changes nothing. Ansible's own output goes to stderr only when
# the playbook fails. Exit status: ansible-playbook's - 0 when the table was made, also with a host that could not
# be reached (its row says so; in JSON "reachable": false).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
format=table
args=()
for a in "$@"; do
  case "$a" in
    --json) format=json ;;
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) args+=("$a") ;;
  esac
done
out=$(mktemp) log=$(mktemp)
trap 'rm -f "$out" "$log"' EXIT
cd "$repo"
[ -x .venv/bin/ansible-playbook ] && PATH=$repo/.venv/bin:$PATH
ANSIBLE_CONFIG=${ANSIBLE_CONFIG:-$repo/ansible.cfg} ansible-playbook playbooks/status.yml \
  -e llamafleet_status_format="$format" -e llamafleet_status_dest="$out" "${args[@]}" > "$log" 2>&1
rc=$?
if [ -s "$out" ]; then cat "$out"; echo; else cat "$log" >&2; fi
[ $rc -ne 0 ] && [ -s "$out" ] && grep -E '^(fatal|ERROR)' "$log" >&2
exit $rc
