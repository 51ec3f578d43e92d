#!/usr/bin/env bash
# One device call on a lent 4-GPU H200 node (issue #6), resumable across calls while the machine
# stays warm: state lives in /tmp/state and is copied to $OUT at the end of every call.
#   bash lab/h200_x4_sweep.sh BUDGET_S SWEEP.jsonl [SWEEP.jsonl ...]
# 1. collectives and overlap at group sizes 2 and 4 (once), 2. each sweep in turn, same budget.
set -u
budget=$1; shift
end=$(( $(date +%s) + budget ))
OUT=${OUT:-out}; STATE=/tmp/state; mkdir -p "$OUT" "$STATE"
source "$(dirname "$0")/device_setup.sh" "$OUT/machine.txt" || exit 1
if [ ! -f "$STATE/collectives.done" ]; then
  timeout $(( end - $(date +%s) - 30 )) python3 -m advisor.cli calibrate --gpus "$gpus" --name h200 \
    --only collective --only overlap --fill-from h200 --out "$STATE/h200-x$gpus-collectives.json" 2>&1 | tail -n 40 \
    && [ -f "$STATE/h200-x$gpus-collectives.json" ] && touch "$STATE/collectives.done"
fi
for sweep in "$@"; do
  left=$(( end - $(date +%s) - 25 )); [ "$left" -gt 60 ] || break
  name=$(basename "$sweep" .jsonl)
  python3 -m advisor.cli validate --sweep "$sweep" --profile h200 --store "$STATE/runs.db" \
    --jsonl "$STATE/$name.runs.jsonl" --workdir "$STATE/vruns" --budget "$left" --timeout 240 2>&1 | tail -n 60
done
cp "$STATE"/*.json "$STATE"/*.jsonl "$OUT"/ 2>/dev/null
tar czf "$OUT/logs.tgz" -C "$STATE" vruns 2>/dev/null
ls -la "$OUT"
