"""Step-time phases: collectives per ZeRO stage, overlap, all-to-alls, offload, overheads."""
from __future__ import annotations

import math

import numpy as np
import pytest
from cost_model_helpers import profile_with, random_batch

from models.architecture import load_architecture
from models.flops import micro_step_work
from models.params import count_params
from models.predict import predict, predict_batch
from models.strategy import Strategy
from models.profile import load_profile, parse_profile
from models.timing import PHASES, _overlap, bus_factor, collective_s
from models.workload import Workload

W7 = Workload(load_architecture("llama-2-7b"), 4096)
P7 = count_params(W7).trainable
T7 = count_params(W7).trainable_tensors
LLAMA_MODULES_PER_LAYER = 9  # q, k, v, o, gate, up, down, two RMSNorms: a module each, one weight each
# The formulas below are checked by hand on gh200 at unit efficiencies, each collective one
# alpha-beta pair whatever the group size, and host copies at one rate whatever their size.
FLAT_LINK = {"x_unit": "bytes", "y_unit": "bytes/s", "x": [1.0], "y": [386e9], "source": "a flat link for the tests"}
# The steps per tensor off unless a test turns them on: the formulas leave them out; so is the host's
# issue speed (the issue constants then hold as fitted, at `overheads.issue_fitted_at_per_layer`).
PLAIN = {"overheads.compute_efficiency": 1.0, "overheads.zero12_step_per_tensor": 0.0, "host.issue_per_layer": None,
         "overheads.step_per_tensor": 0.0,
         "host.h2d": FLAT_LINK, "host.d2h": FLAT_LINK,
         **{f"{net}.{op}.by_group_size": [] for net in ("intra_node", "inter_node")
            for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")}}


def _with(values: dict) -> object:
    return profile_with({**PLAIN, **values})


@pytest.fixture(scope="module")
def gh200():
    return _with({})


def _phases(strategy: Strategy, profile, workload=W7) -> dict[str, float]:
    return {p.name: p.time_s for p in predict(workload, strategy, profile).breakdown}


def _cpu_adam_s(strategy: Strategy, profile, workload=W7) -> float:
    """The cpu_optimizer phase less the parameter cast that ZeRO-1/2 adds to it (tested on its own below)."""
    params_per_rank = count_params(workload).trainable / strategy.gpus
    ranks = min(strategy.gpus, strategy.gpus_per_node)
    threads = strategy.cpu_threads_per_rank or float(profile.host.default_threads_per_rank(ranks))
    cast = params_per_rank / float(profile.host.param_cast_rate(threads)) if strategy.zero_stage <= 2 else 0.0
    return _phases(strategy, profile, workload)["cpu_optimizer"] - cast


def _coll(profile, op, total_bytes, calls, n, net="intra_node"):
    c = getattr(getattr(profile, net), op)
    return calls * c.alpha.value + float(bus_factor(op, n)) * total_bytes / c.bus_bandwidth.value


def test_phases_are_the_contract_names_and_sum_to_the_step_time(gh200):
    out = predict_batch(W7, random_batch(2000), gh200)
    assert set(out.phase_time_s) == set(PHASES)
    total = sum(out.phase_time_s.values())
    np.testing.assert_allclose(total, out.step_time_s, rtol=1e-12)
    for name, t in out.phase_time_s.items():
        assert np.all(t >= 0), name


def test_gemm_time_follows_the_profile_curve_at_each_shape(gh200):
    work = micro_step_work(W7, 1, 1, 0)
    expected = sum(float((g.fwd_flops + g.bwd_flops) / gh200.gpu.gemm_bf16(g.flops_per_call)) for g in work.gemms)
    ph = _phases(Strategy(gpus=1, gpus_per_node=1), gh200)
    assert ph["compute"] == pytest.approx(expected, rel=1e-12)
    slow = _with({"overheads.compute_efficiency": 0.5})
    assert _phases(Strategy(gpus=1, gpus_per_node=1), slow)["compute"] == pytest.approx(2 * expected, rel=1e-12)


def _head_dim_ratio(at_64: float) -> dict:
    return {"x_unit": "head_dim", "y_unit": "ratio", "x": [64.0, 128.0], "y": [at_64, 1.0], "source": "test"}


def test_attention_runs_at_the_measured_rate_of_its_head_dim_whatever_the_gemm_efficiency():
    head_64 = Workload(load_architecture("tinyllama-1.1b"), 32768)
    one = Strategy(gpus=1, gpus_per_node=1)

    def attention_s(workload, at_64, efficiency=1.0):
        ratio = _head_dim_ratio(at_64)
        profile = _with({"gpu.attention_fwd_head_dim_ratio": ratio, "gpu.attention_bwd_head_dim_ratio": ratio,
                         "overheads.compute_efficiency": efficiency})
        return _phases(one, profile, workload)["attention"]

    assert attention_s(head_64, 0.5) == pytest.approx(2 * attention_s(head_64, 1.0), rel=1e-12)
    assert attention_s(W7, 0.5) == pytest.approx(attention_s(W7, 1.0), rel=1e-12)  # head dim 128
    assert attention_s(head_64, 0.8, efficiency=0.5) == pytest.approx(attention_s(head_64, 0.8), rel=1e-12)


def test_zero0_all_reduces_gradients_once_per_step_exposed(gh200):
    s = Strategy(gpus=4, gpus_per_node=4, zero_stage=0, grad_accum=3, overlap_comm=True)
    calls = math.ceil(P7 / s.reduce_bucket_size)
    assert _phases(s, gh200)["zero_comm"] == pytest.approx(_coll(gh200, "all_reduce", 2 * P7, calls, 4))


def test_zero1_reduces_once_per_step_and_zero2_every_micro_step(gh200):
    rs = _coll(gh200, "reduce_scatter", 2 * P7, math.ceil(P7 / 500_000_000), 4)
    ag = _coll(gh200, "all_gather", 2 * P7, math.ceil(P7 / 500_000_000), 4)
    z1 = Strategy(gpus=4, gpus_per_node=4, zero_stage=1, grad_accum=4, overlap_comm=False)
    z2 = Strategy(gpus=4, gpus_per_node=4, zero_stage=2, grad_accum=4, overlap_comm=False)
    assert _phases(z1, gh200)["zero_comm"] == pytest.approx(rs + ag)
    assert _phases(z2, gh200)["zero_comm"] == pytest.approx(4 * rs + ag)


def test_zero3_gathers_in_forward_backward_and_recompute_every_micro_step(gh200):
    c = count_params(W7)
    s = Strategy(gpus=4, gpus_per_node=4, zero_stage=3, grad_accum=2, checkpoint_every=1, overlap_comm=False)
    per_micro = (
        _coll(gh200, "all_gather", 2 * P7, c.modules_llm, 4)
        + _coll(gh200, "all_gather", 2 * P7, c.modules_llm, 4)
        + _coll(gh200, "all_gather", 2 * 32 * c.layer, 32 * LLAMA_MODULES_PER_LAYER, 4)
        + _coll(gh200, "reduce_scatter", 2 * P7, math.ceil(P7 / 500_000_000), 4)
    )
    assert _phases(s, gh200)["zero_comm"] == pytest.approx(2 * per_micro)


def test_groups_spanning_nodes_use_the_inter_node_network(gh200):
    one = Strategy(gpus=4, gpus_per_node=4, zero_stage=2, overlap_comm=False)
    two = Strategy(gpus=4, gpus_per_node=2, zero_stage=2, overlap_comm=False)
    calls = math.ceil(P7 / 500_000_000)
    inter = (_coll(gh200, "reduce_scatter", 2 * P7, calls, 4, "inter_node")
             + _coll(gh200, "all_gather", 2 * P7, calls, 4, "inter_node"))
    assert _phases(two, gh200)["zero_comm"] == pytest.approx(inter)
    assert _phases(two, gh200)["zero_comm"] > 3 * _phases(one, gh200)["zero_comm"]


def test_overlap_window_two_regimes_and_continuity():
    p = _with({"overlap.compute_slowdown_with_collective": 0.2,
                      "overlap.collective_slowdown_with_compute": 0.5,
                      "overlap.compute_slowdown_with_copy": 0.0})
    on = np.array([True])
    # communication ends first: hidden, compute pays X(1+s)c/(1+c)
    w = _overlap(p, np.array([10.0]), np.array([2.0]), np.array([0.0]), on)
    assert float(w.contention[0]) == pytest.approx(3.0 * 0.2 / 1.2)
    assert float(w.exposed_collective[0]) == 0.0
    # compute ends first: slowed throughout (0.2), then the rest of the collective alone
    w = _overlap(p, np.array([1.0]), np.array([10.0]), np.array([0.0]), on)
    assert float(w.contention[0]) == pytest.approx(0.2)
    assert float(w.exposed_collective[0]) == pytest.approx(10.0 - 1.2 / 1.5)
    # at the boundary X(1+s) = C(1+c) both regimes give the same window
    c, x = 1.5, 1.2
    lo = _overlap(p, np.array([c]), np.array([x * (1 - 1e-9)]), np.array([0.0]), on)
    hi = _overlap(p, np.array([c]), np.array([x * (1 + 1e-9)]), np.array([0.0]), on)
    assert float(lo.extra[0]) == pytest.approx(float(hi.extra[0]), rel=1e-6)
    # copies do not slow compute here, and nothing overlaps without overlap_comm
    w = _overlap(p, np.array([10.0]), np.array([0.0]), np.array([2.0]), on)
    assert float(w.extra[0]) == 0.0
    w = _overlap(p, np.array([10.0]), np.array([2.0]), np.array([1.0]), np.array([False]))
    assert (float(w.exposed_collective[0]), float(w.exposed_copy[0]), float(w.contention[0])) == (2.0, 1.0, 0.0)


def test_overlap_comm_hides_zero3_traffic_behind_long_compute(gh200):
    w = Workload(load_architecture("llama-2-7b"), 32768)
    on = _phases(Strategy(gpus=4, gpus_per_node=4, zero_stage=3, checkpoint_every=1), gh200, w)
    off = _phases(Strategy(gpus=4, gpus_per_node=4, zero_stage=3, checkpoint_every=1, overlap_comm=False), gh200, w)
    assert on["zero_comm"] == 0.0 and on["overlap_contention"] > 0
    assert off["overlap_contention"] == 0.0 and off["zero_comm"] > on["overlap_contention"]
    # short sequences across nodes: compute is too short to hide the gathers
    short = Workload(load_architecture("llama-2-7b"), 512)
    far = _phases(Strategy(gpus=8, gpus_per_node=4, zero_stage=3), gh200, short)
    assert far["zero_comm"] > 0


@pytest.mark.parametrize("sp, ck, ga", [(2, 0, 1), (4, 1, 2), (2, 4, 3)])
def test_ulysses_four_all_to_alls_per_layer_each_way_and_in_recompute(sp, ck, ga):
    """Counted by their latency: the time at bandwidth B less its bandwidth term, which halving B doubles."""
    fast, slow = (_with({f"{net}.all_to_all.bus_bandwidth": bw for net in ("intra_node", "inter_node")})
                  for bw in (1e14, 5e13))
    alpha = fast.intra_node.all_to_all.alpha.value
    s = Strategy(gpus=4, gpus_per_node=4, sp=sp, checkpoint_every=ck, grad_accum=ga)
    recomputed = 0 if ck == 0 else math.ceil(32 / ck)
    latency_s = 2 * _phases(s, fast)["ulysses_all_to_all"] - _phases(s, slow)["ulysses_all_to_all"]
    assert latency_s == pytest.approx(ga * 4 * (2 * 32 + recomputed) * alpha)
    assert _phases(Strategy(gpus=4, gpus_per_node=4, sp=1), fast)["ulysses_all_to_all"] == 0.0


def test_cpu_optimizer_time_shares_the_node_rate_between_its_ranks(gh200):
    rate = gh200.host.cpu_adam.value
    z2 = Strategy(gpus=4, gpus_per_node=4, zero_stage=2, offload_optimizer="cpu")
    assert _cpu_adam_s(z2, gh200) == pytest.approx(P7 / 4 * 4 / rate)
    z3 = Strategy(gpus=8, gpus_per_node=4, zero_stage=3, offload_optimizer="cpu")
    assert _cpu_adam_s(z3, gh200) == pytest.approx(P7 / 8 * 4 / rate)
    # one GPU of the node: its rank gets one GPU's share of the cores, no more, without a measured curve
    z2_one = Strategy(gpus=1, gpus_per_node=4, zero_stage=2, offload_optimizer="cpu")
    assert _cpu_adam_s(z2_one, gh200) == pytest.approx(P7 * 4 / rate)


THREADS_CURVE = {"x_unit": "threads", "y_unit": "params/s", "x": [1.0, 4.0, 16.0], "y": [3e8, 1e9, 2e9],
                 "source": "test"}


def test_threads_per_rank_set_the_cpu_optimizer_and_deepspeed_host_work():
    """One thread per rank (torchrun's default) against the cores shared out: CPUAdam at the measured
    curve's rate, and DeepSpeed's host-side offload work slowed by the same ratio from the threads
    the overheads were fitted at (the profile's default: 32 cores / 2 GPUs = 16)."""
    profile = _with({"host.cpu_adam_threads": THREADS_CURVE, "host.cores": 32.0, "gpus_per_node": 2.0,
                            "overheads.offload_step_per_gparam": 0.2})
    s16 = Strategy(gpus=2, gpus_per_node=2, zero_stage=2, offload_optimizer="cpu", cpu_threads_per_rank=16)
    s1 = Strategy(gpus=2, gpus_per_node=2, zero_stage=2, offload_optimizer="cpu", cpu_threads_per_rank=1)
    default = Strategy(gpus=2, gpus_per_node=2, zero_stage=2, offload_optimizer="cpu")
    p16, p1, pd = (_phases(s, profile) for s in (s16, s1, default))
    assert _cpu_adam_s(s16, profile) == pytest.approx(P7 / 2 / 2e9) and pd == p16  # the default is 16 here
    assert _cpu_adam_s(s1, profile) == pytest.approx(P7 / 2 / 3e8)
    host_work = p1["deepspeed_overhead"] - p16["deepspeed_overhead"]
    assert host_work == pytest.approx(0.2 * P7 / 2 / 1e9 * (2e9 / 3e8 - 1))
    s4 = Strategy(gpus=2, gpus_per_node=2, zero_stage=2, offload_optimizer="cpu", cpu_threads_per_rank=4)
    assert _cpu_adam_s(s4, profile) == pytest.approx(P7 / 2 / 1e9)


def test_superoffload_hides_all_but_the_last_sub_group_behind_the_backward():
    # Without DeepSpeed's fitted per-parameter offload overheads, which differ between the two modes.
    gh200 = _with({"overheads.offload_step_per_gparam": 0.0, "overheads.super_offload_step_per_gparam": 0.0})
    w = Workload(load_architecture("llama-2-7b"), 32768)
    sync = predict(w, Strategy(gpus=4, gpus_per_node=4, zero_stage=3, offload_optimizer="cpu",
                               checkpoint_every=1), gh200)
    sup = predict(w, Strategy(gpus=4, gpus_per_node=4, zero_stage=3, offload_optimizer="cpu", super_offload=True,
                              checkpoint_every=1), gh200)
    t_sync = {p.name: p.time_s for p in sync.breakdown}["cpu_optimizer"]
    t_sup = {p.name: p.time_s for p in sup.breakdown}["cpu_optimizer"]
    assert P7 / 4 > 1e9  # two sub-groups per rank: the first one's step hides behind the backward
    assert t_sup == pytest.approx(t_sync / 2)
    assert sup.step_time_s < sync.step_time_s
    # a rank with a single sub-group cannot start its CPU step before the backward ends
    small = Workload(load_architecture("qwen2.5-1.5b"), 8192)
    a = _phases(Strategy(gpus=4, gpus_per_node=4, zero_stage=3, offload_optimizer="cpu"), gh200, small)
    b = _phases(Strategy(gpus=4, gpus_per_node=4, zero_stage=3, offload_optimizer="cpu", super_offload=True),
                gh200, small)
    assert a["cpu_optimizer"] == pytest.approx(b["cpu_optimizer"])


def test_optimizer_offload_moves_gradients_down_and_parameters_up(gh200):
    assert gh200.host.param_direct_upload_threads is None
    rate = float(gh200.host.d2h(1e9))
    assert rate == float(gh200.host.h2d(1e9))  # PLAIN's links are flat: one rate for both
    per_byte = P7 / 4 / rate  # seconds per byte per parameter of a rank's partition
    # ZeRO-2: fp32 gradients down at the boundary (4 bytes), bf16 parameters up after the step (2)
    s = Strategy(gpus=4, gpus_per_node=4, zero_stage=2, offload_optimizer="cpu", overlap_comm=False)
    assert _phases(s, gh200)["host_transfer"] == pytest.approx((4 + 2) * per_byte)
    # ... and with accumulation a bf16 round trip through the host every micro-step but the last,
    # plus the read-back before the boundary's fp32 copy
    s = Strategy(gpus=4, gpus_per_node=4, zero_stage=2, offload_optimizer="cpu", overlap_comm=False, grad_accum=3)
    assert _phases(s, gh200)["host_transfer"] == pytest.approx((2 * 4 + 2 + 4 + 2) * per_byte)
    # ZeRO-3: the bf16 gradient partition buffer (host) is written and read back every
    # micro-step, fp32 gradients go down at the boundary, bf16 parameters come up after the step
    # (directly, through pageable memory: without a measured rate, the cast then a pinned upload)
    s3 = Strategy(gpus=4, gpus_per_node=4, zero_stage=3, offload_optimizer="cpu", overlap_comm=False, grad_accum=3)
    cast = P7 / 4 / float(gh200.host.param_cast_rate(gh200.host.default_threads_per_rank(4)))
    assert _phases(s3, gh200)["host_transfer"] == pytest.approx((3 * 4 + 4 + 2) * per_byte + cast)
    # parameter offload: nothing comes back after the step, the partition comes up every pass instead
    sp = Strategy(gpus=4, gpus_per_node=4, zero_stage=3, offload_optimizer="cpu", offload_param="cpu",
                  overlap_comm=False)
    assert _phases(sp, gh200)["host_transfer"] == pytest.approx((4 + 4) * per_byte + 2 * 2 * per_byte)


def test_zero2_offloads_accumulation_round_trip_is_waited_on_even_with_overlap(gh200):
    """Each parameter's hook waits for the previous one's copies (DeepSpeed 0.19.8): ZeRO-2 offload's
    round trip through the host buffer adds to the backward with overlap_comm on, where ZeRO-3
    offload's gradient copies hide behind a long backward."""
    per_byte = P7 / 4 / float(gh200.host.d2h(1e9))
    long_steps = Workload(load_architecture("llama-2-7b"), 32768)

    def transfer(stage, ga):
        s = Strategy(gpus=4, gpus_per_node=4, zero_stage=stage, offload_optimizer="cpu", grad_accum=ga)
        return _phases(s, gh200, long_steps)["host_transfer"]

    assert transfer(2, 3) - transfer(2, 1) == pytest.approx((2 * 4 + 2) * per_byte)
    assert transfer(3, 3) == pytest.approx(transfer(3, 1), rel=1e-6)


def test_cpu_checkpointing_copies_hide_behind_the_pass_they_ride_on_and_only_the_rest_is_exposed(gh200):
    """Each checkpoint goes down in forward and comes back in backward on DeepSpeed's copy stream: at
    C2C speed 7B's 4k checkpoints take 3 ms each way against a forward of a tenth of a second, and the
    step is that of GPU checkpointing; over a link 1,000 times slower only the copies' excess over each
    pass is exposed."""
    s = Strategy(gpus=1, gpus_per_node=1, checkpoint_every=1, cpu_checkpointing=True, grad_accum=2)
    on_gpu = Strategy(gpus=1, gpus_per_node=1, checkpoint_every=1, grad_accum=2)
    assert _phases(s, gh200)["host_transfer"] == 0.0
    assert predict(W7, s, gh200).step_time_s == pytest.approx(predict(W7, on_gpu, gh200).step_time_s)
    slow = _with({"host.h2d": {**FLAT_LINK, "y": [386e6]}, "host.d2h": {**FLAT_LINK, "y": [386e6]}})
    ckpt = 4096 * 2 * 4096 * 32  # tokens x bf16 x hidden x layers
    phases = _phases(s, slow)
    forward = (phases["compute"] + phases["attention"] + phases["elementwise"]) / 2 / 3  # a third of fwd+bwd
    backward = 2 * forward + phases["recompute"] / 2
    expected = 2 * (ckpt / 386e6 - forward + ckpt / 386e6 - backward)
    assert phases["host_transfer"] == pytest.approx(expected, rel=0.02)


def test_deepspeed_overheads_add_per_step_micro_step_and_offloaded_parameter():
    p = _with({"overheads.step": 0.5, "overheads.micro_step": 0.01, "overheads.zero3_module_pass": 0.0,
                      "overheads.offload_step_per_gparam": 0.2, "overheads.offload_step_serial_per_gparam": 0.0,
                      "overheads.zero3_offload_step_per_tensor": 0.0, "overheads.layer_pass": 0.0})
    s = Strategy(gpus=4, gpus_per_node=4, zero_stage=3, offload_optimizer="cpu", grad_accum=2)
    assert _phases(s, p)["deepspeed_overhead"] == pytest.approx(0.5 + 2 * 0.01 + 0.2 * P7 / 4 / 1e9)
    z2 = Strategy(gpus=4, gpus_per_node=4, zero_stage=2, grad_accum=2)
    assert _phases(z2, p)["deepspeed_overhead"] == pytest.approx(0.5 + 0.02)


def test_the_serial_part_of_offload_host_work_does_not_speed_up_with_threads():
    def overhead_s(threads, serial, threaded):
        p = _with({"overheads.step": 0.0, "overheads.micro_step": 0.0, "overheads.zero3_module_pass": 0.0,
                   "overheads.layer_pass": 0.0, "overheads.offload_step_per_gparam": threaded,
                   "overheads.offload_step_serial_per_gparam": serial})
        s = Strategy(gpus=1, gpus_per_node=1, zero_stage=2, offload_optimizer="cpu", cpu_threads_per_rank=threads)
        return _phases(s, p)["deepspeed_overhead"]

    assert overhead_s(1, 0.3, 0.0) == pytest.approx(overhead_s(16, 0.3, 0.0)) == pytest.approx(0.3 * P7 / 1e9)
    assert overhead_s(1, 0.0, 0.3) > 2 * overhead_s(16, 0.0, 0.3)  # the threaded part does
    super_offload = Strategy(gpus=1, gpus_per_node=1, zero_stage=3, offload_optimizer="cpu", super_offload=True)
    p = _with({"overheads.offload_step_serial_per_gparam": 0.3})
    assert _phases(super_offload, p)["deepspeed_overhead"] == pytest.approx(
        _phases(super_offload, _with({"overheads.offload_step_serial_per_gparam": 0.0}))["deepspeed_overhead"])


def test_zero3s_offload_step_adds_serial_host_time_per_tensor_that_zero2s_and_super_offload_do_not():
    """stage3.py walks its sub-groups' parameters in Python, a tensor at a time, where ZeRO-1/2 step one flat
    partition."""
    def overhead_s(strategy, zero3_extra):
        p = _with({"overheads.step": 0.0, "overheads.micro_step": 0.0, "overheads.zero3_module_pass": 0.0,
                   "overheads.layer_pass": 0.0, "overheads.offload_step_per_gparam": 0.0,
                   "overheads.offload_step_serial_per_gparam": 0.1, "overheads.super_offload_step_per_gparam": 0.5,
                   "overheads.zero3_offload_step_per_tensor": zero3_extra})
        return _phases(strategy, p)["deepspeed_overhead"]

    def offload(stage, threads=16, super_offload=False):
        return Strategy(gpus=1, gpus_per_node=1, zero_stage=stage, offload_optimizer="cpu",
                        cpu_threads_per_rank=threads, super_offload=super_offload)

    assert overhead_s(offload(3), 2e-4) == pytest.approx(0.1 * P7 / 1e9 + 2e-4 * T7)
    assert overhead_s(offload(3, threads=1), 2e-4) == pytest.approx(overhead_s(offload(3), 2e-4))  # serial
    assert overhead_s(offload(2), 2e-4) == pytest.approx(overhead_s(offload(2), 0.0)) == pytest.approx(0.1 * P7 / 1e9)
    assert overhead_s(offload(3, super_offload=True), 2e-4) == pytest.approx(
        overhead_s(offload(3, super_offload=True), 0.0))


def test_zero3_hooks_are_host_issue_time_hidden_only_behind_longer_gpu_work():
    small = Workload(load_architecture("qwen2.5-0.5b"), 2048)
    c = count_params(small)
    p = _with({"overheads.step": 0.0, "overheads.micro_step": 0.0, "overheads.layer_pass": 0.0,
               "overheads.zero3_module_pass": 1e-3, "overheads.zero12_grad_hook": 0.0,
               "overheads.zero3_host_serial": 0.0})
    z3 = _phases(Strategy(zero_stage=3), p, small)
    host_s = 2 * c.modules_llm * 1e-3  # fetch/release hooks of every module, forward and backward
    gpu_s = sum(v for k, v in z3.items() if k != "deepspeed_overhead")
    assert host_s - gpu_s < z3["deepspeed_overhead"] < host_s
    assert _phases(Strategy(zero_stage=2), p, small)["deepspeed_overhead"] == 0.0  # no hooks below ZeRO-3
    big = _phases(Strategy(zero_stage=3, gpus=4, gpus_per_node=4), p, Workload(load_architecture("llama-2-7b"), 32768))
    assert big["deepspeed_overhead"] < 0.01 * 2 * c.modules_llm * 1e-3


def _step_timing(strategy: Strategy, profile, workload):
    from models import memory, timing
    from models.strategy import StrategyBatch

    b = StrategyBatch.from_strategies([strategy])
    work = micro_step_work(workload, b.micro_batch, b.sp, b.checkpoint_every, profile.gpu.layer_elementwise,
                           profile.gpu.vision_elementwise)
    counts = count_params(workload)
    return timing.step_timing(workload, counts, work, memory.estimate(workload, counts, work, b, profile), b, profile)


def test_zero3s_hook_waits_are_the_hooks_share_of_the_issue_wait_in_one_gap_a_module_pass():
    """The energy model heats ZeRO-3's hook waits (models.energy): they are the share of the GPU's
    issue wait that the module hooks take of the host's issue time, in one gap a module pass."""
    small = Workload(load_architecture("qwen2.5-0.5b"), 2048)
    c = count_params(small)
    hooks_only = {"overheads.step": 0.0, "overheads.micro_step": 0.0, "overheads.layer_pass": 0.0,
                  "overheads.zero3_module_pass": 1e-3, "overheads.zero12_grad_hook": 0.0,
                  "overheads.zero3_host_serial": 0.0}
    t = _step_timing(Strategy(zero_stage=3, grad_accum=2), _with(hooks_only), small)
    assert float(t.host_issue_wait_s[0]) > 0.0
    assert float(t.hook_wait_s[0]) == pytest.approx(float(t.host_issue_wait_s[0]))
    assert float(t.hook_gaps[0]) == 2 * 2 * c.modules_llm  # forward and backward, two micro-steps
    # layer passes that take the host as long as the hooks, in each pass alike: half of the wait is the hooks'
    layers = small.arch.num_layers
    half = _with({**hooks_only, "overheads.layer_pass": 1e-3 * c.modules_llm / layers, "host.pass_issue": None,
                  "host.zero3_hook_pass": None})
    t = _step_timing(Strategy(zero_stage=3), half, small)
    assert float(t.hook_wait_s[0]) == pytest.approx(0.5 * float(t.host_issue_wait_s[0]))
    z2 = _step_timing(Strategy(zero_stage=2), half, small)
    assert float(z2.host_issue_wait_s[0]) > 0.0 == float(z2.hook_wait_s[0]) == float(z2.hook_gaps[0])


def test_host_issue_floor_shows_only_when_the_gpu_work_is_shorter():
    p = _with({"overheads.step": 0.0, "overheads.micro_step": 0.0, "overheads.layer_pass": 3e-3})
    small = Workload(load_architecture("qwen2.5-0.5b"), 2048)  # GPU work ~10 ms per micro-step
    one, four = (_phases(Strategy(grad_accum=ga), p, small)["deepspeed_overhead"] for ga in (1, 4))
    host_s = 3e-3 * (1 + p.host.pass_issue.backward.value) * 24  # forward and backward of 24 layers
    gpu_s = sum(v for k, v in _phases(Strategy(), p, small).items() if k != "deepspeed_overhead")
    assert host_s - gpu_s < one < host_s  # the GPU waits for most of the host's issue time
    assert four == pytest.approx(4 * one, rel=0.05)  # once per micro-step
    big = Workload(load_architecture("llama-2-7b"), 32768)  # seconds of GPU work per micro-step
    hidden = _phases(Strategy(), p, big)["deepspeed_overhead"]
    assert hidden < 1e-3 * host_s


def test_vision_phases_frozen_and_trained(gh200):
    a = load_architecture("qwen2.5-vl-7b")
    frozen = Workload(a, 32768, frames=32)
    trained = Workload(a, 32768, frames=32, train_vision=True)
    s = Strategy(gpus=4, gpus_per_node=4, zero_stage=3, checkpoint_every=1)
    f, t = _phases(s, gh200, frozen), _phases(s, gh200, trained)
    assert f["vision_compute"] > 0 and f["vision_recompute"] == 0.0
    assert t["vision_recompute"] > 0
    assert t["vision_compute"] > 2 * f["vision_compute"]  # backward through the encoder
    assert _phases(s, gh200, Workload(a, 32768))["vision_compute"] == 0.0


def test_zero3_host_issue_overlaps_less_on_several_gpus():
    """zero3_host_serial: on several GPUs ZeRO-3's host waits on fetch and reduce events, so a
    share of the shorter of host issue and GPU work is exposed. One GPU gathers nothing; once the
    host's issue time far outlasts the GPU's work, the exposed share stops growing with it (at
    512 tokens, all host, H200 took as long on 2 GPUs as on 1)."""
    a = load_architecture("qwen2.5-1.5b")
    w = Workload(a, 8192)
    one, two = Strategy(zero_stage=3, checkpoint_every=1), Strategy(zero_stage=3, gpus=2, checkpoint_every=1)

    def added(strategy, layer_pass):
        base = {"overheads.step": 0.0, "overheads.micro_step": 0.0, "overheads.layer_pass": layer_pass}
        flat, serial = _with(base), _with(dict(base, **{"overheads.zero3_host_serial": 0.5}))
        return predict(w, strategy, serial).step_time_s - predict(w, strategy, flat).step_time_s

    assert added(one, 1e-3) == pytest.approx(0.0)
    assert added(two, 1e-3) > 0
    assert added(two, 1.0) == pytest.approx(added(two, 10.0), rel=1e-3)  # bounded by the GPU's work
    assert added(two, 1e-6) < added(two, 1e-3)  # and by the host's
    plain = _with({})
    assert _phases(Strategy(zero_stage=2, gpus=2), _with({"overheads.zero3_host_serial": 0.5}), w) == _phases(
        Strategy(zero_stage=2, gpus=2), plain, w)  # ZeRO-1/2: no such events


def test_zero12_gradient_hooks_are_host_issue_time():
    """zero12_grad_hook: one Python hook per parameter tensor in each ZeRO-1/2 backward; ZeRO-0
    has none. Exposed where the host outlasts the GPU (a small model at 2k tokens)."""
    base = {"overheads.step": 0.0, "overheads.micro_step": 0.0, "overheads.layer_pass": 1e-3}
    plain, hooked = _with(base), _with(dict(base, **{"overheads.zero12_grad_hook": 2e-4}))
    w = Workload(load_architecture("qwen2.5-0.5b"), 2048)
    for stage, grows in ((0, False), (1, True), (2, True)):
        s = Strategy(zero_stage=stage)
        more = _phases(s, hooked, w)["deepspeed_overhead"] - _phases(s, plain, w)["deepspeed_overhead"]
        assert (more > 0) == grows, stage
    modules = count_params(w).modules_llm
    s = Strategy(zero_stage=2)
    assert _phases(s, hooked, w)["deepspeed_overhead"] - _phases(s, plain, w)["deepspeed_overhead"] <= modules * 2e-4


def test_zero1_hooks_work_only_at_the_accumulation_boundary():
    """ZeRO-2's hooks reduce every micro-step's gradients, ZeRO-1's only the last micro-step's: at
    four micro-batches of a host-bound step, ZeRO-1 pays the hooks once and ZeRO-2 four times."""
    base = {"overheads.step": 0.0, "overheads.micro_step": 0.0, "overheads.layer_pass": 1e-3}
    plain, hooked = _with(base), _with(dict(base, **{"overheads.zero12_grad_hook": 2e-4}))
    w = Workload(load_architecture("qwen2.5-0.5b"), 512)

    def hooks_s(stage, grad_accum):
        s = Strategy(zero_stage=stage, grad_accum=grad_accum)
        return _phases(s, hooked, w)["deepspeed_overhead"] - _phases(s, plain, w)["deepspeed_overhead"]

    assert hooks_s(1, 1) == pytest.approx(hooks_s(2, 1))
    assert hooks_s(1, 4) == pytest.approx(hooks_s(1, 1))
    assert hooks_s(2, 4) == pytest.approx(4 * hooks_s(2, 1))


def test_zero12_step_visits_every_trainable_tensor_on_the_host():
    """zero12_step_per_tensor: ZeRO-1/2's step without offload (overflow check, norm, partition copy
    of every trainable tensor); a trained vision tower's tensors count, a frozen one's do not. ZeRO-3
    and optimizer offload take other paths."""
    base = {"overheads.zero12_step_per_tensor": 0.0}
    plain, per_tensor = _with(base), _with({"overheads.zero12_step_per_tensor": 1e-4})
    arch = load_architecture("qwen2.5-vl-7b")

    def added(strategy, workload):
        return (_phases(strategy, per_tensor, workload)["deepspeed_overhead"]
                - _phases(strategy, plain, workload)["deepspeed_overhead"])

    frozen, trained = (Workload(arch, 8192, images=4, train_vision=t) for t in (False, True))
    z2 = Strategy(zero_stage=2)
    scale = float(per_tensor.host_issue_scale)
    assert added(z2, frozen) == pytest.approx(scale * 1e-4 * count_params(frozen).trainable_tensors)
    assert count_params(trained).trainable_tensors - count_params(frozen).trainable_tensors == 27 * 12 + 5
    assert added(z2, trained) > added(z2, frozen) > 0
    assert added(Strategy(zero_stage=1), frozen) == pytest.approx(added(z2, frozen))
    for other in (Strategy(zero_stage=3), Strategy(zero_stage=2, offload_optimizer="cpu"), Strategy(zero_stage=0)):
        assert added(other, frozen) == 0.0, other.label()


def test_every_step_outside_zero3_visits_every_trainable_tensor_on_the_host():
    """step_per_tensor: ZeRO-0's optimizer and ZeRO-1/2's step alike walk each trainable
    tensor, at the host's issue speed; ZeRO-1/2 pay their own per-tensor work on top. ZeRO-3 steps
    flat partitions and offload steps on the CPU: neither pays it."""
    anchor = {"overheads.issue_fitted_at_per_layer": 100e-6}
    plain, per_tensor = _with(anchor), _with({**anchor, "overheads.step_per_tensor": 2e-4})
    both = _with({**anchor, "overheads.step_per_tensor": 2e-4, "overheads.zero12_step_per_tensor": 1e-4})
    w = Workload(load_architecture("qwen2.5-0.5b"), 1024)
    tensors = count_params(w).trainable_tensors
    scale = float(per_tensor.host_issue_scale)

    def added(strategy, profile):
        return (_phases(strategy, profile, w)["deepspeed_overhead"]
                - _phases(strategy, plain, w)["deepspeed_overhead"])

    for stage in (0, 1, 2):
        assert added(Strategy(zero_stage=stage), per_tensor) == pytest.approx(scale * 2e-4 * tensors), stage
    assert added(Strategy(zero_stage=2), both) == pytest.approx(scale * 3e-4 * tensors)
    assert added(Strategy(zero_stage=0), both) == pytest.approx(scale * 2e-4 * tensors)
    for other in (Strategy(zero_stage=3), Strategy(zero_stage=2, offload_optimizer="cpu")):
        assert added(other, per_tensor) == 0.0, other.label()
    slower_host, slower_plain = per_tensor.on_host(200e-6), plain.on_host(200e-6)  # twice the anchor's time
    z0 = Strategy(zero_stage=0)
    assert (_phases(z0, slower_host, w)["deepspeed_overhead"] - _phases(z0, slower_plain, w)["deepspeed_overhead"]
            == pytest.approx(2 * 2e-4 * tensors))


def test_collectives_use_the_bandwidth_measured_for_their_group_size(gh200):
    data = gh200.model_dump()
    ag = data["intra_node"]["all_gather"]
    q = lambda v, u: {"value": v, "unit": u, "source": "test"}  # noqa: E731
    ag["by_group_size"] = [{"group_size": q(2, "count"), "alpha": q(30e-6, "s"), "bus_bandwidth": q(200e9, "bytes/s")},
                           {"group_size": q(8, "count"), "alpha": q(60e-6, "s"), "bus_bandwidth": q(400e9, "bytes/s")}]
    p = parse_profile(data, origin="test")
    at = lambda n: float(collective_s(p, "all_gather", 2**30, 1, n, True))  # noqa: E731
    assert at(2) == pytest.approx(30e-6 + 0.5 * 2**30 / 200e9)
    assert at(8) == pytest.approx(60e-6 + 0.875 * 2**30 / 400e9)
    assert at(4) == pytest.approx(45e-6 + 0.75 * 2**30 / 300e9)  # halfway in log2
    assert at(16) == pytest.approx(60e-6 + (15 / 16) * 2**30 / 400e9)  # held beyond the range


def test_ranks_of_a_node_share_its_memory_bandwidth_for_the_cpu_optimizer():
    """CPUAdam is memory-bound: 4 ranks of 16 threads step at the all-core rate over 4 however fast
    16 threads are alone (on the 4-GPU H200 node that took 7B's ZeRO-2 offload step from -45% to -15%)."""
    profile = _with({"host.cpu_adam_threads": THREADS_CURVE, "host.cores": 64.0, "gpus_per_node": 4.0,
                            "host.cpu_adam": 4e9})
    four = Strategy(gpus=4, gpus_per_node=4, zero_stage=2, offload_optimizer="cpu", cpu_threads_per_rank=16)
    one = Strategy(gpus=1, gpus_per_node=4, zero_stage=2, offload_optimizer="cpu", cpu_threads_per_rank=16)
    assert _cpu_adam_s(four, profile) == pytest.approx(P7 / 4 / (4e9 / 4))  # the shared ceiling
    assert _cpu_adam_s(one, profile) == pytest.approx(P7 / 2e9)  # its threads bound it alone


CAST_CURVE = {"x_unit": "threads", "y_unit": "params/s", "x": [1.0, 16.0], "y": [1e9, 1e10], "source": "test"}
DIRECT_CURVE = {"x_unit": "threads", "y_unit": "params/s", "x": [1.0, 16.0], "y": [5e8, 2e9], "source": "test"}


@pytest.mark.parametrize("threads", [1, 16])
def test_the_parameter_refresh_takes_deepspeeds_path_for_each_stage(threads):
    """ZeRO-1/2 cast on the CPU then upload pinned; ZeRO-3 copies directly (its measured rate, cast
    included, in host_transfer); with parameter offload the cast is all. Each at the rank's threads."""
    profile = _with({"host.param_cast_threads": CAST_CURVE, "host.param_direct_upload_threads": DIRECT_CURVE,
                     "overheads.offload_step_per_gparam": 0.0})
    cast, direct = (float(c["y"][0] if threads == 1 else c["y"][1]) for c in (CAST_CURVE, DIRECT_CURVE))
    per_rank, pinned = P7 / 2, float(profile.host.h2d(1e9))

    def phases(**kw):
        s = Strategy(gpus=2, gpus_per_node=2, overlap_comm=False, offload_optimizer="cpu", cpu_threads_per_rank=threads,
                     **kw)
        adam = per_rank / float(profile.host.cpu_adam_per_rank(threads, 2, profile.gpus_per_node.value))
        p = _phases(s, profile)
        return p["cpu_optimizer"] - adam, p["host_transfer"]

    cpu2, up2 = phases(zero_stage=2)
    assert cpu2 == pytest.approx(per_rank / cast)
    assert up2 == pytest.approx((4 + 2) * per_rank / pinned)  # fp32 gradients down, bf16 parameters up
    cpu3, up3 = phases(zero_stage=3)
    assert cpu3 == pytest.approx(0.0, abs=1e-12)
    assert up3 == pytest.approx((2 + 2 + 4) * per_rank / pinned + per_rank / direct)
    cpu_off, up_off = phases(zero_stage=3, offload_param="cpu")
    assert cpu_off == pytest.approx(per_rank / cast)


def test_without_measured_refresh_rates_the_host_bandwidth_and_the_pinned_link_stand_in(gh200):
    host = gh200.host
    assert host.param_cast_threads is None and host.param_direct_upload_threads is None
    share = np.array([1.0, 4.0, host.cores.value, 2 * host.cores.value])
    cast = host.param_cast_rate(share)
    assert cast == pytest.approx(host.memory_bandwidth.value / 6 * np.minimum(share, host.cores.value) / host.cores.value)
    direct = host.param_direct_upload_rate(share)
    assert 1 / direct == pytest.approx(1 / cast + 2 / float(host.h2d(2.0**30)))
    measured = _with({"host.param_cast_threads": CAST_CURVE, "host.param_direct_upload_threads": DIRECT_CURVE}).host
    assert measured.param_cast_rate(16) == pytest.approx(1e10) and measured.param_direct_upload_rate(1) == pytest.approx(5e8)


def _probed(profile, here_s: float | None, fitted_at_s: float | None):
    """`profile` on a host whose probe read `here_s`, its issue constants fitted at `fitted_at_s`."""
    from models.profile import Quantity

    def q(v):
        return None if v is None else Quantity(value=v, unit="s", source="test")

    return profile.model_copy(update={
        "host": profile.host.model_copy(update={"issue_per_layer": q(here_s)}),
        "overheads": profile.overheads.model_copy(update={"issue_fitted_at_per_layer": q(fitted_at_s)})})


def test_the_issue_time_scales_with_the_hosts_probe_against_the_one_it_was_fitted_on():
    """A host whose probe reads 1.5x the fitted-at host's issues layers, ZeRO-3 hooks and ZeRO-1/2
    hooks 1.5x slower: a host-bound step waits on it, a GPU-bound one does not; without either
    reading nothing scales."""
    base = {"overheads.step": 0.0, "overheads.micro_step": 0.0, "overheads.layer_pass": 1e-3,
            "overheads.zero3_module_pass": 2e-4, "overheads.zero12_grad_hook": 1e-4}
    same, slow, unknown = (_probed(_with(base), here, at) for here, at in
                           ((100e-6, 100e-6), (150e-6, 100e-6), (150e-6, None)))
    assert same.host_issue_scale == 1.0 and slow.host_issue_scale == pytest.approx(1.5)
    assert unknown.host_issue_scale == 1.0
    small = Workload(load_architecture("qwen2.5-0.5b"), 512)
    for stage in (0, 2, 3):
        s = Strategy(zero_stage=stage)
        # the passes' GPU work, which the host's issue time hides; the optimizer step's comes after it
        gpu_s = sum(v for k, v in _phases(s, same, small).items() if k not in ("deepspeed_overhead", "optimizer_gpu"))
        host_same, host_slow = (_phases(s, p, small)["deepspeed_overhead"] for p in (same, slow))
        assert host_slow - host_same == pytest.approx(0.5 * (host_same + gpu_s), rel=0.1), stage  # all host-bound
        assert _phases(s, unknown, small) == _phases(s, same, small)
    big = Workload(load_architecture("llama-2-7b"), 32768)
    s = Strategy(zero_stage=2, gpus=4, gpus_per_node=4, checkpoint_every=1)  # hidden behind seconds of GPU work
    assert predict(big, s, slow).step_time_s == pytest.approx(predict(big, s, same).step_time_s, rel=1e-4)


def test_a_run_is_predicted_on_the_host_its_probe_measured():
    p = _probed(_with({}), 100e-6, 100e-6)
    assert p.on_host(None) is p and p.on_host(0.0) is p
    on_it = p.on_host(130e-6)
    assert on_it.host_issue_scale == pytest.approx(1.3)
    assert on_it.overheads == p.overheads and on_it.gpu == p.gpu


def _with_passes(base: dict, backward: float, checkpointed_forward: float, recompute: float, key="host.pass_issue"):
    """h200 with `base`'s constants replaced and the given pass ratios (`host.pass_issue`, or under `key`)."""
    ratio = lambda v: {"value": v, "unit": "ratio", "source": "test"}  # noqa: E731
    passes = {"backward": ratio(backward), "checkpointed_forward": ratio(checkpointed_forward),
              "recompute": ratio(recompute)}
    return profile_with({**base, key: passes}, base="h200")


def test_a_host_bound_forward_is_not_hidden_by_a_gpu_bound_backward():
    """The same host time a micro-step, split between the passes three ways: the GPU's backward is
    twice its forward, so the more of the host's time falls in the forward, the longer the GPU waits."""
    workload, strategy = Workload(load_architecture("qwen2.5-0.5b"), 4096), Strategy(gpus=1, zero_stage=0)
    total = 2 * load_profile("h200").overheads.layer_pass.value  # a forward and a backward per layer, before the split

    def wait_s(backward):
        profile = _with_passes({"overheads.layer_pass": total / (1 + backward)}, backward, 1.0, 1.0)
        return _phases(strategy, profile, workload)["deepspeed_overhead"]

    assert wait_s(0.5) > wait_s(1.0) > wait_s(2.0)


def test_checkpointing_charges_its_measured_share_of_the_forward():
    h200 = load_profile("h200")
    workload = Workload(load_architecture("qwen2.5-0.5b"), 256)  # all host
    plain, checkpointed = Strategy(gpus=1, zero_stage=0), Strategy(gpus=1, zero_stage=0, checkpoint_every=1)
    layers, layer_pass = workload.arch.num_layers, h200.overheads.layer_pass.value * h200.host_issue_scale

    def added_s(backward, checkpointed_forward, recompute):
        profile = _with_passes({}, backward, checkpointed_forward, recompute)
        return (_phases(checkpointed, profile, workload)["deepspeed_overhead"]
                - _phases(plain, profile, workload)["deepspeed_overhead"])

    # recompute 2x and the first forward free of autograd (0.5x): 1.5 more forward passes
    np.testing.assert_allclose(added_s(1.5, 0.5, 2.0) - added_s(1.5, 1.0, 1.0), 0.5 * layers * layer_pass, rtol=0.1)


def test_profiles_without_the_measurement_charge_every_pass_alike():
    bare = profile_with({"host.pass_issue": None}, base="h200")
    workload, strategy = Workload(load_architecture("qwen2.5-0.5b"), 512), Strategy(gpus=1, zero_stage=2)
    assert predict(workload, strategy, bare).step_time_s == pytest.approx(
        predict(workload, strategy, _with_passes({}, 1.0, 1.0, 1.0)).step_time_s)


def test_zero3_hooks_charge_each_pass_its_measured_share_of_the_forwards():
    """All host (256 tokens): a checkpointed forward's hooks at half the plain forward's take half a
    forward's hooks a layer off the checkpointed step, and nothing off the plain one; the recompute's
    and the backward's ratios add theirs."""
    h200 = load_profile("h200")
    workload = Workload(load_architecture("qwen2.5-0.5b"), 256)
    plain, checkpointed = Strategy(gpus=1, zero_stage=3), Strategy(gpus=1, zero_stage=3, checkpoint_every=1)
    layers = workload.arch.num_layers
    hooks_per_layer_s = LLAMA_MODULES_PER_LAYER * h200.overheads.zero3_module_pass.value * h200.host_issue_scale

    def host_s(strategy, backward, checkpointed_forward, recompute):
        profile = _with_passes({}, backward, checkpointed_forward, recompute, key="host.zero3_hook_pass")
        return _phases(strategy, profile, workload)["deepspeed_overhead"]

    assert host_s(plain, 1.0, 0.5, 1.0) == pytest.approx(host_s(plain, 1.0, 1.0, 1.0))
    np.testing.assert_allclose(host_s(checkpointed, 1.0, 1.0, 1.0) - host_s(checkpointed, 1.0, 0.5, 1.0),
                               0.5 * layers * hooks_per_layer_s, rtol=0.05)
    np.testing.assert_allclose(host_s(checkpointed, 1.0, 1.0, 1.5) - host_s(checkpointed, 1.0, 1.0, 1.0),
                               0.5 * layers * hooks_per_layer_s, rtol=0.05)
    assert host_s(plain, 1.5, 1.0, 1.0) > host_s(plain, 1.0, 1.0, 1.0)


def test_profiles_without_the_hook_measurement_charge_every_pass_a_forwards_hooks():
    bare = profile_with({"host.zero3_hook_pass": None}, base="h200")
    workload, strategy = Workload(load_architecture("qwen2.5-0.5b"), 512), Strategy(gpus=1, zero_stage=3, checkpoint_every=1)
    assert predict(workload, strategy, bare).step_time_s == pytest.approx(
        predict(workload, strategy, _with_passes({}, 1.0, 1.0, 1.0, key="host.zero3_hook_pass")).step_time_s)


def test_the_optimizer_steps_gpu_time_is_the_measured_bytes_per_parameter_at_hbm_where_measured(gh200):
    z1 = Strategy(gpus=2, gpus_per_node=2, zero_stage=1)
    unmeasured = gh200.model_copy(update={"gpu": gh200.gpu.model_copy(update={"optimizer_step_bytes_per_param": None})})
    counted = _phases(z1, unmeasured)["optimizer_gpu"]
    hbm = gh200.gpu.hbm_bandwidth.value
    assert counted == pytest.approx(36.0 * P7 / 2 / hbm)  # FusedAdam's counted bytes, each rank its half
    measured = _with({"gpu.optimizer_step_bytes_per_param": 108.0,
                      "overheads.compute_efficiency": 0.5})  # measured in real steps: no fitted efficiency on it
    assert _phases(z1, measured)["optimizer_gpu"] == pytest.approx(108.0 * P7 / 2 / hbm)
    offloaded = Strategy(gpus=2, gpus_per_node=2, zero_stage=1, offload_optimizer="cpu")
    assert _phases(offloaded, measured)["optimizer_gpu"] == 0.0


def test_the_passes_issue_and_gpu_times_are_those_the_step_waits_on():
    """`models.predict.step_timing` exposes each pass's issue time, GPU time and wait (for
    benchmarks/phase_passes.py): one micro-step on one GPU waits on the host for exactly their smooth
    max's excess, pass by pass, and those waits are the step's issue waits."""
    from models.predict import step_timing
    from models.timing import host_wait_s

    small = Workload(load_architecture("qwen2.5-0.5b"), 1024)
    tm = step_timing(small, Strategy(zero_stage=3, checkpoint_every=1), load_profile("h200"))
    issue, gpu, wait = tm.pass_issue_s, tm.pass_gpu_s, tm.pass_wait_s
    for name in ("forward", "backward"):
        assert float(wait[name][0]) == pytest.approx(float(host_wait_s(issue[name][0], gpu[name][0])))
    waits = sum(float(wait[name][0]) for name in ("forward", "backward"))
    assert waits > 0 and float(tm.host_issue_wait_s[0]) == pytest.approx(waits)
    # on several GPUs ZeRO-3's serial share is in the pass's wait too, not only the smooth max
    two = step_timing(small, Strategy(gpus=2, gpus_per_node=2, zero_stage=3, checkpoint_every=1), load_profile("h200"))
    assert float(two.pass_wait_s["forward"][0]) > float(host_wait_s(two.pass_issue_s["forward"][0],
                                                                    two.pass_gpu_s["forward"][0]))


def test_each_passs_gpu_work_splits_into_the_kinds_the_traces_kernels_are_split_into():
    """`pass_parts_s` (for the traces' kernels by kind, benchmarks/phase_passes.py): GEMM, attention and
    elementwise work and what communication adds make the pass's GPU time; the backward holds the
    recompute; on one GPU without offload no communication, on two under ZeRO-3 the gathers."""
    from models.predict import step_timing

    profile = load_profile("h200")
    w = Workload(load_architecture("qwen2.5-1.5b"), 8192)
    kinds = ("gemm", "attention", "elementwise", "communication_added")
    for strategy in (Strategy(zero_stage=1), Strategy(zero_stage=2, checkpoint_every=1),
                     Strategy(gpus=2, gpus_per_node=2, zero_stage=3, checkpoint_every=1),
                     Strategy(gpus=2, gpus_per_node=2, zero_stage=2, sp=2),
                     Strategy(zero_stage=2, offload_optimizer="cpu", checkpoint_every=1)):
        tm = step_timing(w, strategy, profile)
        for name in ("forward", "backward"):
            parts = {k: float(v[0]) for k, v in tm.pass_parts_s[name].items()}
            assert sum(parts[k] for k in kinds) == pytest.approx(float(tm.pass_gpu_s[name][0]), rel=1e-9)
            assert min(parts.values()) >= 0.0 and parts["gemm"] > parts["elementwise"] > 0.0
    alone = step_timing(w, Strategy(zero_stage=1), profile).pass_parts_s
    assert float(alone["forward"]["communication"][0]) == 0.0 == float(alone["forward"]["communication_added"][0])
    gathered = step_timing(w, Strategy(gpus=2, gpus_per_node=2, zero_stage=3), profile).pass_parts_s
    assert float(gathered["forward"]["communication"][0]) > 0.0
    recomputed = step_timing(w, Strategy(zero_stage=1, checkpoint_every=1), profile).pass_parts_s
    # the recompute is the layers' forward again (not the LM head's): in the backward, short of a forward
    added = float(recomputed["backward"]["gemm"][0]) - float(alone["backward"]["gemm"][0])
    assert 0.7 * float(alone["forward"]["gemm"][0]) < added < float(alone["forward"]["gemm"][0])
    assert float(recomputed["forward"]["gemm"][0]) == pytest.approx(float(alone["forward"]["gemm"][0]))
