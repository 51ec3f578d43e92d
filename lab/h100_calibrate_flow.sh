#!/usr/bin/env bash
# The new-cluster flow as a user runs it, on a lent one-H100 machine, each step timed:
#   calibrate            advisor calibrate --gpus 1 (real DeepSpeed steps inside), no --fill-from
#   flow:NAME:MODEL:SEQ:GLOBAL_BATCH  advisor recommend --validate 3 on the calibrated profile ("refit" in NAME adds --refit)
#   sweep:FILE:PROFILE   advisor validate --sweep FILE, each run predicted by PROFILE first (a shipped name or a path)
# State lives in /tmp/state on the machine (kept while it stays warm); every result is copied to $OUT.
#   bash lab/h100_calibrate_flow.sh BUDGET_S STEP [STEP ...]
set -u
budget=$1; shift
end=$(( $(date +%s) + budget ))
OUT=${OUT:-out}; STATE=/tmp/state; mkdir -p "$OUT" "$STATE"
source lab/device_setup.sh "$STATE/machine.txt" || exit 1
export TORCH_EXTENSIONS_DIR=$STATE/torch_extensions  # DeepSpeed's built ops, kept while the machine stays warm
# A fresh machine goes on from a calibration made on an earlier one: CALIBRATED=path/in/the/tree.json
[ -n "${CALIBRATED:-}" ] && [ ! -f "$STATE/h100-calibrated.json" ] && cp "$CALIBRATED" "$STATE/h100-calibrated.json" && touch "$STATE/calibrate.done"
left() { echo $(( end - $(date +%s) - 20 )); }
for step in "$@"; do
  [ "$(left)" -gt 45 ] || { echo "skipped $step: the budget is spent"; continue; }
  case $step in
    calibrate)
      [ -f "$STATE/calibrate.done" ] && continue
      start=$(date +%s)
      timeout "$(left)" python3 -m advisor.cli calibrate --gpus 1 --name h100 --out "$STATE/h100-calibrated.json" \
        >> "$STATE/calibrate.log" 2>&1
      rc=$?; echo "calibrate: rc $rc after $(( $(date +%s) - start )) s (this call)" | tee -a "$STATE/times.txt"
      grep -v "│" "$STATE/calibrate.log" | tail -n 30
      [ $rc -eq 0 ] && [ -f "$STATE/h100-calibrated.json" ] && touch "$STATE/calibrate.done" ;;
    flow:*)
      IFS=: read -r _ name model seq batch <<< "$step"
      [ -f "$STATE/$name.done" ] && continue
      refit=""; case $name in *refit*) refit="--refit";; esac
      start=$(date +%s)
      python3 -m advisor.cli recommend --model "$model" --seq "$seq" --global-batch "$batch" --profile "$STATE/h100-calibrated.json" \
        --validate 3 $refit --budget "$(left)" --store "$STATE/runs.db" --workdir "$STATE/runs" --json \
        > "$STATE/$name.json" 2> "$STATE/$name.log"
      rc=$?; echo "$name ($model $seq gb $batch $refit): rc $rc after $(( $(date +%s) - start )) s" | tee -a "$STATE/times.txt"
      tail -n 15 "$STATE/$name.log"
      [ $rc -eq 0 ] && touch "$STATE/$name.done" ;;
    sweep:*)
      spec=${step#sweep:}; sweep=${spec%%:*}; profile=${spec#*:}; name=$(basename "$sweep" .jsonl)
      [ -f "$STATE/$name.done" ] && continue
      start=$(date +%s)
      python3 -m advisor.cli validate --sweep "$sweep" --profile "$profile" --store "$STATE/runs.db" \
        --jsonl "$STATE/$name.runs.jsonl" --workdir "$STATE/$name" --budget "$(left)" --timeout 300 \
        --steps 3 --min-window-s 4 --precision 0 > "$STATE/$name.log" 2>&1
      rc=$?; echo "sweep $name: rc $rc after $(( $(date +%s) - start )) s" | tee -a "$STATE/times.txt"
      tail -n 25 "$STATE/$name.log"
      [ $rc -eq 0 ] && touch "$STATE/$name.done" ;;
  esac
done
for f in machine.txt times.txt calibrate.log h100-calibrated.json h100-calibrated.raw.jsonl runs.db; do
  [ -f "$STATE/$f" ] && cp "$STATE/$f" "$OUT/"
done
cp "$STATE"/flow*.json "$STATE"/flow*.log "$STATE"/h100-calibrated.refit-*.json "$STATE"/*.runs.jsonl "$STATE"/h100-x1-*.log "$OUT/" 2>/dev/null
[ -d "$STATE/runs" ] && { mkdir -p "$OUT/runs"; find "$STATE/runs" -name '*.json' -size -2M -exec cp --parents {} "$OUT/runs/" \; ; }
ls -la "$OUT"
