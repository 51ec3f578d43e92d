"""The parameter refresh after a CPU optimizer step, done as DeepSpeed 0.19.8 does it, against threads.

After the CPU step the updated fp32 master parameters must reach the bf16 parameters:
- ZeRO-1/2 (stage_1_and_2.py `step`): the CPU casts the fp32 partition into a pinned bf16
  buffer, then a non-blocking pinned copy uploads it. The cast is measured here (`cast`); the
  upload is the pinned link curve of `hostlink`.
- ZeRO-3 and SuperOffload (stage3.py `_reassign_or_swap_out_partitioned_parameters`):
  `gpu_bf16.copy_(cpu_fp32)`. torch casts on the CPU into a new pageable tensor and copies that
  through the driver's staging buffers (`direct`). On the H200 hosts this ran at about 7 GB/s
  against about 50 GB/s pinned (step profiles of 2026-11-30): the cause of ZeRO-3 offload's
  under-predicted steps.
- ZeRO-3 with parameter offload: the bf16 partition stays on the host; only the cast is done.

The cast is memory-bound CPU work on the rank's threads, so both are measured at 1, 2, 4, ...
all cores. Only local rank 0 runs these. On the CPU path there is no device: `direct` is skipped.
"""
from __future__ import annotations

import statistics
import time

import torch

from calibration.microbench.common import BenchContext, BenchItem, Skip
from calibration.microbench.cpu import host_cores, ramp, thread_counts

REPEATS = 3


def refresh_params(quick: bool, cpu: bool) -> int:
    if cpu:
        return 2**22
    return 2**26 if quick else 2**28  # 256M params: 1 GiB of fp32 master, 0.5 GiB of bf16


def _median_s(call, sync) -> float:
    call()  # first touch and allocator warm-up
    sync()
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_refresh(ctx: BenchContext, path: str, threads: int) -> dict:
    """Seconds to refresh `n` parameters by `path` ("cast" or "direct") on `threads` threads."""
    if ctx.local_rank != 0:
        return {"ran": False}
    if path == "direct" and not ctx.is_cuda:
        raise Skip("no device on the CPU path: the direct upload needs one")
    n = refresh_params(ctx.sizes.quick, not ctx.is_cuda)
    master = ramp(n)  # filled on all the cores: on one thread that took longer than what is timed
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        if path == "cast":
            dst = torch.empty(n, dtype=torch.bfloat16, pin_memory=ctx.is_cuda)
        else:
            dst = torch.empty(n, dtype=torch.bfloat16, device=ctx.device)
        t = _median_s(lambda: dst.copy_(master), ctx.sync)
    finally:
        torch.set_num_threads(old_threads)
    return {"ran": True, "path": path, "params": n, "threads": threads, "time_s": t, "params_per_s": n / t}


def items(ctx: BenchContext) -> list[BenchItem]:
    return [BenchItem(f"cpu/refresh/{path}-threads-{t}", "param_refresh",
                      lambda c, path=path, t=t: bench_refresh(c, path, t),
                      label=f"parameter refresh ({path}), {t} thread{'s' * (t > 1)}")
            for path in ("cast", "direct") for t in thread_counts(host_cores())]
