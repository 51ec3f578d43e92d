# Sourced by the device scripts of lab/: install the carried wheels (.whl/, from
# `advisor wheelhouse`), set the environment every run needs, record the machine in the file
# named by $1 (provenance for the runs) and set $gpus.
#   source lab/device_setup.sh MACHINE_TXT || exit 1
# The working tree comes first on the path: the carried wheels may hold an older build of this project.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 DS_SKIP_CUDA_CHECK=1 TORCH_CUDA_ARCH_LIST=9.0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{ date -u; nproc; lscpu | grep -E "Model name|Socket|NUMA node\(s\)|Thread|BogoMIPS|^Model:|CPU family|Stepping|cache|Flags"; free -g | head -2; nvidia-smi --query-gpu=name,driver_version,power.limit,temperature.gpu,power.draw --format=csv; nvidia-smi topo -m;
  python3 -c 'import torch, deepspeed, sys; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count()); print("deepspeed", deepspeed.__version__); print("torch threads", torch.get_num_threads())'; } > "$1" 2>&1
head -n 4 "$1"
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
