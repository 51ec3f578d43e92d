#!/usr/bin/env bash
# A new cluster as a user meets it, on a lent one-H100 machine: `advisor calibrate` with no --fill-from
# (the terms it cannot measure carried from the shipped h200, rescaled), then sweeps of real runs through
# `advisor validate`, each predicted by the profile named for it. State lives in /tmp/state and comes
# back as $OUT/state.tgz; carry it as .device_state/state.tgz and a fresh machine goes on from there
# (the built CPUAdam op included, so it is not compiled twice).
#   bash lab/h100_new_cluster.sh BUDGET_S STEP [STEP ...]
# Steps: calibrate; sweep:FILE:PROFILE (PROFILE a shipped name or a path; "calibrated" = the calibrated one).
set -u
budget=$1; shift
end=$(( $(date +%s) + budget ))
OUT=${OUT:-out}; STATE=/tmp/state; mkdir -p "$OUT" "$STATE"
[ -f .device_state/state.tgz ] && [ ! -e "$STATE/machine.txt" ] && tar xzf .device_state/state.tgz -C "$STATE"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 DS_SKIP_CUDA_CHECK=1 TORCH_CUDA_ARCH_LIST=9.0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_EXTENSIONS_DIR=$STATE/torch_extensions
[ -f "$STATE/machine.txt" ] || { date -u; nproc; lscpu | grep -E "Model name|Socket|NUMA node\(s\)"; free -g | head -2;
  nvidia-smi --query-gpu=name,driver_version,power.limit,temperature.gpu,power.draw --format=csv;
  python3 -c 'import torch, deepspeed, sys; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda); print("deepspeed", deepspeed.__version__)'; } > "$STATE/machine.txt" 2>&1
head -n 12 "$STATE/machine.txt"
left() { echo $(( end - $(date +%s) - 30 )); }
for step in "$@"; do
  [ "$(left)" -gt 45 ] || { echo "skipped $step: the budget is spent"; continue; }
  case $step in
    calibrate)
      [ -f "$STATE/calibrate.done" ] && continue
      start=$(date +%s)
      timeout "$(left)" python3 -m advisor.cli calibrate --gpus 1 --name h100 --out "$STATE/h100-calibrated.json" \
        > "$STATE/calibrate.log" 2>&1
      rc=$?; echo "calibrate: rc $rc after $(( $(date +%s) - start )) s (this call)" | tee -a "$STATE/calibrate.times"
      tail -n 8 "$STATE/calibrate.log"
      [ $rc -eq 0 ] && [ -f "$STATE/h100-calibrated.json" ] && touch "$STATE/calibrate.done" ;;
    sweep:*)
      spec=${step#sweep:}; sweep=${spec%%:*}; profile=${spec#*:}; name=$(basename "$sweep" .jsonl)
      [ "$profile" = calibrated ] && profile=$STATE/h100-calibrated.json
      start=$(date +%s)
      python3 -m advisor.cli validate --sweep "$sweep" --profile "$profile" --store "$STATE/runs.db" \
        --jsonl "$STATE/$name.runs.jsonl" --workdir "$STATE/$name" --budget "$(left)" --timeout 300 \
        ${VALIDATE_ARGS:-} 2>&1 | tail -n 25
      echo "sweep $name: $(( $(date +%s) - start )) s" | tee -a "$STATE/sweep.times" ;;
  esac
done
tar czf "$OUT/state.tgz" -C "$STATE" --exclude='*.db-wal' --exclude='*.db-shm' --exclude='*/ds_config*' . 2>/dev/null
cp "$STATE/machine.txt" "$OUT/"; ls -la "$OUT"
