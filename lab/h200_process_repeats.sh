#!/usr/bin/env bash
# One device call on a lent one-H200 machine (issue #12): the same settings measured again in new
# processes on one lease. Each pass runs the sweep's settings, a process a setting, with its own store
# (advisor validate skips what its store has), 10-s windows with the host probed within them. First
# used for ZeRO-3 (is a host-bound step's speed the lease's or the process's? the same checkpointed step
# ran 1.00-1.68 times its uncheckpointed twin on four leases, 2026-12-04); then for whether a step set
# at the host its window's probes read repeats closer than its raw time (benchmarks/repeat_scatter.py).
#   bash lab/h200_process_repeats.sh BUDGET_S SWEEP [PASSES]
set -u
[ $# -ge 2 ] || { echo "usage: bash lab/h200_process_repeats.sh BUDGET_S SWEEP [PASSES]" >&2; exit 2; }
budget=$1; sweep=$2; passes=${3:-2}
end=$(( $(date +%s) + budget ))
OUT=${OUT:-out}; mkdir -p "$OUT"
source "$(dirname "$0")/device_setup.sh" "$OUT/machine.txt" || exit 1
name=$(basename "$sweep" .jsonl)
for pass in $(seq 1 "$passes"); do
  left=$(( end - $(date +%s) - 20 ))
  [ "$left" -gt 60 ] || { echo "skipped pass $pass: the budget is spent"; continue; }
  python3 -m advisor.cli validate --sweep "$sweep" --profile h200 --store "$OUT/runs-$pass.db" --jsonl "$OUT/$name-$pass.runs.jsonl" \
    --workdir "/tmp/work-$pass" --budget "$left" --timeout 150 --serial --min-window-s 10 --precision 0 2>&1 \
    | grep -E "window-repeats|zero3 process|not run" | grep -v "repeats to about" | cut -c1-160
done
