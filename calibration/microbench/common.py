"""What every microbenchmark shares: the run context, the item type, and the timers.

Timing uses CUDA events on a GPU and perf_counter on the CPU; each result is the median
per-call time of a few timed batches after warm-up, each batch long enough that launch
overhead does not dominate.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch


@dataclass(frozen=True)
class Sizes:
    """How big and how long: one object for full, quick, and the tiny CPU path."""

    quick: bool
    cpu: bool
    batch_target_s: float  # one timed batch of calls lasts about this long
    batches: int  # timed batches per measurement; the median is kept
    power_window_s: float  # energy windows (NVML's counter updates every ~100 ms)


def sizes_for(quick: bool, cpu: bool) -> Sizes:
    if cpu:
        return Sizes(quick=quick, cpu=True, batch_target_s=0.02, batches=3, power_window_s=0.5)
    if quick:
        return Sizes(quick=True, cpu=False, batch_target_s=0.03, batches=3, power_window_s=2.0)
    # Three timed batches, not five: on a lent H100 the GEMM, attention and copy rates at three came out within
    # 0.5% of five's (medians over their shapes), and the profile's time error on 29 H100 runs moved by 0.04
    # points. Energy windows stay 3 s: at 2 s the dense phase read 674 W against 700 W (its cap) at 3 s, and
    # the wait decay 44 ms against 29 ms (lab/calibration_sizes_ab.py, docs/MEASUREMENTS.md, 2026-12-06).
    return Sizes(quick=False, cpu=False, batch_target_s=0.05, batches=3, power_window_s=3.0)


@dataclass
class BenchContext:
    """One rank's view of the calibration run (mutable: groups are created lazily)."""

    device: torch.device
    sizes: Sizes
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    backend: str = "gloo"
    monitor: Any = None  # calibration.meters.EnergyMonitor for this rank's GPU
    cpu_adam: str = "auto"  # "auto" | "deepspeed" | "torch"
    groups: dict = field(default_factory=dict)
    worker: Any = None  # calibration.ds_worker.DeepSpeedWorker on local rank 0: DeepSpeed engines, one process

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def build(self, make: Callable[[], torch.nn.Module], dtype: torch.dtype) -> torch.nn.Module:
        """`make()`'s module with its weights initialised on this device, in `dtype`. Initialised on the
        host (one thread) and moved, a llama-2-7b layer took a second: 11 s of one item's 11.4 s for
        eight of them (lent H100, 2026-12-06); on the GPU, milliseconds."""
        with self.device:
            return make().to(dtype)

    @property
    def nnodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))

    def sync(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    @property
    def issue_threads(self) -> int:
        """Torch's threads for the host-issue benchmarks (pass_issue, zero3_hooks). On the CPU path one:
        their tiny layers gain nothing from more, and with two threads a busy neighbour on one core
        threw the pass ratios 0.2-13x about (a 2-core host, 2026-12-03; one thread read as unloaded).
        On a GPU, the threads the runs have (the GPU's kernels are issued from one thread either way)."""
        return torch.get_num_threads() if self.is_cuda else 1


@dataclass(frozen=True)
class BenchItem:
    """One measurement. `collective` items must run on every rank in the same order."""

    key: str
    family: str
    run: Callable[[BenchContext], dict]
    collective: bool = False
    label: str = ""


class Skip(Exception):
    """A benchmark that does not apply here (recorded as skipped with the reason)."""


def _elapsed_s(ctx: BenchContext, fn: Callable[[], Any], calls: int) -> float:
    if ctx.is_cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return time.perf_counter() - t0


def time_per_call(
    ctx: BenchContext,
    fn: Callable[[], Any],
    *,
    warmup: int = 2,
    max_calls: int = 10_000,
    agree: Callable[[float], float] | None = None,
) -> float:
    """Median seconds per call of `fn` (which only enqueues work on a GPU).

    `agree` (collectives: all_ranks_max) makes every rank use the same call count and
    return the same time, since ranks that ran different numbers of collectives would hang
    and callers size later loops from the returned time.
    """
    for _ in range(warmup):
        fn()
    ctx.sync()
    probe = _elapsed_s(ctx, fn, 1)
    if agree is not None:
        probe = agree(probe)
    calls = int(min(max_calls, max(1, math.ceil(ctx.sizes.batch_target_s / max(probe, 1e-7)))))
    per_call = statistics.median(_elapsed_s(ctx, fn, calls) / calls for _ in range(ctx.sizes.batches))
    return agree(per_call) if agree is not None else per_call


def run_for(ctx: BenchContext, fn: Callable[[], Any], seconds: float, per_call_s: float) -> int:
    """Keep the device busy with `fn` for at least `seconds`; returns the number of calls.

    Work is enqueued in ~100 ms chunks with a sync between them, so the launch queue never
    runs far ahead of the clock and the window ends when the work ends.
    """
    chunk = max(1, int(0.1 / max(per_call_s, 1e-7)))
    calls, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(chunk):
            fn()
        calls += chunk
        ctx.sync()
    return calls


def all_ranks_max(ctx: BenchContext, value: float) -> float:
    """The largest value over ranks (a collective's time is set by its slowest rank)."""
    if ctx.world_size == 1:
        return value
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device=ctx.device if ctx.backend == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def gather_objects(ctx: BenchContext, obj) -> list:
    """Every rank's `obj`, in rank order (on every rank)."""
    if ctx.world_size == 1:
        return [obj]
    import torch.distributed as dist

    out = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out
