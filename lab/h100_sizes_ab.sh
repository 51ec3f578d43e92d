#!/usr/bin/env bash
# After lab/h100_calibrate_flow.sh's calibrate on the same warm machine: the families that time batches or
# energy windows measured again, at the old sizes (five batches, 3-s windows) and at the ones tried (three, 2 s),
# each resumed from that calibration's raw file (lab/calibration_sizes_ab.py), so that the two profiles
# differ only in those families. Then the flow's other steps with what is left of the budget.
#   bash lab/h100_sizes_ab.sh BUDGET_S [FLOW_STEP ...]
set -u
budget=$1; shift
end=$(( $(date +%s) + budget ))
OUT=${OUT:-out}; STATE=/tmp/state; mkdir -p "$OUT"
source lab/device_setup.sh "$OUT/machine-ab.txt" || exit 1
export TORCH_EXTENSIONS_DIR=$STATE/torch_extensions
src=$STATE/h100-calibrated.raw.jsonl
[ -f "$src" ] || { echo "no calibration on this machine (it was given back): nothing to compare with"; exit 3; }
families="--family gemm --family attention --family hbm --family hostlink --family hostlink_both --family overlap --family power --family wait_decay"
for variant in old:5:3 new:3:2; do
  IFS=: read -r name batches window <<< "$variant"
  start=$(date +%s)
  python3 lab/calibration_sizes_ab.py "$src" "$OUT/ab-$name.json" --batches "$batches" --power-window-s "$window" \
    $families > "$OUT/ab-$name.log" 2>&1
  echo "ab-$name (batches $batches, window $window s): rc $? after $(( $(date +%s) - start )) s" | tee -a "$OUT/ab-times.txt"
done
left=$(( end - $(date +%s) ))
[ $# -gt 0 ] && [ "$left" -gt 60 ] && bash lab/h100_calibrate_flow.sh "$left" "$@"
