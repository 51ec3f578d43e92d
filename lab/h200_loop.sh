#!/usr/bin/env bash
# One device call on a lent 2x H200 machine (issues #12 and #13): the CPU optimizer against its
# thread count, sweeps of real runs (predicted first, the predictions committed before the call),
# and closed loops (recommend --validate), each step under the call's budget. State lives in
# /tmp/state, so a second call on the warm machine goes on from there; everything comes back as
# one archive.
#   bash lab/h200_loop.sh BUDGET_S STEP [STEP ...]
# Steps: threads (calibrate CPUAdam at 1..all threads), attention (SDPA at every head dim, for
# `python -m calibration.merge STATE/h200-attention.raw.jsonl --into h200`), layers
# (the decoder layers' elementwise kernels, Qwen3's also without their q/k norms and with sandwich norms), refresh (the parameter refresh after a CPU
# step at 1..all threads), sweep:FILE (advisor validate; FILE's runs are
# traced for memory when its name has "memory", profiled one after another, ADVISOR_STEP_PROFILE,
# when it has "structure", and timed pass by pass one after another, ADVISOR_PHASE_TRACE, when it has
# "phases"; VALIDATE_ARGS are passed on, e.g. "--steps 8 --min-window-s 4"), loop:NAME (recommend --validate with the arguments in
# data/sweeps/NAME.args, one per line).
# calibrate (every benchmark family on this node, the profile's constants it cannot measure filled
# from it: STATE/PROFILE-calibrated.json and its raw file, for the first measured profile of a new kind).
# PROFILE (default h200) names the shipped profile the steps fill from and the sweeps are predicted with:
# PROFILE=h100 on a lent H100 (the shipped `h100`, derived from h200 until one is measured).
# A machine that went back between calls loses /tmp/state: carry the last call's archive as
# .device_state/state.tgz and the runs it holds are not made again.
set -u
PROFILE=${PROFILE:-h200}
budget=$1; shift
end=$(( $(date +%s) + budget ))
OUT=${OUT:-out}; STATE=/tmp/state; mkdir -p "$OUT" "$STATE"
[ -f .device_state/state.tgz ] && [ ! -e "$STATE/machine.txt" ] && tar xzf .device_state/state.tgz -C "$STATE"
source "$(dirname "$0")/device_setup.sh" "$STATE/machine.txt" || exit 1
left() { echo $(( end - $(date +%s) - 40 )); }
for step in "$@"; do
  [ "$(left)" -gt 60 ] || { echo "skipped $step: the budget is spent"; continue; }
  case $step in
    calibrate)
      [ -f "$STATE/calibrate.done" ] && continue
      timeout "$(left)" python3 -m advisor.cli calibrate --gpus 1 --name "$PROFILE" \
        --fill-from "$PROFILE" --out "$STATE/$PROFILE-calibrated.json" 2>&1 | tail -n 30 \
        && [ -f "$STATE/$PROFILE-calibrated.json" ] && touch "$STATE/calibrate.done" ;;
    threads)
      [ -f "$STATE/threads.done" ] && continue
      timeout "$(left)" python3 -m advisor.cli calibrate --gpus 1 --name "$PROFILE" --only cpu_adam --only cpu_adam_threads \
        --fill-from "$PROFILE" --out "$STATE/$PROFILE-threads.json" 2>&1 | tail -n 12 \
        && [ -f "$STATE/$PROFILE-threads.json" ] && touch "$STATE/threads.done" ;;
    attention)
      [ -f "$STATE/attention.done" ] && continue
      timeout "$(left)" python3 -m advisor.cli calibrate --gpus 1 --name "$PROFILE" --only attention \
        --fill-from "$PROFILE" --out "$STATE/$PROFILE-attention.json" 2>&1 | grep -i "SDPA\|attention" | tail -n 30 \
        && [ -f "$STATE/$PROFILE-attention.raw.jsonl" ] && touch "$STATE/attention.done" ;;
    layers)
      [ -f "$STATE/layers.done" ] && continue
      timeout "$(left)" python3 -m advisor.cli calibrate --gpus 1 --name "$PROFILE" --only layer_elementwise \
        --fill-from "$PROFILE" --out "$STATE/$PROFILE-layers.json" 2>&1 | grep -i "layer" | tail -n 30 \
        && [ -f "$STATE/$PROFILE-layers.raw.jsonl" ] && touch "$STATE/layers.done" ;;
    refresh)
      [ -f "$STATE/refresh.done" ] && continue
      timeout "$(left)" python3 -m advisor.cli calibrate --gpus 1 --name "$PROFILE" --only param_refresh \
        --fill-from "$PROFILE" --out "$STATE/$PROFILE-refresh.json" 2>&1 | grep -i "refresh" | tail -n 14 \
        && [ -f "$STATE/$PROFILE-refresh.raw.jsonl" ] && touch "$STATE/refresh.done" ;;
    sweep:*)
      sweep=${step#sweep:}; name=$(basename "$sweep" .jsonl)
      trace=0; profile=0; phases=0; order=--parallel
      case $name in *memory*) trace=1 ;; esac
      case $name in *structure*) profile=1; order=--serial ;; esac
      case $name in *phases*) phases=1; order=--serial ;; esac
      ADVISOR_MEMORY_TRACE=$trace ADVISOR_STEP_PROFILE=$profile ADVISOR_PHASE_TRACE=$phases python3 -m advisor.cli validate --sweep "$sweep" \
        --profile "$PROFILE" --store "$STATE/runs.db" --jsonl "$STATE/$name.runs.jsonl" --workdir "$STATE/$name" \
        --budget "$(left)" --timeout 300 $order ${VALIDATE_ARGS:-} 2>&1 | tail -n 30 ;;
    loop:*)
      name=${step#loop:}
      mapfile -t args < "data/sweeps/$name.args"
      python3 -m advisor.cli recommend "${args[@]}" --profile "$PROFILE" --store "$STATE/runs.db" \
        --workdir "$STATE/$name" --budget "$(left)" --json > "$STATE/$name.json" 2> "$STATE/$name.log"
      tail -n 12 "$STATE/$name.log" ;;
  esac
done
find "$STATE" -name 'memory_trace*.json' | while read -r f; do
  rank=$(basename "$f" .json); rank=${rank#memory_trace}
  cp "$f" "$STATE/trace-$(basename "$(dirname "$f")")$rank.json"
done
find "$STATE" -name step_profile.json | while read -r f; do cp "$f" "$STATE/profile-$(basename "$(dirname "$f")").json"; done
find "$STATE" -name phase_trace.json | while read -r f; do cp "$f" "$STATE/phases-$(basename "$(dirname "$f")").json"; done
tar czf "$OUT/state.tgz" -C "$STATE" --exclude='*.db-wal' --exclude='*.db-shm' . 2>/dev/null
cp "$STATE/machine.txt" "$OUT/"
ls -la "$OUT"
