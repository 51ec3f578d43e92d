"""Collectives: all-reduce, all-gather, reduce-scatter and all-to-all by size and group size.

Conventions follow nccl-tests: `bytes` is the full (gathered / reduced) tensor, and for
all-to-all the buffer each rank sends. Groups are blocks of consecutive ranks inside a
node (all blocks run at once, as data-parallel groups do), and across nodes the whole
world. The time of one size is the slowest rank's median per-call time.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from calibration.fitting import COLLECTIVE_OPS, bus_bandwidth
from calibration.microbench.common import BenchContext, BenchItem, all_ranks_max, time_per_call

_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def message_sizes(quick: bool, cpu: bool) -> list[int]:
    if cpu:
        return [2**12, 2**16, 2**20]
    if quick:
        return [2**16, 2**20, 2**24, 2**28]
    return [2**15, 2**17, 2**19, 2**21, 2**23, 2**25, 2**27, 2**29]


def group_plan(ctx: BenchContext) -> list[tuple[str, int]]:
    """[(scope, group size)]: the whole node, smaller powers of two in full mode, all nodes; none on
    one GPU, whose group of one times a local copy, not a link (it once wrote 28 TB/s as NVLink's)."""
    local = ctx.local_world_size
    if ctx.world_size == 1:
        return []
    sizes = {local}
    if not ctx.sizes.quick:
        g = 2
        while g < local:
            sizes.add(g)
            g *= 2
    plan = [("intra", g) for g in sorted(sizes)]
    if ctx.nnodes > 1:
        plan.append(("inter", ctx.world_size))
    return plan


def get_group(ctx: BenchContext, scope: str, size: int):
    """This rank's process group for (scope, size); every rank creates every group once."""
    key = (scope, size)
    if key not in ctx.groups:
        if size == ctx.world_size:
            ctx.groups[key] = None  # the default group
        else:
            mine = None
            for start in range(0, ctx.world_size, size):
                ranks = list(range(start, start + size))
                g = dist.new_group(ranks)
                if ctx.rank in ranks:
                    mine = g
            ctx.groups[key] = mine
    return ctx.groups[key]


def _dtype(ctx: BenchContext) -> torch.dtype:
    return torch.bfloat16 if ctx.backend == "nccl" else torch.float32


def make_call(ctx: BenchContext, op: str, nbytes: int, n: int, group):
    """A zero-argument function that runs one collective of `nbytes` (full tensor)."""
    dt = _dtype(ctx)
    elems = max(n, nbytes // torch.tensor([], dtype=dt).element_size())
    elems -= elems % n
    full = torch.ones(elems, dtype=dt, device=ctx.device)
    shard = torch.ones(elems // n, dtype=dt, device=ctx.device)
    if op == "all_reduce":
        return lambda: dist.all_reduce(full, group=group)
    if op == "all_gather":
        return lambda: _all_gather(full, shard, group=group)
    if op == "reduce_scatter":
        return lambda: _reduce_scatter(shard, full, group=group)
    if op == "all_to_all":
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full, group=group)
    raise ValueError(f"unknown collective {op}")


def bench_collective(ctx: BenchContext, op: str, scope: str, size: int, nbytes: int) -> dict:
    group = get_group(ctx, scope, size)
    call = make_call(ctx, op, nbytes, size, group)
    dist.barrier()
    t = time_per_call(ctx, call, warmup=3, max_calls=2000, agree=lambda v: all_ranks_max(ctx, v))  # slowest rank
    return {"op": op, "scope": scope, "group_size": size, "bytes": nbytes, "time_s": t,
            "algbw_bytes_per_s": nbytes / t, "busbw_bytes_per_s": bus_bandwidth(op, size, nbytes, t),
            "backend": ctx.backend, "dtype": str(_dtype(ctx)).replace("torch.", "")}


def items(ctx: BenchContext) -> list[BenchItem]:
    out = []
    for scope, size in group_plan(ctx):
        for op in COLLECTIVE_OPS:
            for nbytes in message_sizes(ctx.sizes.quick, not ctx.is_cuda):
                out.append(BenchItem(
                    f"collective/{op}/{scope}/g{size}/{nbytes}B", "collective",
                    lambda c, op=op, scope=scope, size=size, nbytes=nbytes: bench_collective(c, op, scope, size, nbytes),
                    collective=True, label=f"{op} {scope} n={size} {nbytes >> 10} KiB"))
    return out
