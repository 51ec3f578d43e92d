#!/usr/bin/env bash
# One device call on a lent one-H200 machine (issue #12): where a host-bound step's spread between
# runs of one lease comes from. Each CPU's speed in rounds (lab/host_cpus.py), then the same two
# host-bound runs (data/sweeps/h200-x1-host-variance.jsonl) repeated unpinned, and pinned to the
# fastest and to the slowest CPU. State lives in /tmp/state, so a second call on the warm machine
# goes on from there; everything comes back as one archive.
#   bash lab/h200_host_variance.sh BUDGET_S STEP [STEP ...]
# Steps: cpus (3 rounds over every CPU), unpinned:N (the sweep's runs, repeat N), fast:N and slow:N
# (pinned with taskset to the fastest or slowest CPU of the cpus step, repeat N).
set -u
budget=$1; shift
end=$(( $(date +%s) + budget ))
OUT=${OUT:-out}; STATE=/tmp/state; mkdir -p "$OUT" "$STATE"
source "$(dirname "$0")/device_setup.sh" "$STATE/machine.txt" || exit 1
sweep=data/sweeps/h200-x1-host-variance.jsonl
left() { echo $(( end - $(date +%s) - 30 )); }
pick_cpu() {  # fastest or slowest CPU by its median issue time over the rounds
  python3 - "$1" "$STATE/cpus.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[2])]
by = {}
for r in rows:
    by.setdefault(r["cpu"], []).append(r["issue_us_per_layer"])
med = {c: statistics.median(v) for c, v in by.items()}
print((min if sys.argv[1] == "fast" else max)(med, key=med.get))
PY
}
run_sweep() {  # run_sweep NAME [taskset prefix...]
  name=$1; shift
  [ -f "$STATE/$name.done" ] && return
  "$@" python3 -m advisor.cli validate --sweep "$sweep" --profile h200 --store "$STATE/$name.db" \
    --jsonl "$STATE/$name.runs.jsonl" --workdir "$STATE/$name" --budget "$(left)" --timeout 120 --serial 2>&1 | tail -n 6 \
    && touch "$STATE/$name.done"
}
for step in "$@"; do
  [ "$(left)" -gt 45 ] || { echo "skipped $step: the budget is spent"; continue; }
  case $step in
    cpus)
      [ -s "$STATE/cpus.jsonl" ] || timeout "$(left)" python3 lab/host_cpus.py 3 > "$STATE/cpus.jsonl"
      wc -l "$STATE/cpus.jsonl" ;;
    unpinned:*) run_sweep "unpinned-${step#unpinned:}" ;;
    fast:*|slow:*)
      which=${step%%:*}; cpu=$(pick_cpu "$which"); echo "$which CPU: $cpu"
      run_sweep "$which-cpu$cpu-${step#*:}" taskset -c "$cpu" ;;
  esac
done
tar czf "$OUT/state.tgz" -C "$STATE" --exclude='*.db-wal' --exclude='*.db-shm' . 2>/dev/null
cp "$STATE/machine.txt" "$OUT/"
ls -la "$OUT"
