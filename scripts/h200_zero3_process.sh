#!/usr/bin/env bash
# One device call on a lent one-H200 machine (issue #12): is a host-bound ZeRO-3 step's speed the
# lease's or the process's? The sweep's settings run twice, each pass a process a setting with its own
# store (advisor validate skips what its store has), 10-s windows. The same checkpointed step ran 1.00-1.68
# times its uncheckpointed twin on four leases with no trace invalidation (2026-12-04).
#   bash scripts/h200_zero3_process.sh BUDGET_S [SWEEP]
set -u
budget=$1; sweep=${2:-data/sweeps/h200-x1-zero3-process.jsonl}
end=$(( $(date +%s) + budget ))
OUT=${OUT:-out}; mkdir -p "$OUT"
source "$(dirname "$0")/device_setup.sh" "$OUT/machine.txt" || exit 1
name=$(basename "$sweep" .jsonl)
for pass in 1 2; do
  left=$(( end - $(date +%s) - 20 ))
  [ "$left" -gt 60 ] || { echo "skipped pass $pass: the budget is spent"; continue; }
  python3 -m advisor.cli validate --sweep "$sweep" --profile h200 --store "$OUT/runs-$pass.db" --jsonl "$OUT/$name-$pass.runs.jsonl" \
    --workdir "/tmp/work-$pass" --budget "$left" --timeout 150 --serial --min-window-s 10 --precision 0 2>&1 | grep -E "^qwen|not run" | cut -c1-160
done
