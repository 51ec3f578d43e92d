"""Step time as named exposed phases that sum to the step time.

One optimizer step is `grad_accum` micro-steps (forward window, backward window) and a
boundary (gradient reduction, optimizer, parameter refresh). Within a window, the
communication DeepSpeed can overlap with compute (ZeRO-3 gathers and reduce-scatters,
ZeRO-2 reduce-scatters, offload copies) runs beside it when `overlap_comm` is on; both
streams then slow down by the profile's contention fractions (see `_overlap`). What
cannot overlap is exposed: ZeRO-0's all-reduce, the all-gather after a ZeRO-1/2 step,
Ulysses all-to-alls (DistributedAttention waits for them), CPU-checkpoint copies, the
CPU optimizer (unless SuperOffload hides it behind the last backward) and DeepSpeed's
fixed per-step and offload overheads. The host's issue time (launches, autograd, ZeRO-3
hooks) is exposed only where it outlasts a micro-step's GPU work (see `host_wait_s`).

Collectives: time = calls * alpha + bus_factor(op, n) * bytes / (bus_bandwidth *
the calibrated bus_bandwidth), bytes being the full (gathered or reduced) tensor; the intra-node
network when the group fits in one node, the inter-node one otherwise. ZeRO collectives
run over all GPUs (with Ulysses, gradients are reduced over the sequence-data-parallel
group, which is every GPU); all-to-alls over the sp group.

Assumptions to know:
- SuperOffload (DeepSpeed 0.19.8, superoffload_stage3.py) starts each sub-group's CPU
  step during the last backward only when gradient clipping is off; with clipping its
  step is synchronous. This model assumes clipping is off for SuperOffload.
- Sub-groups are DeepSpeed's default `sub_group_size` (1e9 elements); a rank holding at
  most that many parameters has one sub-group, which SuperOffload cannot hide.
- `overlap.compute_slowdown_with_all_to_all` is not used: Ulysses' all-to-alls are on the
  attention's critical path and never run beside compute.
- The copy stream and the collective stream are treated as one communication stream.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from models.flops import BF16, MicroStepWork
from models.layout import SUB_GROUP_SIZE, Layout
from models.memory import MemoryEstimate
from models.params import VIT_MODULES_PER_LAYER, ParamCounts
from models.profile import HardwareProfile, Network
from models.strategy import StrategyBatch
from models.workload import Workload

PHASES = (
    "compute", "attention", "elementwise", "recompute", "optimizer_gpu", "zero_comm", "ulysses_all_to_all",
    "host_transfer", "cpu_optimizer", "overlap_contention", "deepspeed_overhead", "vision_compute",
    "vision_recompute",
)
# Phases whose time is GPU compute (they can hide communication, and run at compute power).
COMPUTE_PHASES = ("compute", "attention", "elementwise", "recompute", "vision_compute", "vision_recompute")
# GPU FusedAdam bytes per parameter as counted: read fp32 master, m, v, grad (16), write master, m, v
# (12), write the bf16 copy (2), and the bf16 -> fp32 gradient conversion (read 2, write 4). Where the
# profile measured the step (`GpuSpec.optimizer_step_bytes_per_param`) its figure is used instead.
GPU_ADAM_BYTES_PER_PARAM = 36.0


def bus_factor(op: str, n) -> np.ndarray:
    """nccl-tests bus factors: all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n."""
    n = np.asarray(n, dtype=float)
    base = (n - 1.0) / np.maximum(n, 1.0)
    return 2.0 * base if op == "all_reduce" else base


def cpu_threads(b: StrategyBatch, profile: HardwareProfile) -> np.ndarray:
    """Each rank's CPU threads: as the strategy says, else what the launch lines set."""
    return np.where(b.cpu_threads_per_rank > 0, b.cpu_threads_per_rank,
                    profile.host.default_threads_per_rank(b.ranks_per_node))


def collective_s(profile: HardwareProfile, op: str, total_bytes, calls, n, intra) -> np.ndarray:
    """Alpha-beta time of `calls` collectives moving `total_bytes` (full tensors) over n ranks."""
    def one(net: Network):
        alpha_s, bus_bytes_per_s = getattr(net, op).constants_at(n)
        return calls * alpha_s + bus_factor(op, n) * total_bytes / bus_bytes_per_s

    t = np.where(intra, one(profile.intra_node), one(profile.inter_node))
    return np.where(np.asarray(n) > 1, t, 0.0)


def copy_s(curve, total_bytes, message_bytes) -> np.ndarray:
    """Host<->device copy time at the link's rate for this message size."""
    msg = np.maximum(np.asarray(message_bytes, dtype=float), 1.0)
    return np.asarray(total_bytes, dtype=float) / curve(msg)


@dataclass(frozen=True)
class Window:
    """One compute window with overlappable communication beside it (seconds)."""

    contention: np.ndarray  # extra time: compute slowed by the concurrent stream
    exposed_collective: np.ndarray
    exposed_copy: np.ndarray
    overlapped_compute: np.ndarray  # compute seconds that ran beside communication

    @property
    def extra(self) -> np.ndarray:
        return self.contention + self.exposed_collective + self.exposed_copy


def _overlap(profile: HardwareProfile, compute, coll, copy, overlap_on) -> Window:
    """Two streams, compute C and communication X (collectives + copies), run together.

    While both run, compute advances at 1/(1+c) and communication at 1/(1+s), c and s
    being the profile's slowdowns weighted by the kinds of communication. If the
    communication ends first, the window is C + X(1+s)c/(1+c): its cost is contention.
    Otherwise compute is slowed throughout (c*C) and the rest of the communication,
    X - C(1+c)/(1+s), runs alone. Without overlap_comm the window is C + X.
    """
    o = profile.overlap
    x = coll + copy
    safe = np.where(x > 0, x, 1.0)
    c = (o.compute_slowdown_with_collective.value * coll + o.compute_slowdown_with_copy.value * copy) / safe
    s = o.collective_slowdown_with_compute.value * coll / safe
    comm_first = x * (1 + s) <= compute * (1 + c)
    cont = np.where(comm_first, x * (1 + s) * c / (1 + c), c * compute)
    exposed = np.where(comm_first, 0.0, np.maximum(x - compute * (1 + c) / (1 + s), 0.0))
    overlapped = np.where(comm_first, x * (1 + s) / (1 + c), compute)
    on = np.asarray(overlap_on, dtype=bool)
    share = coll / safe
    exposed = np.where(on, exposed, x)
    return Window(
        contention=np.where(on, cont, 0.0),
        exposed_collective=exposed * share,
        exposed_copy=exposed * (1 - share),
        overlapped_compute=np.where(on, overlapped, 0.0),
    )


HOST_OVERLAP_SHARPNESS = 8.0


def divide_or_zero(total, n) -> np.ndarray:
    """total / n, and 0 where n is 0 (shares and means of phases a strategy may not have)."""
    total = np.asarray(total, dtype=float)
    return np.divide(total, n, out=np.zeros(np.broadcast(total, n).shape), where=np.asarray(n) > 0)


def host_wait_s(host_s, gpu_s, sharpness: float = HOST_OVERLAP_SHARPNESS) -> np.ndarray:
    """GPU seconds spent waiting on the host: a smooth max(host, gpu) - gpu.

    The p-norm with p = 8 is max() far from the crossover and costs 9% at equality, where
    launch jitter keeps the GPU from hiding the host's work completely (chosen, not measured:
    benchmarks/issue_crossover.py tries other p). Smoothness also keeps the fit's gradients alive on
    both sides of the crossover."""
    gpu = np.maximum(np.asarray(gpu_s, dtype=float), 1e-12)
    k = sharpness
    return gpu * ((1.0 + (host_s / gpu) ** k) ** (1.0 / k) - 1.0)


@dataclass(frozen=True)
class StepTiming:
    """Exposed seconds per phase (they sum to `step_time_s`) and what energy needs besides."""

    phase_time_s: dict[str, np.ndarray]
    step_time_s: np.ndarray
    overlapped_compute_s: np.ndarray  # compute seconds that ran beside communication (overlap power)
    cpu_optimizer_busy_s: np.ndarray  # CPU busy time of the optimizer, hidden or not
    # The part of deepspeed_overhead that is the GPU waiting on the host between one kernel and the
    # next (the host's issue time, ZeRO-3's events): waits of well under a millisecond each, where
    # the rest of it is waits of the whole step's overhead at once.
    host_issue_wait_s: np.ndarray
    # The part of host_issue_wait_s spent on ZeRO-3's module hooks (fetch and release): the GPU waits
    # there between one module's kernels and the next's, in `hook_gaps` gaps a step.
    hook_wait_s: np.ndarray
    hook_gaps: np.ndarray
    # The last micro-step's passes as the model sees them (for checks against phase traces,
    # calibration/harness/phase_trace.py): the host's issue time, the GPU's work and the GPU's exposed
    # wait on the host of each (a pass's GPU span is its work and its wait).
    pass_issue_s: dict[str, np.ndarray] = field(default_factory=dict)
    pass_gpu_s: dict[str, np.ndarray] = field(default_factory=dict)
    pass_wait_s: dict[str, np.ndarray] = field(default_factory=dict)
    # And each pass's GPU work by kind, for the traces' kernels by kind: "gemm", "attention" and
    # "elementwise" (the loss and the recompute's included), "communication" (its collectives and copies
    # as if alone) and "communication_added" (what they add to the pass beside its compute: exposed and
    # contention). gemm + attention + elementwise + communication_added = pass_gpu_s.
    pass_parts_s: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)


# The kinds of a pass's compute (`StepTiming.pass_parts_s`) and their keys' stem in `_compute_times`.
COMPUTE_KINDS = {"gemm": "gemm", "attention": "attn", "elementwise": "elem"}


def _compute_times(profile: HardwareProfile, w: MicroStepWork) -> dict[str, np.ndarray]:
    """Seconds per micro-step of each compute part, at the profile's rates for these shapes."""
    g = profile.gpu
    eff = profile.overheads.compute_efficiency.value
    out = {k: 0.0 for k in ("gemm_f", "gemm_b", "gemm_r", "vgemm_f", "vgemm_b", "vgemm_r")}
    for gc in w.gemms:
        rate = g.gemm_bf16(gc.flops_per_call) * eff
        pre = "vgemm" if gc.vision else "gemm"
        out[f"{pre}_f"] = out[f"{pre}_f"] + gc.fwd_flops / rate
        out[f"{pre}_b"] = out[f"{pre}_b"] + gc.bwd_flops / rate
        out[f"{pre}_r"] = out[f"{pre}_r"] + gc.recompute_flops / rate
    # Attention runs at its own measured rate, without the GEMMs' efficiency: the calibration
    # times the very SDPA kernel training calls, at the run's sequence and head dim.
    af, ab = g.attention_rates(w.attn_seq_len, w.attn_head_dim)
    hbm = g.hbm_bandwidth.value * eff
    out["attn_f"], out["attn_b"] = w.attn_fwd_flops / af, w.attn_bwd_flops / ab
    out["attn_r"] = w.attn_recompute_flops / af
    out["elem_f"], out["elem_b"], out["elem_r"] = w.elem_fwd_bytes / hbm, w.elem_bwd_bytes / hbm, w.elem_recompute_bytes / hbm
    if w.vis_patches_per_group:
        vf, vb = g.attention_rates(w.vis_patches_per_group, w.vis_head_dim)
        out["vattn_f"], out["vattn_b"] = w.vis_attn_fwd_flops / vf, w.vis_attn_bwd_flops / vb
        out["vattn_r"] = w.vis_attn_recompute_flops / vf
        out["velem_f"], out["velem_b"] = w.vis_elem_fwd_bytes / hbm, w.vis_elem_bwd_bytes / hbm
        out["velem_r"] = w.vis_elem_recompute_bytes / hbm
    else:
        for k in ("vattn_f", "vattn_b", "vattn_r", "velem_f", "velem_b", "velem_r"):
            out[k] = 0.0
    return out


@dataclass(frozen=True)
class _Passes:
    """What each pass over the model touches: ZeRO-3 gathers and parameter offload copies per module."""

    forward_modules: int
    backward_modules: int
    recompute_modules: np.ndarray
    forward_params: float
    backward_params: float
    recompute_params: np.ndarray
    trainable_tensors: int  # what a step outside ZeRO-3 visits one by one

    @classmethod
    def of(cls, counts: ParamCounts, work: MicroStepWork) -> "_Passes":
        n_ck, nv_ck = work.checkpointed_layers, work.vis_checkpointed_layers
        vis_trained = counts.train_vision
        return cls(
            forward_modules=counts.modules_llm + counts.modules_vision,
            backward_modules=counts.modules_llm + (counts.modules_vision if vis_trained
                                                   else (2 if counts.modules_vision else 0)),
            recompute_modules=n_ck * counts.modules_per_llm_layer + nv_ck * (VIT_MODULES_PER_LAYER if vis_trained else 0),
            forward_params=float(counts.forward_params), backward_params=float(counts.backward_params),
            recompute_params=n_ck * counts.layer + nv_ck * counts.vit_layer,
            trainable_tensors=counts.trainable_tensors,
        )


@dataclass(frozen=True)
class _Traffic:
    """Seconds of overlappable communication beside each compute window (per micro-step)."""

    forward: np.ndarray
    backward: np.ndarray  # a micro-step that does not end the accumulation
    last_backward: np.ndarray  # the one that does
    # Copies the backward waits on, per step: they add to it instead of hiding behind it.
    serial_s: np.ndarray | float = 0.0


def _zero_collectives(profile: HardwareProfile, counts: ParamCounts, ps: _Passes, b: StrategyBatch,
                      lay: Layout) -> tuple[_Traffic, np.ndarray]:
    """ZeRO's collectives beside each window, and the exposed ones at the boundary."""
    n, stage, intra, z3 = lay.gpus, lay.zero_stage, lay.one_node, lay.z3
    p = float(counts.trainable)
    rb, agb = b.reduce_bucket_size.astype(float), b.allgather_bucket_size.astype(float)
    grad_calls = np.ceil(p / rb)
    rs_full = collective_s(profile, "reduce_scatter", BF16 * p, grad_calls, n, intra)
    f_coll = np.where(z3, collective_s(profile, "all_gather", BF16 * ps.forward_params, ps.forward_modules, n, intra), 0.0)
    b_coll_z3 = (collective_s(profile, "all_gather", BF16 * ps.backward_params, ps.backward_modules, n, intra)
                 + collective_s(profile, "all_gather", BF16 * ps.recompute_params, ps.recompute_modules, n, intra)
                 + rs_full)
    b_coll = np.select([stage == 2, z3], [rs_full, b_coll_z3], 0.0)
    b_coll_last = np.where(stage == 1, rs_full, b_coll)
    boundary = np.select(
        [stage == 0, lay.z12],
        [collective_s(profile, "all_reduce", BF16 * p, grad_calls, n, intra),
         collective_s(profile, "all_gather", BF16 * p, np.ceil(p / agb), n, intra)], 0.0)
    return _Traffic(forward=f_coll, backward=b_coll, last_backward=b_coll_last), boundary


def _host_copies(profile: HardwareProfile, counts: ParamCounts, ps: _Passes, b: StrategyBatch,
                 lay: Layout) -> _Traffic:
    """Offload copies beside each window (bytes per parameter of the rank's partition, from
    DeepSpeed 0.19's code)."""
    n, stage, r = lay.gpus, lay.zero_stage, lay.offload_fraction
    opt_off, par_off = lay.optimizer_offload, lay.param_offload
    p = float(counts.trainable)
    rb = b.reduce_bucket_size.astype(float)
    h2d, d2h = profile.host.h2d, profile.host.d2h
    part = p / n
    msg = np.minimum(BF16 * part, BF16 * rb)

    def down(bytes_per_param):
        return copy_s(d2h, bytes_per_param * part, msg)

    def up(bytes_per_param):
        return copy_s(h2d, bytes_per_param * part, msg)

    z12_off = opt_off & (stage <= 2)
    z3_off = opt_off & lay.z3
    # ZeRO-1/2 offload: at the boundary the partition's gradients go to the host as fp32 (cast on
    # the GPU, 4 bytes). ZeRO-3 offload: the bf16 gradient partition buffer lives on the host;
    # every micro-step writes it and reads it back (partition_grads), and at the boundary the CPU
    # sub-groups' gradients go down again as fp32.
    b_copy = np.where(z3_off, down(BF16) + up(BF16), 0.0)
    b_copy_last = np.where(z12_off, down(4.0 * r), 0.0) + np.where(z3_off, down(BF16) + up(BF16) + down(4.0 * r), 0.0)
    # ZeRO-2 offload with accumulation round-trips each parameter's bf16 gradient through
    # accumulated_grads_in_cpu (up, add, down; up alone at the boundary), and each parameter's hook
    # first waits for the previous one's copies (`_wait_for_offload_copies`, DeepSpeed 0.19.8): the
    # backward waits on them. On H200, qwen2.5-1.5b 8k took 0.455 s a micro-step beyond the first
    # at four micro-batches, 0.16 s more than its GPU work: its 3.1 GB round trip is 0.12 s.
    acc2 = z12_off & (stage == 2)
    ga = b.grad_accum.astype(float)
    serial = np.where(acc2, (ga - 1.0) * (down(BF16) + up(BF16)) + np.where(ga > 1, up(BF16), 0.0), 0.0)
    # Parameter offload: the bf16 partition comes up for every pass.
    f_copy = np.where(par_off, copy_s(h2d, BF16 * ps.forward_params / n,
                                      BF16 * ps.forward_params / n / max(ps.forward_modules, 1)), 0.0)
    param_up_b = np.where(par_off, copy_s(h2d, BF16 * (ps.backward_params + ps.recompute_params) / n,
                                          BF16 * ps.backward_params / n / max(ps.backward_modules, 1)), 0.0)
    b_copy = b_copy + param_up_b
    b_copy_last = b_copy_last + param_up_b
    return _Traffic(forward=f_copy, backward=b_copy, last_backward=b_copy_last, serial_s=serial)


@dataclass(frozen=True)
class _Refresh:
    """The updated parameters' way back after a CPU step (exposed: the next forward needs them)."""

    cast_s: np.ndarray  # the host's fp32 -> bf16 cast (CPU work)
    upload_s: np.ndarray  # the copy to the GPU (ZeRO-3's direct copy includes its own cast)
    cpu_busy_s: np.ndarray  # what of the two keeps the CPU busy: the cast, and all of a direct copy


def _param_refresh(profile: HardwareProfile, b: StrategyBatch, lay: Layout) -> _Refresh:
    """As DeepSpeed 0.19.8 does it (calibration/microbench/param_refresh.py): ZeRO-1/2 cast into a
    pinned buffer and upload it pinned; ZeRO-3 (SuperOffload too) copies fp32 into the GPU's bf16
    directly, through pageable memory; with parameter offload the cast is all. The measured rates
    are of one process alone: two ranks of 16 threads refreshed no slower than one (H200, 2 GPUs)."""
    host, r = profile.host, lay.offload_fraction
    threads = cpu_threads(b, profile)
    refreshed = np.where(lay.optimizer_offload, r * lay.trainable_per_rank, 0.0)
    cast = refreshed / host.param_cast_rate(threads)
    up_bytes = BF16 * refreshed
    pinned_up = copy_s(host.h2d, up_bytes, np.minimum(up_bytes, BF16 * b.allgather_bucket_size.astype(float)))
    direct = lay.z3 & ~lay.param_offload
    direct_s = np.where(direct, refreshed / host.param_direct_upload_rate(threads), 0.0)
    cast_s = np.where(direct, 0.0, cast)
    return _Refresh(cast_s=cast_s, upload_s=np.where(direct, direct_s, np.where(lay.param_offload, 0.0, pinned_up)),
                    cpu_busy_s=cast_s + direct_s)


def _cpu_checkpoint_copy_s(workload: Workload, work: MicroStepWork, b: StrategyBatch, profile: HardwareProfile,
                           forward_s, backward_s) -> np.ndarray:
    """CPU checkpointing, per micro-step: the copies' time the step waits for. Each checkpoint goes down
    in forward and comes back in backward, on DeepSpeed's own copy stream (0.19.8's activation offload
    engine), so a copy hides behind the pass it rides on and only what outlasts that pass is exposed.
    On one H200 the cpu-checkpointed steps took what the GPU-checkpointed ones did (qwen2.5-1.5b at 32k
    1.781 s against 1.788, TinyLlama at 16k 0.664 against 0.671: data/runs/README.md), where charging
    the copies in full had predicted 6-9% more."""
    ck_layer = work.tokens_per_gpu * BF16 * workload.arch.hidden_size
    ck_total = work.checkpointed_layers * ck_layer
    down = copy_s(profile.host.d2h, ck_total, ck_layer)
    up = copy_s(profile.host.h2d, ck_total, ck_layer)
    exposed = np.maximum(down - forward_s, 0.0) + np.maximum(up - backward_s, 0.0)
    return np.where(b.cpu_checkpointing, exposed, 0.0)


def _ulysses_all_to_all_s(workload: Workload, work: MicroStepWork, b: StrategyBatch,
                          profile: HardwareProfile) -> np.ndarray:
    """Ulysses all-to-alls per micro-step: q, k, v and out per layer; the same again in backward and recompute."""
    a = workload.arch
    a2a_bytes_layer = BF16 * work.tokens_per_gpu * (2 * a.attention_dim + 2 * a.kv_dim)
    layers_a2a = 2 * a.num_layers + work.checkpointed_layers
    return collective_s(profile, "all_to_all", a2a_bytes_layer * layers_a2a, 4 * layers_a2a, b.sp.astype(float),
                        b.sp <= b.gpus_per_node)


@dataclass(frozen=True)
class _Optimizer:
    gpu_s: np.ndarray  # FusedAdam over the GPU share of the state
    cpu_busy_s: np.ndarray  # CPUAdam over the host share
    cpu_exposed_s: np.ndarray  # what of it the step waits for


def _optimizer(profile: HardwareProfile, b: StrategyBatch, lay: Layout, last_backward_s) -> _Optimizer:
    r, p_rank = lay.offload_fraction, lay.trainable_per_rank
    hbm = profile.gpu.hbm_bandwidth.value * profile.overheads.compute_efficiency.value
    # The step's GPU work outside Adam's own bytes (the gradient norm and clipping, casts and copies,
    # tensor by tensor in part) made H200's steps three times the counted bytes' time, at every ZeRO stage.
    # Measured in real steps, their figure is taken as it ran, without the fitted efficiency.
    measured = profile.gpu.optimizer_step_bytes_per_param
    if measured is not None:
        opt_gpu = measured.value * (1 - r) * p_rank / profile.gpu.hbm_bandwidth.value
    else:
        opt_gpu = GPU_ADAM_BYTES_PER_PARAM * (1 - r) * p_rank / hbm
    cpu_rate = profile.host.cpu_adam_per_rank(cpu_threads(b, profile), lay.ranks_per_node,
                                              profile.gpus_per_node.value)
    cpu_busy = r * p_rank / cpu_rate
    # SuperOffload steps each sub-group on the CPU as soon as its gradients are complete in
    # the last backward; all but the last sub-group's step can hide behind that backward.
    n_sub = np.maximum(1.0, np.ceil(p_rank / SUB_GROUP_SIZE))
    hidden_cap = np.maximum(cpu_busy / n_sub, cpu_busy - last_backward_s * (n_sub - 1) / n_sub)
    z3_off = lay.optimizer_offload & lay.z3
    cpu_exposed = np.where(b.super_offload & z3_off, np.minimum(cpu_busy, hidden_cap), cpu_busy)
    return _Optimizer(gpu_s=opt_gpu, cpu_busy_s=cpu_busy, cpu_exposed_s=cpu_exposed)


@dataclass(frozen=True)
class _Overhead:
    """DeepSpeed's host-side seconds a step: those the step has once, and the GPU's waits on the host's
    issue time (of which `hook_wait_s` on ZeRO-3's module hooks, in `hook_gaps` gaps)."""

    step_s: np.ndarray
    issue_wait_s: np.ndarray
    hook_wait_s: np.ndarray
    hook_gaps: np.ndarray
    forward_issue_s: np.ndarray  # the host's issue time of one micro-step's forward
    last_backward_issue_s: np.ndarray  # and of the backward that ends the accumulation
    forward_wait_s: np.ndarray  # the GPU's exposed wait on the host in that forward
    last_backward_wait_s: np.ndarray  # and in that backward


@dataclass(frozen=True)
class _PassSeconds:
    """GPU seconds of a micro-step's passes, communication beside them included."""

    forward: np.ndarray
    backward: np.ndarray  # a micro-step that does not end the accumulation
    last_backward: np.ndarray  # the one that does


def _pass_ratios(ratios) -> tuple[float, float, float]:
    """(backward, checkpointed forward, recompute) over the plain forward; 1 each where not measured."""
    if ratios is None:
        return 1.0, 1.0, 1.0
    return ratios.backward.value, ratios.checkpointed_forward.value, ratios.recompute.value


def _deepspeed_overhead_s(workload: Workload, work: MicroStepWork, ps: _Passes, b: StrategyBatch, lay: Layout,
                          profile: HardwareProfile, gpu: _PassSeconds, issue_scale) -> _Overhead:
    """DeepSpeed's fixed per-step and per-micro-step costs and its host-side offload work; and apart,
    the host's issue time where it outlasts the GPU's work, pass by pass."""
    ov = profile.overheads
    ga = b.grad_accum.astype(float)
    per_node = profile.gpus_per_node.value
    offload_per_gparam = np.where(b.super_offload, ov.super_offload_step_per_gparam.value,
                                  ov.offload_step_per_gparam.value)
    # DeepSpeed's host-side offload work (gradient norm and clipping, casts, copies into pinned
    # buffers; SuperOffload's worker) is torch CPU code on the rank's threads too: it is taken to
    # speed up with threads as CPUAdam's threads do, from the threads the overheads were fitted at
    # (the profile's default per rank). Sharing the host's memory bandwidth with the other ranks is
    # in the fitted constant, not scaled: SuperOffload on one GPU was not faster than on two.
    # Part of the synchronous path's host work does not speed up with threads (Python, one thread
    # under the GIL): `offload_step_serial_per_gparam`, fitted from the runs at 1 and 16 threads, and
    # more of it under ZeRO-3 (`zero3_offload_step_per_tensor`), whose step walks its sub-groups'
    # parameters one tensor at a time: it goes by tensors, not parameters. Priced per parameter, the
    # steps of a 0.6B model carried to 3B models a second a step their runs did not take (lent H100,
    # 2026-12-06).
    fitted_threads = profile.host.default_threads_per_rank(per_node)
    offload_per_gparam = (offload_per_gparam * profile.host.cpu_rate_on_threads(fitted_threads, per_node)
                          / profile.host.cpu_rate_on_threads(cpu_threads(b, profile), per_node))
    offload_per_gparam = offload_per_gparam + np.where(b.super_offload, 0.0, ov.offload_step_serial_per_gparam.value)
    zero3_walk_s = np.where(lay.z3 & ~b.super_offload, ov.zero3_offload_step_per_tensor.value * ps.trainable_tensors, 0.0)
    overhead = ov.step.value + ga * ov.micro_step.value + np.where(
        lay.optimizer_offload, lay.offload_fraction * (offload_per_gparam * lay.trainable_per_rank / 1e9 + zero3_walk_s),
        0.0)
    # A step outside ZeRO-3 and offload visits every trainable tensor on the host, launching tiny
    # kernels one by one (norms, clipping, copies; ZeRO-1/2's overflow check and partition copy
    # besides): host-bound, so it runs at the host's issue speed.
    per_tensor = (np.where(~lay.z3 & ~lay.optimizer_offload, ov.step_per_tensor.value, 0.0)
                  + np.where(lay.z12 & ~lay.optimizer_offload, ov.zero12_step_per_tensor.value, 0.0))
    overhead = overhead + issue_scale * per_tensor * ps.trainable_tensors
    # The host issues each layer's work asynchronously; when a pass's GPU work is shorter than the
    # host's issue time for it, the GPU waits for the host (small models, short sequences): that
    # wait is exposed, the rest of the issue time hides behind the GPU. The forward and the backward
    # are taken apart: the GPU cannot run ahead into a backward the host has not issued, so a
    # host-bound forward is not hidden by a GPU-bound backward. Each pass costs the host its share of
    # the forward's time per layer (`layer_pass`), as the profile's calibration measured it
    # (`HostSpec.pass_issue`; on an H200 host the backward 1.61 times it, a checkpointed layer's
    # forward the same, and its recompute, issued in the backward, 1.30 times).
    # Only decoder layers count: on H200 the vision tower (frozen or trained, batched over
    # frame groups) added no host-bound time to an otherwise identical run.
    layers = workload.arch.num_layers
    # ZeRO-3's fetch/release hooks and ZeRO-1/2's gradient hooks run on the same host thread that
    # issues the kernels. Under ZeRO-3 on several GPUs the host also waits on fetch and reduce
    # events, so part of the shorter of the two does not overlap.
    # The three are Python on one thread: they scale with the host's probed issue speed.
    # ZeRO-3's hooks cost each pass its measured share of a plain forward's (`HostSpec.zero3_hook_pass`;
    # on H200 the backward's 1.06, a checkpointed forward's 0.81: without autograd it registers no
    # backward hooks on its outputs; the recompute's 0.85).
    # ZeRO-2's hooks reduce and partition every micro-step's gradients; ZeRO-1's reduce only at the
    # accumulation boundary and do nearly nothing before it (stage_1_and_2.py
    # `reduce_ready_partitions_and_remove_grads`; on H200, TinyLlama 1k at four micro-batches took
    # 0.36 s under ZeRO-1 and 0.68 s under ZeRO-2, at one micro-batch 0.20 and 0.19 s).
    checkpointed = work.checkpointed_layers
    hook_b, hook_cf, hook_r = _pass_ratios(profile.host.zero3_hook_pass)
    z3_hooks = np.where(lay.z3, 1.0, 0.0) * issue_scale * ov.zero3_module_pass.value
    # A checkpointed layer's modules are those it recomputes: their first forward takes hook_cf.
    hooks_f = z3_hooks * (ps.forward_modules - ps.recompute_modules + hook_cf * ps.recompute_modules)
    hooks_b = z3_hooks * (hook_b * ps.backward_modules + hook_r * ps.recompute_modules)
    backward, checkpointed_forward, recompute = _pass_ratios(profile.host.pass_issue)
    issue_f = issue_scale * ov.layer_pass.value * (layers - checkpointed + checkpointed_forward * checkpointed) + hooks_f
    issue_b = issue_scale * ov.layer_pass.value * (backward * layers + recompute * checkpointed) + hooks_b
    grad_hooks = issue_scale * ps.backward_modules * ov.zero12_grad_hook.value
    issue_b_normal = issue_b + np.where(lay.zero_stage == 2, grad_hooks, 0.0)
    issue_b_last = issue_b + np.where(lay.z12, grad_hooks, 0.0)
    serial = np.where(lay.z3 & (b.gpus > 1), ov.zero3_host_serial.value, 0.0)

    def exposed(gpu_s, host_s):
        return host_wait_s(host_s, gpu_s) + serial * np.minimum(host_s, gpu_s)

    wait_f = exposed(gpu.forward, issue_f)
    wait_b_normal, wait_b_last = exposed(gpu.backward, issue_b_normal), exposed(gpu.last_backward, issue_b_last)
    # The waits split between the issue's parts as the host's time does.
    hook_wait = (ga * wait_f * divide_or_zero(hooks_f, issue_f)
                 + (ga - 1.0) * wait_b_normal * divide_or_zero(hooks_b, issue_b_normal)
                 + wait_b_last * divide_or_zero(hooks_b, issue_b_last))
    passes = np.where(lay.z3, ps.forward_modules + ps.backward_modules + ps.recompute_modules, 0.0)
    return _Overhead(step_s=overhead, issue_wait_s=ga * wait_f + (ga - 1.0) * wait_b_normal + wait_b_last,
                     hook_wait_s=hook_wait, hook_gaps=ga * passes, forward_issue_s=issue_f, last_backward_issue_s=issue_b_last,
                     forward_wait_s=wait_f, last_backward_wait_s=wait_b_last)


def step_timing(workload: Workload, counts: ParamCounts, work: MicroStepWork, mem: MemoryEstimate,
                b: StrategyBatch, profile: HardwareProfile, issue_scale=None) -> StepTiming:
    """`issue_scale`: how much slower than the issue constants' host each strategy's host issues work
    (one a strategy: measured runs each on their own host); None: the profile's host (`host_issue_scale`)."""
    lay = mem.layout
    ct = _compute_times(profile, work)
    z = np.zeros(len(b))
    ga = b.grad_accum.astype(float)
    normal = ga - 1.0  # micro-steps that do not end the accumulation

    # Each pass's compute by kind, the vision tower's with the decoder's and the recompute in the backward;
    # a pass's compute is their sum.
    forward_kinds = {kind: ct[f"{k}_f"] + ct[f"v{k}_f"] + z for kind, k in COMPUTE_KINDS.items()}
    backward_kinds = {kind: ct[f"{k}_b"] + ct[f"v{k}_b"] + ct[f"{k}_r"] + ct[f"v{k}_r"] + z
                      for kind, k in COMPUTE_KINDS.items()}
    c_f, c_b = sum(forward_kinds.values()), sum(backward_kinds.values())
    rec = ct["gemm_r"] + ct["attn_r"] + ct["elem_r"] + z
    vrec = ct["vgemm_r"] + ct["vattn_r"] + ct["velem_r"] + z

    ps = _Passes.of(counts, work)
    coll, boundary_coll = _zero_collectives(profile, counts, ps, b, lay)
    copies = _host_copies(profile, counts, ps, b, lay)
    refresh = _param_refresh(profile, b, lay)
    ckpt_copy = _cpu_checkpoint_copy_s(workload, work, b, profile, c_f, c_b)
    a2a = _ulysses_all_to_all_s(workload, work, b, profile)

    wf = _overlap(profile, c_f, coll.forward, copies.forward, b.overlap_comm)
    wbn = _overlap(profile, c_b, coll.backward, copies.backward, b.overlap_comm)
    wbl = _overlap(profile, c_b, coll.last_backward, copies.last_backward, b.overlap_comm)

    opt = _optimizer(profile, b, lay, c_b + wbl.extra)
    gpu = _PassSeconds(forward=c_f + wf.extra, backward=c_b + wbn.extra, last_backward=c_b + wbl.extra)
    parts = {
        "forward": {**forward_kinds, "communication": coll.forward + copies.forward + z,
                    "communication_added": wf.extra + z},
        "backward": {**backward_kinds, "communication": coll.last_backward + copies.last_backward + z,
                     "communication_added": wbl.extra + z},
    }
    host = _deepspeed_overhead_s(workload, work, ps, b, lay, profile, gpu,
                                 profile.host_issue_scale if issue_scale is None else np.asarray(issue_scale))

    phases = {
        "compute": ga * (ct["gemm_f"] + ct["gemm_b"]) + z,
        "attention": ga * (ct["attn_f"] + ct["attn_b"]) + z,
        "elementwise": ga * (ct["elem_f"] + ct["elem_b"]) + z,
        "recompute": ga * rec,
        "optimizer_gpu": opt.gpu_s + z,
        "zero_comm": ga * wf.exposed_collective + normal * wbn.exposed_collective + wbl.exposed_collective
        + boundary_coll,
        "ulysses_all_to_all": ga * a2a,
        "host_transfer": ga * wf.exposed_copy + normal * wbn.exposed_copy + wbl.exposed_copy + copies.serial_s
        + refresh.upload_s + ga * ckpt_copy,
        "cpu_optimizer": opt.cpu_exposed_s + refresh.cast_s + z,
        "overlap_contention": ga * wf.contention + normal * wbn.contention + wbl.contention,
        "deepspeed_overhead": host.step_s + host.issue_wait_s + z,
        "vision_compute": ga * (ct["vgemm_f"] + ct["vgemm_b"] + ct["vattn_f"] + ct["vattn_b"]
                                + ct["velem_f"] + ct["velem_b"]) + z,
        "vision_recompute": ga * vrec,
    }
    assert set(phases) == set(PHASES)
    step = sum(phases.values())
    overlapped = ga * wf.overlapped_compute + normal * wbn.overlapped_compute + wbl.overlapped_compute
    return StepTiming(phase_time_s=phases, step_time_s=step, overlapped_compute_s=overlapped,
                      cpu_optimizer_busy_s=opt.cpu_busy_s + refresh.cpu_busy_s + z,
                      host_issue_wait_s=host.issue_wait_s + z, hook_wait_s=host.hook_wait_s + z,
                      hook_gaps=host.hook_gaps + z,
                      pass_issue_s={"forward": host.forward_issue_s + z, "backward": host.last_backward_issue_s + z},
                      pass_gpu_s={"forward": gpu.forward + z, "backward": gpu.last_backward + z},
                      pass_wait_s={"forward": host.forward_wait_s + z, "backward": host.last_backward_wait_s + z},
                      pass_parts_s=parts)
