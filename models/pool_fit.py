"""The reserved pool's figures from measured runs: a share of the allocated peak for each kind of
step (`models.memory.FRAGMENTATION_FIELDS`), the blocks a ZeRO-1/2 offload step's start-up leaves
(`memory.offload_start_pool`) and what a step on several GPUs holds beyond them
(`memory.collective_pool`). Medians and a one-dimensional search, not least squares: the pool is
measured beside the allocated peak, so no prediction is needed to fit it."""
from __future__ import annotations

import numpy as np
from scipy.optimize import minimize_scalar

from models.measured_run import MeasuredRun
from models.memory import (FRAGMENTATION_FIELDS, GIB, fragmentation_index, fragmentation_shares,
                           start_pool_base_bytes, start_pool_ratio)
from models.params import count_params
from models.profile import HardwareProfile, Quantity
from models.profile_values import with_values


def fragmentation_kind(run: MeasuredRun) -> int:
    """Which fragmentation share a run's pool takes: a position in FRAGMENTATION_FIELDS, as `models.memory` picks."""
    return int(fragmentation_index(run.strategy.offload_optimizer != "none", run.strategy.checkpoint_every > 0))


def start_pool_base_gib(run: MeasuredRun) -> float:
    """What `memory.offload_start_pool` multiplies for this run (`models.memory.start_pool_base_bytes`), GiB."""
    s = run.strategy
    trainable = count_params(run.workload).trainable
    return float(start_pool_base_bytes(s.zero_stage, s.offload_optimizer != "none", trainable)) / GIB


def pool_beyond_share_gib(run: MeasuredRun, shares: np.ndarray, start_ratio: float = 0.0) -> float:
    """What a run's pool held beyond its allocated peak x (1 + its kind's share) and its start-up's
    blocks (`start_ratio` x `start_pool_base_gib`), GiB; `shares` in FRAGMENTATION_FIELDS' order
    (`models.memory.fragmentation_shares`)."""
    return (run.peak_gpu_reserved_gib - run.peak_gpu_mem_gib * (1.0 + shares[fragmentation_kind(run)])
            - start_ratio * start_pool_base_gib(run))


def with_memory_nodes(profile: HardwareProfile, values: dict[str, float]) -> HardwareProfile:
    """`profile` with a node for each memory figure in `values` it lacks (a share or the collective
    pool a profile may go without), so that `with_values` can set it."""
    memory = profile.memory
    absent = {"collective_pool": Quantity(value=0.0, unit="GiB", source="absent"),
              "offload_start_pool": Quantity(value=0.0, unit="ratio", source="absent")}
    for field in (*FRAGMENTATION_FIELDS, *absent):
        if getattr(memory, field) is None and f"memory.{field}" in values:
            node = absent.get(field, memory.fragmentation)
            memory = memory.model_copy(update={field: node})
    return profile.model_copy(update={"memory": memory})


def runs_with_pool(runs: list[MeasuredRun]) -> list[MeasuredRun]:
    """The runs that measured torch's reserved pool beside their allocated peak: what the pool's figures
    are fitted to."""
    return [r for r in runs if r.peak_gpu_reserved_gib and r.peak_gpu_mem_gib and r.peak_gpu_mem_gib > 0]


def fragmentation_of(runs: list[MeasuredRun], start_ratio: float = 0.0) -> dict[str, tuple[float, int]]:
    """Caching-allocator overhead, median of (reserved - the start-up's blocks) / allocated - 1 over
    runs that measured both, apart for each kind of step (`FRAGMENTATION_FIELDS`: optimizer offload and
    checkpointing, each with and without the other): {profile path: (value, runs)}. Multi-GPU runs count
    here too: taking the shares from one-GPU runs alone lowered the checkpointed one below what a
    capped one-GPU step was measured to need (benchmarks/memory_accuracy.py --need)."""
    ratios: dict[str, list[float]] = {}
    for r in runs_with_pool(runs):
        field = f"memory.{list(FRAGMENTATION_FIELDS)[fragmentation_kind(r)]}"
        kept = r.peak_gpu_reserved_gib - start_ratio * start_pool_base_gib(r)
        ratios.setdefault(field, []).append(kept / r.peak_gpu_mem_gib)
    return {name: (float(np.clip(np.median(v) - 1.0, 0.0, 1.0)), len(v)) for name, v in ratios.items()}


def collective_pool_of(runs: list[MeasuredRun], fragmentation: dict[str, tuple[float, int]],
                       base: HardwareProfile, start_ratio: float = 0.0) -> tuple[float, int] | None:
    """What the pool of a step whose ranks exchange data holds beyond its fragmentation share and its
    start-up's blocks: median over runs on more than one GPU, GiB, not below 0; (value, runs), None
    without such runs. A share these runs fitted none of is `base`'s."""
    shares = fragmentation_shares(base.memory)
    for i, field in enumerate(FRAGMENTATION_FIELDS):
        shares[i] = fragmentation.get(f"memory.{field}", (shares[i],))[0]
    extra = [pool_beyond_share_gib(r, shares, start_ratio) for r in runs_with_pool(runs) if r.strategy.gpus > 1]
    return (max(float(np.median(extra)), 0.0), len(extra)) if extra else None


# The start-up's blocks are searched as a multiple of the bf16 parameters up to this: traced, DeepSpeed's
# start-up left about twice them free, and a step can only add to what it reuses of them.
START_POOL_SEARCH_MAX = 4.0


def offload_start_pool_of(runs: list[MeasuredRun], base: HardwareProfile) -> tuple[float, int] | None:
    """`memory.offload_start_pool`, the multiple of the bf16 parameters a ZeRO-1/2 offload step's pool
    holds beyond its share: the one whose pool, with every share and the collective pool refitted
    beside it, misses those runs' measured pools least (mean relative error); (value, runs), None
    with fewer than three such runs."""
    pooled = runs_with_pool(runs)
    offload = [r for r in pooled if start_pool_base_gib(r) > 0]
    if len(offload) < 3:
        return None
    measured = np.array([r.peak_gpu_reserved_gib for r in offload])

    def miss(ratio: float) -> float:
        fitted = with_pool_figures(base, pooled, ratio)
        shares, collective = fragmentation_shares(fitted.memory), fitted.memory.collective_pool
        beyond = np.array([pool_beyond_share_gib(r, shares, ratio) for r in offload])
        several = np.array([r.strategy.gpus > 1 for r in offload])
        predicted = measured - beyond + np.where(several, collective.value if collective is not None else 0.0, 0.0)
        return float(np.mean(np.abs(predicted / measured - 1.0)))

    best = minimize_scalar(miss, bounds=(0.0, START_POOL_SEARCH_MAX), method="bounded")
    return float(best.x), len(offload)


def pool_figures(runs: list[MeasuredRun], base: HardwareProfile, start_ratio: float) -> dict[str, tuple[float, int]]:
    """Every pool figure `runs` give at a start-up multiple: {profile path: (value, runs)}."""
    fragmentation = fragmentation_of(runs, start_ratio)
    figures = dict(fragmentation)
    pool = collective_pool_of(runs, fragmentation, base, start_ratio)
    if pool is not None:
        figures["memory.collective_pool"] = pool
    return figures


def with_pool_figures(profile: HardwareProfile, runs: list[MeasuredRun], start_ratio: float) -> HardwareProfile:
    """`profile` with the shares and the collective pool `runs` give at the start-up multiple `start_ratio`."""
    values = {name: value for name, (value, _) in pool_figures(runs, profile, start_ratio).items()}
    values["memory.offload_start_pool"] = start_ratio
    return with_values(with_memory_nodes(profile, values), values)


def with_pool_of(profile: HardwareProfile, runs: list[MeasuredRun]) -> HardwareProfile:
    """`profile` with the pool's figures (start-up blocks, fragmentation shares, collective pool) as
    `runs` give them, as a fit sets them; the rest of `profile` as it is. For checking those figures
    on runs held out."""
    start = offload_start_pool_of(runs, profile)
    return with_pool_figures(profile, runs, start[0] if start is not None else start_pool_ratio(profile.memory))
