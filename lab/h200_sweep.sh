#!/usr/bin/env bash
# One device call on a lent H200 machine: install the carried wheels, record the machine,
# then calibrate and/or run a validation sweep, leaving everything under $OUT.
#   bash lab/h200_sweep.sh calibrate|sweep SWEEP.jsonl BUDGET_S [PROFILE]
# Needs the wheelhouse in .whl/ (advisor wheelhouse --out .whl --python-version 3.12).
set -u
mode=$1; shift
OUT=${OUT:-out}; mkdir -p "$OUT"
source "$(dirname "$0")/device_setup.sh" "$OUT/machine.txt" || exit 1
case $mode in
  calibrate)
    budget=$1
    timeout "$budget" python3 -m advisor.cli calibrate --gpus "$gpus" --name h200 --out "$OUT/h200.json" 2>&1 | tail -n 80
    ;;
  sweep)
    sweep=$1; budget=$2; profile=${3:-h200}
    python3 -m advisor.cli validate --sweep "$sweep" --profile "$profile" --store /tmp/runs.db \
      --jsonl "$OUT/runs.jsonl" --workdir /tmp/vruns --budget "$budget" --timeout 240 2>&1 | tail -n 120
    tar czf "$OUT/logs.tgz" -C /tmp vruns 2>/dev/null
    ;;
esac
