#!/usr/bin/env bash
# One device call on a lent one-H200 machine (issue #12): the host probe taken again and again beside
# host-bound steps (lab/probe_drift.py), one case a process, at all the host's cores as the
# shipped runs were. Each case's blocks are written under $OUT as they finish.
#   [PROBE_DRIFT_ARGS='--meter' or '--pin-cycle 5'] bash lab/h200_probe_drift.sh BUDGET_S MODEL:SEQ:ZERO_STAGE:CHECKPOINT_EVERY:SECONDS ...
set -u
budget=$1; shift
end=$(( $(date +%s) + budget ))
OUT=${OUT:-out}; mkdir -p "$OUT"
source "$(dirname "$0")/device_setup.sh" "$OUT/machine.txt" || exit 1
threads=$(nproc)
for case in "$@"; do
  IFS=: read -r model seq stage every seconds <<< "$case"
  left=$(( end - $(date +%s) - 20 ))
  [ "$left" -gt 60 ] || { echo "skipped $case: the budget is spent"; continue; }
  name="probe-drift-$model-$seq-z$stage-c$every"
  n=2; base=$name; while [ -e "$OUT/$name.jsonl" ]; do name="$base-$n"; n=$((n + 1)); done  # a case again: its own process, its own file
  OMP_NUM_THREADS=$threads timeout "$left" python3 lab/probe_drift.py --model "$model" --seq "$seq" \
    --zero-stage "$stage" --checkpoint-every "$every" --seconds "$seconds" ${PROBE_DRIFT_ARGS:-} --out "$OUT/$name.jsonl" 2>&1 | grep -v Warning | tail -n 2
  python3 lab/probe_drift.py --summary "$OUT/$name.jsonl"
done
