"""Host memory of the model states a rank offloads to the CPU, as DeepSpeed 0.19 allocates them.

Pinned buffers come from torch's CachingHostAllocator, which rounds every request up to the next
power of two (ATen/core/CachingHostAllocator.h, `PowerOf2Ceil`; the default threshold rounds all
sizes). Pinned pages stay resident, so a 5.75 GiB fp32 partition holds 8 GiB of host memory. Counting
bytes without the rounding (and without ZeRO-1/2's pinned bf16 buffers) under-predicted the peak
resident memory of all 48 ZeRO-1/2 offload runs measured on one, two and four H200s by 16-40%
(`benchmarks/host_memory_accuracy.py`).

- ZeRO-1/2 (`stage_1_and_2.py`, `pin_memory` on) pins the fp32 master partition, its fp32 gradient,
  a bf16 copy of the partition (`param_buffer_of_bit16_for_cpu_offload_groups`) and a bf16 buffer of
  the largest parameter (`temp_grad_buffer_for_cpu_offload`). With gradient accumulation ZeRO-2 pins
  one bf16 buffer per parameter (`accumulated_grads_in_cpu`); ZeRO-1 carries the gradients on the
  GPU to the boundary (a held-out ZeRO-1 run at two micro-steps held 1.5 GiB less than those
  buffers). Adam's two moments are plain CPU tensors (`cpu_adam.py`, `zeros_like`).
- ZeRO-3 (`stage3.py`) keeps the fp32 master plain and pins each sub-group's fp32 gradient and the
  bf16 gradient partitions (`grad_partitions_flat_buffer`). After each sub-group's step its fp32
  partition is copied into the bf16 one on the GPU, and ATen's `copy_` converts on the source when
  the devices and the dtypes both differ: the host holds a bf16 copy of one sub-group meanwhile. That
  was the 1.8 GiB a rank (0.9 for qwen2.5-0.5b, whose one sub-group is half as large) that every
  ZeRO-3 offload run held beyond the count, whatever the model's size.
- ZeRO-3 parameter offload pins the bf16 parameter partition (`param_groups_fp16_flat_cpu_memory`),
  into which it copies the pinned partition `zero.Init` made for each parameter; those blocks, freed,
  stay in torch's pinned-memory cache. Each fp32 partition is then cast straight into it: no extra copy.
- SuperOffload hands each sub-group's fp32 parameters and gradients to its CPU-Adam worker, a spawned
  process, through a torch multiprocessing queue. Pickling a CPU tensor moves its storage into shared
  memory: a new shared segment, the data copied, the storages swapped (`reduce_storage`,
  `_share_fd_cpu_`). The plain fp32 master is freed back to the OS; the pinned fp32 gradient goes back
  to torch's pinned-memory cache and stays resident. So the gradients are held twice, pinned and
  shared. The worker also pins its own fp32 buffer for the largest sub-group (`max_grad_numel`).
  The harness's usual figure sums each process's resident peak and so counts every shared page in
  both processes (SuperOffload runs measured 22-33% above this count by it); the tree's proportional
  set size counts it once (`calibration/harness/shared_host_memory.py`). Against that, before the
  shared gradients and the buffer's rounding were counted, three runs (one H200, 2026-12-02) were
  14.5-15.4% under; the worker process's own runtime (about 0.4-0.5 GiB) is still not counted.
"""
from __future__ import annotations

import numpy as np

from models.flops import BF16, FP32
from models.layout import SUB_GROUP_SIZE, Layout
from models.params import ParamCounts

ADAM_MOMENTS_BYTES_PER_PARAM = 2 * FP32


def pinned_bytes(requested) -> np.ndarray:
    """Host bytes torch's pinned-memory allocator holds for a request: the next power of two."""
    requested = np.asarray(requested, dtype=float)
    safe = np.maximum(requested, 1.0)
    return np.where(requested > 0, np.exp2(np.ceil(np.log2(safe))), 0.0)


def _pinned_bf16_each(numels, split_over) -> np.ndarray:
    """What pinning one bf16 buffer per tensor holds, each tensor split over `split_over` ranks (an
    array, one entry a strategy): the sum over tensors of `pinned_bytes`. Vectorised over the tensors
    and computed once per distinct rank count: the fit predicts every run hundreds of times."""
    numels = np.asarray(numels, dtype=float)
    split_over = np.asarray(split_over)
    per_split = {n: float(pinned_bytes(BF16 * numels / n).sum()) for n in np.unique(split_over).tolist()}
    return np.vectorize(per_split.get, otypes=[float])(split_over)


def offloaded_host_bytes(counts: ParamCounts, lay: Layout, grad_accum, super_offload) -> np.ndarray:
    """Host bytes per rank of the offloaded optimizer states, gradients and parameters (module docstring)."""
    p_rank = lay.trainable_per_rank
    offloaded = lay.offload_fraction * p_rank
    z12 = lay.optimizer_offload & ~lay.z3
    z3 = lay.optimizer_offload & lay.z3
    moments = ADAM_MOMENTS_BYTES_PER_PARAM * offloaded

    accumulating = (np.asarray(grad_accum) > 1) & (lay.zero_stage == 2)  # ZeRO-1 accumulates on the GPU
    frozen_or_vision = float(counts.trainable - sum(counts.decoder_tensors))
    # One buffer per parameter whose gradient this rank accumulates: about 1/n of them.
    per_tensor = (_pinned_bf16_each(counts.decoder_tensors, np.ones_like(lay.gpus)) + BF16 * frozen_or_vision) / lay.gpus
    z12_bytes = (2 * pinned_bytes(FP32 * offloaded) + moments + pinned_bytes(BF16 * offloaded)
                 + pinned_bytes(BF16 * float(counts.largest_module)) + np.where(accumulating, per_tensor, 0.0))

    full_groups = np.floor(offloaded / SUB_GROUP_SIZE)
    last_group = offloaded - full_groups * SUB_GROUP_SIZE
    fp32_grads = full_groups * pinned_bytes(FP32 * SUB_GROUP_SIZE) + pinned_bytes(FP32 * last_group)
    # After each sub-group's CPU step its fp32 partition is copied into the bf16 one on the GPU; a copy
    # across devices that also changes dtype converts on the source first (ATen's copy_), so the host
    # holds a bf16 copy of one sub-group meanwhile. With parameter offload the target is on the host.
    to_gpu_cast = np.where(lay.param_offload, 0.0, BF16 * np.minimum(offloaded, SUB_GROUP_SIZE))
    z3_bytes = FP32 * offloaded + fp32_grads + moments + pinned_bytes(BF16 * p_rank) + to_gpu_cast
    # SuperOffload: the gradients moved to shared memory for the worker (their pinned blocks stay
    # cached), and the worker's pinned buffer for the largest sub-group.
    super_offload_copies = np.where(np.asarray(super_offload, dtype=bool),
                                    FP32 * offloaded + pinned_bytes(FP32 * np.minimum(offloaded, SUB_GROUP_SIZE)), 0.0)
    z3_bytes = z3_bytes + super_offload_copies

    # Parameter offload: zero.Init pins each parameter's partition on its own (partition_parameters.py),
    # then stage3.py copies them all into one pinned flat buffer; the freed blocks stay in torch's
    # pinned-memory cache, resident.
    each_partition = (_pinned_bf16_each(counts.decoder_tensors, lay.gpus)
                      + BF16 * (frozen_or_vision + counts.frozen) / lay.gpus)
    flat = pinned_bytes(BF16 * (counts.trainable + counts.frozen) / lay.gpus)
    params = np.where(lay.param_offload, flat + each_partition, 0.0)
    return np.where(z12, z12_bytes, 0.0) + np.where(z3, z3_bytes, 0.0) + params
