"""The reserved pool's figures fitted from measured runs (`models.pool_fit`): a share for each kind
of step, a ZeRO-1/2 offload step's start-up blocks, and what a step on several GPUs holds beyond them."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from models.fit import FitParameter, ProfileFit, RunEvaluator
from models.measured_run import MeasuredRun
from models.pool_fit import (
    collective_pool_of,
    fragmentation_of,
    offload_start_pool_of,
    start_pool_base_gib,
    with_pool_of,
)


def test_the_reserved_pool_is_fitted_by_offload_and_checkpointing_then_collectives(all_runs, base):
    """Four kinds, offload and checkpointing each split, as models.memory picks; a step on more than
    one GPU holds 3 GiB more whatever its kind: the GiB are what those steps hold beyond their kind's share."""
    excess = {(True, True): 0.40, (True, False): 0.15, (False, True): 0.25, (False, False): 0.10}

    def reserved(r: MeasuredRun) -> float:
        share = excess[(r.strategy.offload_optimizer != "none", r.strategy.checkpoint_every > 0)]
        return r.peak_gpu_mem_gib * (1.0 + share) + (3.0 if r.strategy.gpus > 1 else 0.0)

    one_gpu = [dataclasses.replace(r, peak_gpu_reserved_gib=reserved(r)) for r in all_runs if r.strategy.gpus == 1]
    fitted = fragmentation_of(one_gpu)
    assert {k: round(v, 9) for k, (v, _) in fitted.items()} == {
        "memory.fragmentation": 0.10, "memory.fragmentation_checkpointed": 0.25, "memory.fragmentation_offload": 0.15,
        "memory.fragmentation_offload_checkpointed": 0.40}
    assert sum(n for _, n in fitted.values()) == len(one_gpu)
    assert collective_pool_of(one_gpu, fitted, base) is None  # no run on more than one GPU
    runs = [dataclasses.replace(r, peak_gpu_reserved_gib=reserved(r)) for r in all_runs]
    several = sum(r.strategy.gpus > 1 for r in runs)
    assert 0 < several < len(runs) / 2  # the shares' medians stay the one-GPU runs'
    value, count = collective_pool_of(runs, fragmentation_of(runs), base)
    assert value == pytest.approx(3.0) and count == several
    model = ProfileFit(parameters=(FitParameter("overheads.step", 0.0, 5.0, 0.05, "time"),)).fit(runs, base)
    pool = model.profile_.memory.collective_pool
    assert pool.value == pytest.approx(3.0) and pool.source.startswith("fitted:")
    assert model.profile_.fit.prefit["memory.collective_pool"] == base.memory.collective_pool
    held_out = with_pool_of(base, runs)  # the same figures, set without a fit
    assert held_out.memory.collective_pool.value == pytest.approx(3.0)
    assert held_out.memory.fragmentation_offload_checkpointed.value == pytest.approx(0.40)
    assert held_out.memory.fragmentation.value == pytest.approx(0.10)


def test_the_blocks_a_zero12_offload_start_up_leaves_are_fitted_as_a_multiple_of_its_parameters(all_runs, base):
    """A ZeRO-1/2 optimizer-offload step's pool holds 0.6 x its bf16 parameters beyond its share (traced:
    DeepSpeed's start-up leaves them cached); the fit finds the multiple and the shares beside it, and
    a share alone, which grows with the step's allocations, cannot follow it."""
    excess = {(True, True): 0.20, (True, False): 0.10, (False, True): 0.25, (False, False): 0.10}

    def reserved(r: MeasuredRun) -> float:
        share = excess[(r.strategy.offload_optimizer != "none", r.strategy.checkpoint_every > 0)]
        return (r.peak_gpu_mem_gib * (1.0 + share) + 0.6 * start_pool_base_gib(r)
                + (3.0 if r.strategy.gpus > 1 else 0.0))

    runs = [dataclasses.replace(r, peak_gpu_reserved_gib=reserved(r)) for r in all_runs]
    offload = [r for r in runs if start_pool_base_gib(r) > 0]
    assert len(offload) >= 3 and len({round(r.peak_gpu_reserved_gib / r.peak_gpu_mem_gib, 3) for r in offload}) > 3
    value, count = offload_start_pool_of(runs, base)
    assert value == pytest.approx(0.6, abs=0.01) and count == len(offload)
    fitted = with_pool_of(base, runs)
    assert fitted.memory.offload_start_pool.value == pytest.approx(0.6, abs=0.01)
    assert fitted.memory.fragmentation_offload_checkpointed.value == pytest.approx(0.20, abs=0.01)
    assert fitted.memory.collective_pool.value == pytest.approx(3.0, abs=0.05)
    model = ProfileFit(parameters=(FitParameter("overheads.step", 0.0, 5.0, 0.05, "time"),)).fit(runs, base)
    assert model.profile_.memory.offload_start_pool.value == pytest.approx(0.6, abs=0.01)
    assert model.profile_.memory.offload_start_pool.source.startswith("fitted:")
    evaluated = RunEvaluator(offload)(model.profile_)
    measured = np.array([r.peak_gpu_reserved_gib for r in offload])
    assert np.max(np.abs(evaluated.reserved_gpu_mem_gib / measured - 1)) < 0.02


def test_without_zero12_offload_runs_no_start_up_multiple_is_fitted(all_runs, base):
    others = [r for r in all_runs if start_pool_base_gib(r) == 0 and r.peak_gpu_reserved_gib]
    assert offload_start_pool_of(others, base) is None
