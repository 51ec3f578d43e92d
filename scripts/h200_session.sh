#!/usr/bin/env bash
# One device call on a lent H200 machine: install the carried wheels, record the machine,
# then calibrate and/or run a validation sweep, leaving everything under $OUT.
#   bash scripts/h200_session.sh calibrate|sweep SWEEP.jsonl BUDGET_S [PROFILE]
# Needs the wheelhouse in .whl/ (advisor wheelhouse --out .whl --python-version 3.12).
set -u
mode=$1; shift
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DS_SKIP_CUDA_CHECK=1 TORCH_CUDA_ARCH_LIST=9.0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-out}; mkdir -p "$OUT"
{ date -u; nproc; nvidia-smi --query-gpu=name,driver_version,power.limit,temperature.gpu,power.draw --format=csv; nvidia-smi topo -m;
  python3 -c 'import torch, deepspeed, sys; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count()); print("deepspeed", deepspeed.__version__)'; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
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
