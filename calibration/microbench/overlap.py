"""Overlap: a bf16 GEMM stream beside an all-gather, an all-to-all, or a pinned host copy.

Each stream's slowdown is its time when concurrent over its time alone, minus one. The
two streams' work is launched in interleaved chunks: enqueueing thousands of kernels on
one stream first fills the launch queue, and then the streams barely overlap. Each run
lasts a power window, so GPU power alone and overlapped comes with it. On the CPU path
the two streams are two threads.
"""
from __future__ import annotations

import math
import threading
import time

import torch
import torch.distributed as dist

from calibration.microbench.collectives import make_call
from calibration.microbench.common import BenchContext, BenchItem, Skip, all_ranks_max, gather_objects, time_per_call

PARTNER_BYTES_GPU = 256 * 2**20
PARTNER_BYTES_CPU = 2**20


def gemm_call(ctx: BenchContext):
    n = 8192 if ctx.is_cuda else 256
    a = torch.randn(n, n, dtype=torch.bfloat16, device=ctx.device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=ctx.device)
    out = torch.empty(n, n, dtype=torch.bfloat16, device=ctx.device)
    return (lambda: torch.matmul(a, b, out=out)), 2.0 * n**3


def partner_call(ctx: BenchContext, partner: str):
    nbytes = PARTNER_BYTES_GPU if ctx.is_cuda else PARTNER_BYTES_CPU
    if partner in ("all_gather", "all_to_all"):
        if ctx.world_size < 2:
            raise Skip(f"overlap with {partner} needs at least 2 ranks")
        return make_call(ctx, partner, nbytes, ctx.world_size, None), nbytes
    host = torch.empty(nbytes // 2, dtype=torch.bfloat16, pin_memory=ctx.is_cuda).fill_(1.0)
    dev = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=ctx.device)
    return (lambda: dev.copy_(host, non_blocking=True)), nbytes


def merged_order(n_a: int, n_b: int) -> list[str]:
    """Interleave n_a 'a' and n_b 'b' launches evenly (a's j-th at j/n_a, b's at j/n_b)."""
    order, ia, ib = [], 0, 0
    while ia < n_a or ib < n_b:
        if ib >= n_b or (ia < n_a and ia / n_a <= ib / n_b):
            order.append("a")
            ia += 1
        else:
            order.append("b")
            ib += 1
    return order


def overlapped_slowdowns(alone_a: float, alone_b: float, end_a: float, end_b: float) -> tuple[float, float]:
    """Each stream's slowdown while the other runs, from alone times and concurrent end times.

    Both streams start together. The one that ends first ran overlapped all its life. The
    other ran alone after that, at its alone speed, so only the work it did before that end
    counts: slowdown = overlapped time / alone-time of the work done in it, minus one.
    """
    first_end, first_alone = (end_a, alone_a) if end_a <= end_b else (end_b, alone_b)
    last_end, last_alone = (end_b, alone_b) if end_a <= end_b else (end_a, alone_a)
    slow_first = first_end / first_alone - 1.0
    work_overlapped = last_alone - (last_end - first_end)
    slow_last = first_end / work_overlapped - 1.0 if work_overlapped > 0 else last_end / last_alone - 1.0
    return (slow_first, slow_last) if end_a <= end_b else (slow_last, slow_first)


def _run_gpu(ctx: BenchContext, calls: dict, counts: dict) -> dict[str, float]:
    """Seconds each stream took from a common start, launching in merged order."""
    streams = {s: torch.cuda.Stream(ctx.device) for s in counts if counts[s] > 0}
    start = torch.cuda.Event(enable_timing=True)
    ends = {s: torch.cuda.Event(enable_timing=True) for s in streams}
    ctx.sync()
    start.record()
    for s in streams.values():
        s.wait_event(start)
    for which in merged_order(counts.get("a", 0), counts.get("b", 0)):
        with torch.cuda.stream(streams[which]):
            calls[which]()
    for s, st in streams.items():
        ends[s].record(st)
    ctx.sync()
    return {s: start.elapsed_time(e) / 1000.0 for s, e in ends.items()}


def _run_cpu(ctx: BenchContext, calls: dict, counts: dict) -> dict[str, float]:
    """Each stream in its own thread; seconds from a common start to each one's end."""
    done: dict[str, float] = {}
    barrier = threading.Barrier(sum(1 for s in counts if counts[s] > 0))
    t0 = [0.0]

    def work(which: str) -> None:
        barrier.wait()
        if not t0[0]:
            t0[0] = time.perf_counter()
        for _ in range(counts[which]):
            calls[which]()
        done[which] = time.perf_counter()

    threads = [threading.Thread(target=work, args=(s,)) for s in counts if counts[s] > 0]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {s: v - t0[0] for s, v in done.items()}


def _measured(ctx: BenchContext, name: str, calls: dict, counts: dict) -> tuple[dict, float | None]:
    if ctx.world_size > 1:
        dist.barrier()
    if ctx.monitor is not None:
        ctx.monitor.begin_window(name)
    times = (_run_gpu if ctx.is_cuda else _run_cpu)(ctx, calls, counts)
    power = None
    if ctx.monitor is not None:
        m = ctx.monitor.end_window(name)
        power = None if m.gpu_power_avg_w is None else sum(m.gpu_power_avg_w.values()) / len(m.gpu_power_avg_w)
    return times, power


def bench_overlap(ctx: BenchContext, partner: str) -> dict:
    gemm, gemm_flops = gemm_call(ctx)
    other, other_bytes = partner_call(ctx, partner)
    collective = partner != "host_copy"
    agree = (lambda v: all_ranks_max(ctx, v)) if ctx.world_size > 1 else None
    t_a = time_per_call(ctx, gemm, agree=agree)
    t_b = time_per_call(ctx, other, agree=agree)
    window = ctx.sizes.power_window_s
    n_a, n_b = max(2, math.ceil(window / t_a)), max(2, math.ceil(window / t_b))
    calls = {"a": gemm, "b": other}
    alone_a, p_a = _measured(ctx, f"overlap-{partner}-gemm", calls, {"a": n_a})
    alone_b, p_b = _measured(ctx, f"overlap-{partner}-other", calls, {"b": n_b})
    both, p_ab = _measured(ctx, f"overlap-{partner}-both", calls, {"a": n_a, "b": n_b})
    slow_a, slow_b = overlapped_slowdowns(alone_a["a"], alone_b["b"], both["a"], both["b"])
    mine = {
        "compute_slowdown": slow_a,
        "other_slowdown": slow_b,
        "compute_slowdown_end_to_end": both["a"] / alone_a["a"] - 1.0,
        "other_slowdown_end_to_end": both["b"] / alone_b["b"] - 1.0,
        "sequential_over_overlapped": (alone_a["a"] + alone_b["b"]) / max(both.values()),
        "compute_alone_s": alone_a["a"], "other_alone_s": alone_b["b"],
        "compute_overlapped_s": both["a"], "other_overlapped_s": both["b"],
        "power_compute_w": p_a, "power_other_w": p_b, "power_overlapped_w": p_ab,
    }
    ranks = gather_objects(ctx, mine)

    def mean(key):
        vals = [r[key] for r in ranks if r[key] is not None]
        return sum(vals) / len(vals) if vals else None

    return {"partner": partner, "collective": collective, "gemm_flops": gemm_flops, "partner_bytes": other_bytes,
            "gemm_calls": n_a, "partner_calls": n_b, "world_size": ctx.world_size,
            **{k: mean(k) for k in mine}, "per_rank": ranks}


def items(ctx: BenchContext) -> list[BenchItem]:
    return [BenchItem(f"overlap/{p}", "overlap", lambda c, p=p: bench_overlap(c, p), collective=True,
                      label=f"GEMM beside {p.replace('_', '-')}") for p in ("all_gather", "all_to_all", "host_copy")]
