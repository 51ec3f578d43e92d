"""Power per phase: idle, wait, dense compute, memory-bound, host copy, collective, overlap.

Each phase is one energy window of at least `power_window_s` seconds (NVML's counter
updates about every 100 ms), with the GPU synchronised at both ends. `wait` is the GPU
idling right after heavy work while the host runs the CPU optimizer, as in a ZeRO-Offload
step, so the CPU optimizer's power is measured in the same window. `idle` runs first of
all benchmarks, while the GPU is cold. Powers are per GPU, averaged over ranks; CPU power
comes from local rank 0 of the first node (the node's sensor covers all its ranks).
"""
from __future__ import annotations

import time

import torch

from calibration.microbench import overlap
from calibration.microbench.collectives import make_call
from calibration.microbench.common import BenchContext, BenchItem, Skip, all_ranks_max, gather_objects, run_for, time_per_call

PHASES = ("idle", "dense_compute", "wait", "memory_bound", "host_copy", "collective", "overlap")


def _window(ctx: BenchContext, phase: str, body) -> dict:
    if ctx.world_size > 1:
        torch.distributed.barrier()
    ctx.monitor.begin_window(f"power-{phase}")
    detail = body() or {}
    m = ctx.monitor.end_window(f"power-{phase}")
    gpu_w = None if not m.gpu_power_avg_w else sum(m.gpu_power_avg_w.values()) / len(m.gpu_power_avg_w)
    cpu_w = None if m.cpu_energy_j is None or m.cpu_energy_estimated else m.cpu_energy_j / m.time_s
    ranks = gather_objects(ctx, {"gpu_power_w": gpu_w, "cpu_power_w": cpu_w, "time_s": m.time_s})
    gpu_vals = [r["gpu_power_w"] for r in ranks if r["gpu_power_w"] is not None]
    return {
        "phase": phase,
        "time_s": m.time_s,
        "gpu_power_w": sum(gpu_vals) / len(gpu_vals) if gpu_vals else None,
        "cpu_power_w": ranks[0]["cpu_power_w"],
        "gpu_meter": ctx.monitor.gpu_meter_kind,
        "cpu_meter": ctx.monitor.cpu_meter_kind,
        "per_rank": ranks,
        **detail,
    }


def _loop(ctx: BenchContext, fn, agree: bool = False):
    per_call = time_per_call(ctx, fn, agree=(lambda v: all_ranks_max(ctx, v)) if agree else None)
    if agree:  # collectives: every rank must run the same number of calls
        calls = max(1, int(ctx.sizes.power_window_s / per_call))
        return lambda: ([fn() for _ in range(calls)], ctx.sync(), {"calls": calls})[-1]
    return lambda: {"calls": run_for(ctx, fn, ctx.sizes.power_window_s, per_call)}


def _two_streams(ctx: BenchContext, fa, fb, agree: bool):
    opt = (lambda v: all_ranks_max(ctx, v)) if agree else None
    ta, tb = time_per_call(ctx, fa, agree=opt), time_per_call(ctx, fb, agree=opt)
    counts = {"a": max(2, int(ctx.sizes.power_window_s / ta)), "b": max(2, int(ctx.sizes.power_window_s / tb))}
    runner = overlap._run_gpu if ctx.is_cuda else overlap._run_cpu
    return lambda: {"stream_s": runner(ctx, {"a": fa, "b": fb}, counts), "calls": counts}


def _wait_body(ctx: BenchContext):
    """GPU idle after work; local rank 0 runs CPU optimizer steps, the others sleep."""
    from calibration.microbench.cpu import _make_optimizer, choose_optimizer, host_cores

    if ctx.local_rank != 0:
        return lambda: (time.sleep(ctx.sizes.power_window_s), {"cpu_work": "none (not local rank 0)"})[1]
    kind, _ = choose_optimizer(ctx)
    n = 2**20 if not ctx.is_cuda else 2**24
    p = torch.nn.Parameter(torch.randn(n))
    p.grad = torch.randn(n)
    try:
        opt = _make_optimizer(kind, [p])
        opt.step()
    except Exception:
        kind, opt = "torch", _make_optimizer("torch", [p])
    threads = torch.get_num_threads()

    def body():
        torch.set_num_threads(host_cores())
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < ctx.sizes.power_window_s:
            opt.step()
            steps += 1
        torch.set_num_threads(threads)
        return {"cpu_work": f"{kind} optimizer, {n} params, {steps} steps"}

    return body


def bench_phase(ctx: BenchContext, phase: str) -> dict:
    if ctx.monitor is None:
        raise Skip("no energy monitor")
    if phase == "idle":
        return _window(ctx, phase, lambda: (time.sleep(ctx.sizes.power_window_s), {"workload": "nothing"})[1])
    gemm, _ = overlap.gemm_call(ctx)
    if phase == "dense_compute":
        body = _loop(ctx, gemm)
        return _window(ctx, phase, lambda: {**body(), "workload": "bf16 GEMM loop"})
    if phase == "wait":
        return _window(ctx, phase, _wait_body(ctx))
    if phase == "memory_bound":
        n = (2**30 if ctx.is_cuda else 2**24) // 2
        src = torch.ones(n, dtype=torch.bfloat16, device=ctx.device)
        dst = torch.empty_like(src)
        body = _loop(ctx, lambda: dst.copy_(src))
        return _window(ctx, phase, lambda: {**body(), "workload": f"device copy of {2 * n} bytes"})
    if phase == "host_copy":
        up, _ = overlap.partner_call(ctx, "host_copy")
        host = torch.empty(overlap.PARTNER_BYTES_GPU // 2 if ctx.is_cuda else 2**19, dtype=torch.bfloat16,
                           pin_memory=ctx.is_cuda)
        dev = torch.ones_like(host, device=ctx.device)
        body = _two_streams(ctx, up, lambda: host.copy_(dev, non_blocking=True), agree=False)
        return _window(ctx, phase, lambda: {**body(), "workload": "pinned H2D and D2H on two streams"})
    nbytes = overlap.PARTNER_BYTES_GPU if ctx.is_cuda else overlap.PARTNER_BYTES_CPU
    if phase == "collective":
        if ctx.world_size < 2:
            raise Skip("the collective phase needs at least 2 ranks")
        body = _loop(ctx, make_call(ctx, "all_reduce", nbytes, ctx.world_size, None), agree=True)
        return _window(ctx, phase, lambda: {**body(), "workload": f"all-reduce of {nbytes} bytes"})
    if phase == "overlap":
        if ctx.world_size >= 2:
            other, what = make_call(ctx, "all_gather", nbytes, ctx.world_size, None), f"all-gather of {nbytes} bytes"
        else:  # one GPU: the only other stream there is is the host copy
            other, what = overlap.partner_call(ctx, "host_copy")[0], f"pinned H2D copy of {nbytes} bytes"
        body = _two_streams(ctx, gemm, other, agree=ctx.world_size >= 2)
        return _window(ctx, phase, lambda: {**body(), "workload": f"bf16 GEMM beside {what}"})
    raise ValueError(f"unknown phase {phase}")


def item(phase: str) -> BenchItem:
    return BenchItem(f"power/{phase}", "power", lambda c: bench_phase(c, phase), collective=True,
                     label=f"power: {phase.replace('_', ' ')}")


def items(ctx: BenchContext) -> list[BenchItem]:
    """All phases but idle, which the orchestrator runs first."""
    return [item(p) for p in PHASES if p != "idle"]
