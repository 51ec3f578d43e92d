"""Device memory the framework holds outside PyTorch's allocator (CUDA context, NCCL, libraries).

Measured after the compute and collective benchmarks have loaded cuBLAS, the attention
kernels and NCCL: device memory in use minus what PyTorch's caching allocator reserved.
"""
from __future__ import annotations

import torch

from calibration.microbench.common import BenchContext, BenchItem, Skip, gather_objects


def bench_framework_reserved(ctx: BenchContext) -> dict:
    if not ctx.is_cuda:
        raise Skip("no device memory on the CPU path")
    torch.cuda.synchronize(ctx.device)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(ctx.device)
    reserved = torch.cuda.memory_reserved(ctx.device)
    mine = {"used_bytes": total - free, "torch_reserved_bytes": reserved,
            "framework_bytes": total - free - reserved, "total_bytes": total}
    ranks = gather_objects(ctx, mine)
    worst = max(r["framework_bytes"] for r in ranks)
    return {**mine, "framework_gib": worst / 2**30, "per_rank": ranks,
            "note": "largest over ranks; includes other processes on the GPU, if any (the preflight warns)"}


def items(ctx: BenchContext) -> list[BenchItem]:
    return [BenchItem("memory/framework_reserved", "memory", bench_framework_reserved, collective=True,
                      label="framework-reserved device memory")]
