#!/usr/bin/env bash
# One device call on a lent one-H200 machine (issue #12): does ZeRO-3's host work follow the host
# from lease to lease as the issue probe does? On shipped one-GPU runs the leases' mean residual of
# host-bound ZeRO-3 steps scattered by 0.08 in log and hardly followed that of their other host-bound
# steps (correlation 0.19, 26 leases, 2026-12-04). Each call: ZeRO-3's hooks timed pass by pass
# (calibration.microbench.zero3_hooks, at the runs' threads) before and after the sweep's real steps
# (advisor validate, one case a process, 20-s windows), so each lease gives both.
#   bash lab/h200_zero3_lease.sh BUDGET_S [SWEEP]
set -u
budget=$1; sweep=${2:-data/sweeps/h200-x1-zero3-lease.jsonl}
end=$(( $(date +%s) + budget ))
OUT=${OUT:-out}; mkdir -p "$OUT"
source "$(dirname "$0")/device_setup.sh" "$OUT/machine.txt" || exit 1
threads=$(nproc)
left() { echo $(( end - $(date +%s) - 20 )); }
hooks() {
  [ "$(left)" -gt 60 ] || { echo "skipped hooks $1: the budget is spent"; return; }
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$(( 29500 + RANDOM % 1000 )) \
    OMP_NUM_THREADS=$threads timeout "$(left)" python3 -m calibration.microbench.zero3_hooks qwen2.5-1.5b 2>/dev/null \
    | tail -n 1 > "$OUT/hooks-$1.json"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('hooks $1:', {k: round(v*1e6,1) for k,v in d.items() if k.endswith('_s_per_layer')})" "$OUT/hooks-$1.json"
}
hooks before
python3 -m advisor.cli validate --sweep "$sweep" --profile h200 --store "$OUT/runs.db" \
  --jsonl "$OUT/$(basename "$sweep" .jsonl).runs.jsonl" --workdir /tmp/work --budget "$(( $(left) - 90 ))" --timeout 200 --serial 2>&1 | tail -n 12
hooks after
