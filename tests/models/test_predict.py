"""The entry point: contract shape, feasibility with numbers, batch = single, speed."""
from __future__ import annotations

import dataclasses

import json
import time

import numpy as np
import pytest
from cost_model_helpers import profile_with, random_batch

from models.architecture import load_architecture
from models.host_memory import pinned_bytes
from models.layout import SUB_GROUP_SIZE
from models.params import count_params
from models.predict import BatchPrediction, Prediction, predict, predict_batch, static_mask
from models.strategy import Strategy, StrategyBatch, static_reasons
from models.timing import PHASES
from models.workload import Workload

W7_32K = Workload(load_architecture("7B"), 32768)
TOP_LEVEL = {"step_time_s", "gpu_energy_j", "cpu_energy_j", "energy_j", "peak_gpu_mem_gib", "peak_host_mem_gib",
             "tokens_per_s", "feasible", "reasons", "cpu_energy_estimated", "profile", "strategy", "breakdown"}


def test_7b_32k_on_four_gh200_with_zero3_is_feasible_and_its_breakdown_sums(gh200):
    s = Strategy(gpus=4, gpus_per_node=4, zero_stage=3, checkpoint_every=1)
    pred = predict(W7_32K, s, gh200)
    assert isinstance(pred, Prediction)
    assert pred.feasible, pred.reasons
    assert pred.reasons == []
    assert pred.peak_gpu_mem_gib < gh200.gpu.memory_gib.value
    assert [p.name for p in pred.breakdown] == list(PHASES)
    assert sum(p.time_s for p in pred.breakdown) == pytest.approx(pred.step_time_s, rel=1e-12)
    assert sum(p.gpu_energy_j for p in pred.breakdown) == pytest.approx(pred.gpu_energy_j, rel=1e-12)
    assert pred.tokens_per_s == pytest.approx(4 * 32768 / pred.step_time_s)
    # 4 GPUs x 32k tokens of a 7B model are ~8.6 PFLOP with recomputation: seconds, not ms or hours
    assert 2.0 < pred.step_time_s < 30.0
    assert pred.profile.startswith("gh200 (derived")


def test_to_dict_is_the_predict_json(gh200):
    pred = predict(W7_32K, Strategy(gpus=4, gpus_per_node=4, zero_stage=3, checkpoint_every=1), gh200)
    d = json.loads(json.dumps(pred.to_dict()))
    assert TOP_LEVEL <= set(d)
    assert d["strategy"]["zero_stage"] == 3 and d["strategy"]["label"].startswith("z3")
    assert {tuple(sorted(row)) for row in d["breakdown"]} == {
        ("cpu_energy_j", "gpu_energy_j", "note", "phase", "time_s")}
    assert [row["phase"] for row in d["breakdown"]] == list(PHASES)


def test_too_little_gpu_memory_is_reported_with_numbers(gh200):
    s = Strategy(gpus=4, gpus_per_node=4, zero_stage=0)  # 20 bytes/param whole + 32k activations
    pred = predict(W7_32K, s, gh200)
    assert not pred.feasible
    assert pred.reasons == [f"needs {pred.peak_gpu_mem_gib:.1f} GiB of GPU memory, has 96.0"]
    assert pred.peak_gpu_mem_gib > 140  # 7B x 20 bytes alone is 125 GiB
    assert pred.step_time_s > 0  # infeasible entries keep their numbers


def test_framework_reserve_and_fragmentation_count_in_the_need():
    s = Strategy(gpus=4, gpus_per_node=4, zero_stage=3, checkpoint_every=1)
    base = predict(W7_32K, s, profile_with({"memory.framework_reserved": 0.0, "memory.fragmentation": 0.0,
                                            "memory.fragmentation_checkpointed": 0.0, "memory.collective_pool": 0.0}))
    more = predict(W7_32K, s, profile_with({"memory.framework_reserved": 3.0, "memory.fragmentation": 0.05,
                                            "memory.fragmentation_checkpointed": 0.25, "memory.collective_pool": 0.0}))
    assert base.peak_gpu_mem_gib == pytest.approx(base.allocated_gpu_mem_gib)
    assert more.peak_gpu_mem_gib == pytest.approx(1.25 * base.allocated_gpu_mem_gib + 3.0)
    offload = dataclasses.replace(s, offload_optimizer="cpu")  # checkpointed: a share of its own
    kept = dataclasses.replace(offload, checkpoint_every=0)  # its activations kept: the offload share
    own = profile_with({"memory.framework_reserved": 0.0, "memory.fragmentation": 0.05,
                        "memory.fragmentation_checkpointed": 0.25, "memory.fragmentation_offload": 0.15,
                        "memory.fragmentation_offload_checkpointed": 0.4, "memory.collective_pool": 0.0})
    older = own.model_copy(update={"memory": own.memory.model_copy(update={"fragmentation_offload_checkpointed": None})})
    none = older.model_copy(update={"memory": older.memory.model_copy(update={"fragmentation_offload": None})})
    # without a share of its own, a checkpointed offload step takes the offload share (a profile fitted
    # before the split holds one for all offload steps there), without that either the plain one
    for p, step, share in ((own, offload, 0.4), (own, kept, 0.15), (older, offload, 0.15), (none, offload, 0.05),
                           (none, kept, 0.05)):
        pred = predict(W7_32K, step, p)
        assert pred.peak_gpu_mem_gib == pytest.approx((1 + share) * pred.allocated_gpu_mem_gib)


def test_a_step_whose_ranks_communicate_pools_the_collective_figure_on_top_of_its_share():
    """memory.collective_pool is GiB beyond the share, for more than one GPU only; absent, nothing."""
    with_pool = profile_with({"memory.fragmentation": 0.1, "memory.fragmentation_checkpointed": 0.1,
                              "memory.collective_pool": 3.0})
    without = with_pool.model_copy(update={"memory": with_pool.memory.model_copy(update={"collective_pool": None})})
    for gpus, extra_gib in ((1, 0.0), (4, 3.0)):
        s = Strategy(gpus=gpus, gpus_per_node=4, zero_stage=3, checkpoint_every=1)
        pooled, bare = predict(W7_32K, s, with_pool), predict(W7_32K, s, without)
        assert bare.reserved_gpu_mem_gib == pytest.approx(1.1 * bare.allocated_gpu_mem_gib)
        assert pooled.reserved_gpu_mem_gib == pytest.approx(bare.reserved_gpu_mem_gib + extra_gib)
        assert pooled.peak_gpu_mem_gib - pooled.reserved_gpu_mem_gib == pytest.approx(
            bare.peak_gpu_mem_gib - bare.reserved_gpu_mem_gib)  # the framework's reserve, as before


def test_a_zero12_offload_step_pools_its_start_up_blocks_beyond_its_share():
    """memory.offload_start_pool x the bf16 trainable parameters, for ZeRO-1/2 with optimizer offload only
    (each rank flattens all its parameters at start-up); absent, nothing."""
    w = Workload(load_architecture("qwen2.5-3b"), 8192)
    shares = {"memory.fragmentation": 0.1, "memory.fragmentation_checkpointed": 0.1,
              "memory.fragmentation_offload": 0.1, "memory.fragmentation_offload_checkpointed": 0.1,
              "memory.collective_pool": 0.0}
    pooled = profile_with({**shares, "memory.offload_start_pool": 0.5})
    bare = pooled.model_copy(update={"memory": pooled.memory.model_copy(update={"offload_start_pool": None})})
    bf16_gib = 2 * count_params(w).trainable / 2**30
    for stage, offload, extra_gib in ((2, "cpu", 0.5 * bf16_gib), (1, "cpu", 0.5 * bf16_gib), (3, "cpu", 0.0),
                                      (2, "none", 0.0)):
        s = Strategy(gpus=1, gpus_per_node=1, zero_stage=stage, offload_optimizer=offload, checkpoint_every=1)
        with_start, without = predict(w, s, pooled), predict(w, s, bare)
        assert without.reserved_gpu_mem_gib == pytest.approx(1.1 * without.allocated_gpu_mem_gib)
        assert with_start.reserved_gpu_mem_gib == pytest.approx(without.reserved_gpu_mem_gib + extra_gib)


def test_host_memory_and_node_size_reasons():
    small_host = profile_with({"host.memory_gib": 64.0})
    s = Strategy(gpus=4, gpus_per_node=4, zero_stage=3, offload_optimizer="cpu", checkpoint_every=1)
    pred = predict(W7_32K, s, small_host)
    assert not pred.feasible
    assert pred.reasons == [f"needs {pred.peak_host_mem_gib:.1f} GiB of host memory per node, has 64.0"]
    # per rank: the fp32 master and Adam's moments (12 bytes a parameter), the fp32 gradients of its
    # sub-groups and the bf16 gradient buffer pinned (each rounded up to a power of two:
    # models.host_memory), a sub-group's bf16 cast, plus each of the 4 processes' own host memory
    # (memory.host_process_per_rank)
    per_rank = 6_738_415_616 / 4
    grads = pinned_bytes(4 * SUB_GROUP_SIZE) + pinned_bytes(4 * (per_rank - SUB_GROUP_SIZE))
    cast = 2 * SUB_GROUP_SIZE  # the host's bf16 copy of one sub-group on its way to the GPU
    rank_bytes = 12 * per_rank + float(grads) + float(pinned_bytes(2 * per_rank)) + cast
    process_gib = small_host.memory.host_process_per_rank.value
    assert pred.peak_host_mem_gib == pytest.approx(4 * rank_bytes / 2**30 + 4 * process_gib)
    wide = predict(W7_32K, Strategy(gpus=8, gpus_per_node=8, zero_stage=3, checkpoint_every=1), small_host)
    assert "8 GPUs per node asked, profile 'gh200' nodes have 4" in wide.reasons


def test_static_refusals_are_infeasible_with_deepspeed_s_reason(gh200):
    s = Strategy(gpus=4, gpus_per_node=4, zero_stage=2, offload_param="cpu", offload_optimizer="cpu")
    pred = predict(W7_32K, s, gh200)
    assert not pred.feasible
    assert "parameter offload needs ZeRO stage 3" in pred.reasons


def test_vectorised_static_rules_agree_with_static_reasons():
    arch = load_architecture("qwen2.5-7b")  # 28 heads, 4 KV heads: sp=8 and sp=3 are refused
    rng = np.random.default_rng(3)
    n = 3000
    b = StrategyBatch(
        gpus=rng.choice([0, 1, 2, 4, 6, 8, 16], n), gpus_per_node=rng.choice([1, 2, 4, 8], n),
        zero_stage=rng.integers(-1, 5, n), offload_optimizer=rng.integers(0, 2, n),
        offload_ratio=rng.choice([0.0, 0.3, 1.0, 1.5], n), super_offload=rng.random(n) < 0.3,
        offload_param=rng.integers(0, 2, n), checkpoint_every=rng.integers(-1, 31, n),
        cpu_checkpointing=rng.random(n) < 0.3, sp=rng.choice([0, 1, 2, 3, 4, 8], n),
        micro_batch=rng.integers(0, 3, n), grad_accum=rng.integers(0, 3, n), overlap_comm=rng.random(n) < 0.5,
        reduce_bucket_size=np.full(n, 500_000_000), allgather_bucket_size=np.full(n, 500_000_000),
        prefetch_bucket_size=np.full(n, 50_000_000), cpu_threads_per_rank=rng.integers(-1, 3, n),
    )
    mask = static_mask(b, arch)
    scalar = np.array([bool(static_reasons(b.strategy(i), arch)) for i in range(n)])
    np.testing.assert_array_equal(mask, scalar)
    assert 0 < mask.sum() < n


def test_batch_and_single_predictions_agree(gh200):
    b = random_batch(300, seed=7)
    out = predict_batch(W7_32K, b, gh200)
    assert isinstance(out, BatchPrediction) and len(out) == 300
    for i in (0, 17, 123, 299):
        one = predict(W7_32K, b.strategy(i), gh200)
        assert one.step_time_s == pytest.approx(out.step_time_s[i], rel=1e-12)
        assert one.energy_j == pytest.approx(out.energy_j[i], rel=1e-12)
        assert one.peak_gpu_mem_gib == pytest.approx(out.peak_gpu_mem_gib[i], rel=1e-12)
        assert one.feasible == bool(out.feasible[i])
        assert one.reasons == out.reasons(i)
        assert out.prediction(i).breakdown == one.breakdown
    for i in np.flatnonzero(~out.feasible)[:20]:
        assert out.reasons(int(i)), "every infeasible entry says why"
    for i in np.flatnonzero(out.feasible)[:20]:
        assert out.reasons(int(i)) == []


def test_more_offload_trades_gpu_memory_for_host_memory(gh200):
    base = Strategy(gpus=4, gpus_per_node=4, zero_stage=3, checkpoint_every=1)
    opt = Strategy(gpus=4, gpus_per_node=4, zero_stage=3, checkpoint_every=1, offload_optimizer="cpu")
    par = Strategy(gpus=4, gpus_per_node=4, zero_stage=3, checkpoint_every=1, offload_optimizer="cpu",
                   offload_param="cpu")
    a, b, c = (predict(W7_32K, s, gh200) for s in (base, opt, par))
    assert a.peak_gpu_mem_gib > b.peak_gpu_mem_gib > c.peak_gpu_mem_gib
    assert a.peak_host_mem_gib < b.peak_host_mem_gib < c.peak_host_mem_gib


def test_at_least_100k_evaluations_per_second(gh200):
    b = random_batch(50_000, seed=11)
    predict_batch(W7_32K, random_batch(10), gh200)
    best = min(_timed(lambda: predict_batch(W7_32K, b, gh200)) for _ in range(3))
    assert 50_000 / best > 100_000, f"{50_000 / best:,.0f} evaluations/s"


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
