"""Host link: pinned host-to-device and device-to-host copies, one way and both at once.

This is PCIe on x86 hosts and NVLink-C2C on GH200; ZeRO-Offload moves gradients down
and parameters up over it every step. On the CPU path there is no device link: the copy
is host to host, recorded as such, and the profile marks the curves as placeholders.
"""
from __future__ import annotations

import torch

from calibration.microbench.common import BenchContext, BenchItem, time_per_call


def link_sizes(quick: bool, cpu: bool) -> list[int]:
    if cpu:
        return [2**16, 2**20, 2**24]
    if quick:
        return [2**20, 2**24, 2**28]
    return [2**16, 2**18, 2**20, 2**22, 2**24, 2**26, 2**28, 2**30]


def _buffers(ctx: BenchContext, nbytes: int):
    n = nbytes // 2
    pinned = ctx.is_cuda  # pinning needs a CUDA runtime
    host = torch.empty(n, dtype=torch.bfloat16, pin_memory=pinned).fill_(1.0)
    dev = torch.empty(n, dtype=torch.bfloat16, device=ctx.device)
    return host, dev


def bench_one_way(ctx: BenchContext, nbytes: int, direction: str) -> dict:
    host, dev = _buffers(ctx, nbytes)
    if direction == "h2d":
        t = time_per_call(ctx, lambda: dev.copy_(host, non_blocking=True))
    else:
        t = time_per_call(ctx, lambda: host.copy_(dev, non_blocking=True))
    return {"direction": direction, "bytes": nbytes, "pinned": ctx.is_cuda, "time_s": t, "bytes_per_s": nbytes / t}


def bench_both_ways(ctx: BenchContext, nbytes: int) -> dict:
    """H2D and D2H at once on two streams, launched in interleaved chunks."""
    if not ctx.is_cuda:
        from calibration.microbench.common import Skip

        raise Skip("no device link on the CPU path")
    up_host, up_dev = _buffers(ctx, nbytes)
    down_host, down_dev = _buffers(ctx, nbytes)
    s_up, s_down = torch.cuda.Stream(ctx.device), torch.cuda.Stream(ctx.device)
    alone = time_per_call(ctx, lambda: up_dev.copy_(up_host, non_blocking=True))
    reps = max(2, min(2000, int(0.2 / alone)))
    start = torch.cuda.Event(enable_timing=True)
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ctx.sync()
    start.record()
    for s in (s_up, s_down):
        s.wait_event(start)
    for _ in range(reps):
        with torch.cuda.stream(s_up):
            up_dev.copy_(up_host, non_blocking=True)
        with torch.cuda.stream(s_down):
            down_host.copy_(down_dev, non_blocking=True)
    ends[0].record(s_up)
    ends[1].record(s_down)
    ctx.sync()
    t_up, t_down = (start.elapsed_time(e) / 1000.0 for e in ends)
    return {"bytes": nbytes, "reps": reps, "h2d_time_s": t_up / reps, "d2h_time_s": t_down / reps,
            "h2d_bytes_per_s": nbytes * reps / t_up, "d2h_bytes_per_s": nbytes * reps / t_down}


def items(ctx: BenchContext) -> list[BenchItem]:
    out = []
    for n in link_sizes(ctx.sizes.quick, not ctx.is_cuda):
        for d in ("h2d", "d2h"):
            out.append(BenchItem(f"hostlink/{d}/{n}B", "hostlink", lambda c, n=n, d=d: bench_one_way(c, n, d),
                                 label=f"{d.upper()} {n >> 10} KiB"))
        if ctx.is_cuda:
            out.append(BenchItem(f"hostlink/both/{n}B", "hostlink_both", lambda c, n=n: bench_both_ways(c, n),
                                 label=f"H2D+D2H at once {n >> 10} KiB"))
    return out
