"""Hardware profile: the measured (or datasheet) constants the cost model reads.

A profile is JSON, strictly parsed: unknown keys, missing keys, a wrong unit or an
unknown schema version fail with a message that names the key. Every constant carries
its unit and its source, because a prediction is only as honest as the numbers behind it.
Rates that depend on operation size are curves (log-log interpolated, clamped at the
measured ends: the model never extrapolates a curve past what was measured).
"""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from models.input_file import read_json, shown
from models.limits import MAX_GPUS, MAX_GPUS_PER_NODE

SCHEMA_VERSION = 1
# The shipped profiles and their bands, package data. A folder on disk (setuptools installs a wheel
# unpacked), so a profile's band and a refit of it are paths beside it.
PROFILES_DIR: Path = resources.files(__package__) / "profiles"
DEFAULT_PROFILE = "gh200"


class ProfileError(ValueError):
    """A profile that cannot be used; the message names the file and the bad key."""


class _Strict(BaseModel):
    """Exact keys and exact types: a number given as a string ("139.8") or as `true` is refused, not read."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Quantity(_Strict):
    """One constant with its unit and where it came from."""

    value: float
    unit: str
    source: str


def _unit(expected: str):
    def check(q: Quantity) -> Quantity:
        if q.unit != expected:
            raise ValueError(f"unit must be '{expected}', got '{q.unit}'")
        return q

    return AfterValidator(check)


Seconds = Annotated[Quantity, _unit("s")]
Watts = Annotated[Quantity, _unit("W")]
BytesPerSecond = Annotated[Quantity, _unit("bytes/s")]
FlopsPerSecond = Annotated[Quantity, _unit("flop/s")]
ParamsPerSecond = Annotated[Quantity, _unit("params/s")]
Fraction = Annotated[Quantity, _unit("fraction")]
GiB = Annotated[Quantity, _unit("GiB")]
Bytes = Annotated[Quantity, _unit("bytes")]
Count = Annotated[Quantity, _unit("count")]
Ratio = Annotated[Quantity, _unit("ratio")]


class Curve(_Strict):
    """A rate against an operation size, measured at the points `x`.

    Evaluation interpolates linearly in log(x)-log(y) and clamps outside [x[0], x[-1]].
    """

    x_unit: str
    y_unit: str
    x: list[float]
    y: list[float]
    source: str

    @model_validator(mode="after")
    def _check_points(self) -> "Curve":
        if len(self.x) != len(self.y) or len(self.x) == 0:
            raise ValueError("x and y must be non-empty and of equal length")
        if not np.all(np.isfinite(self.x + self.y)):
            raise ValueError("x and y must be finite numbers")
        if any(b <= a for a, b in zip(self.x, self.x[1:])):
            raise ValueError("x must be strictly increasing")
        if min(self.x) <= 0 or min(self.y) <= 0:
            raise ValueError("x and y must be positive")
        return self

    def __call__(self, x: np.ndarray | float) -> np.ndarray:
        lx = np.log(np.clip(np.asarray(x, dtype=float), self.x[0], self.x[-1]))
        return np.exp(np.interp(lx, np.log(self.x), np.log(self.y)))


def _curve_units(x_unit: str, y_unit: str):
    def check(c: Curve) -> Curve:
        if c.x_unit != x_unit or c.y_unit != y_unit:
            raise ValueError(f"curve units must be '{x_unit}' -> '{y_unit}', got '{c.x_unit}' -> '{c.y_unit}'")
        return c

    return AfterValidator(check)


FlopRateCurve = Annotated[Curve, _curve_units("flop", "flop/s")]
ThreadRateCurve = Annotated[Curve, _curve_units("threads", "params/s")]
SeqRateCurve = Annotated[Curve, _curve_units("tokens", "flop/s")]
HeadDimRatioCurve = Annotated[Curve, _curve_units("head_dim", "ratio")]
BandwidthCurve = Annotated[Curve, _curve_units("bytes", "bytes/s")]


class Provenance(_Strict):
    """Where the numbers came from. `kind` is datasheet, measured, fitted, derived (a measured
    profile scaled by datasheet ratios: `python -m calibration.derive`) or cpu."""

    kind: Literal["datasheet", "measured", "fitted", "derived", "cpu"]
    date: str
    machine: str
    gpu: str
    driver: str | None
    cuda: str | None
    torch: str | None
    deepspeed: str | None
    host_cpu: str | None
    notes: str


class LayerElementwise(_Strict):
    """A decoder layer's memory-bound kernels (norms, RoPE, activation, residuals, casts, copies) as
    effective bytes per token for each element of its widths, forward and backward together, at the
    profile's HBM bandwidth (calibration family layer_elementwise: the kernels' measured time).

    `per_attention` (the heads' width), `per_qk_norm` (q + KV, where a layer has q/k norms) and
    `per_sandwich_norm` (2 x hidden, where it has Gemma 3's sandwich norms) are None where the
    calibration's layers could not separate them: heads as wide as the hidden size, whose work
    `per_hidden` then holds, and no such norms, whose bytes are then counted (`models.flops`)."""

    per_hidden: Bytes
    per_kv: Bytes
    per_ffn: Bytes
    per_attention: Bytes | None = None
    per_qk_norm: Bytes | None = None
    per_sandwich_norm: Bytes | None = None

    def bytes_per_token(self, hidden, attention_dim, kv_dim, ffn, qk_norm_dim=0, sandwich_norm_dim=0) -> float:
        """The measured bytes; a kind of norm's are left out where its own bytes are None."""
        separated = ((self.per_attention, attention_dim), (self.per_qk_norm, qk_norm_dim),
                     (self.per_sandwich_norm, sandwich_norm_dim))
        return (self.per_hidden.value * hidden + self.per_kv.value * kv_dim + self.per_ffn.value * ffn
                + sum(per.value * width for per, width in separated if per is not None))


class VisionElementwise(_Strict):
    """The same for one ViT block of the vision tower (LayerNorms, GELU, residuals, the QKV split's
    layout copies), for each element of its two widths: a ViT has no KV width of its own (calibration
    family vision_elementwise)."""

    per_hidden: Bytes
    per_ffn: Bytes

    def bytes_per_token(self, hidden, ffn) -> float:
        return self.per_hidden.value * hidden + self.per_ffn.value * ffn


class GpuSpec(_Strict):
    name: str
    memory_gib: GiB
    # bf16 dense GEMM rate against FLOPs in one GEMM call (2*M*N*K).
    gemm_bf16: FlopRateCurve
    # Causal fused attention (SDPA) rate against sequence length, counting causal FLOPs only.
    attention_fwd_bf16: SeqRateCurve
    attention_bwd_bf16: SeqRateCurve
    # The attention rate at other head dims over the curves' (128), measured at the same
    # sequences: flash kernels do less per FLOP at head dim 64. None (older profiles): 1.
    attention_fwd_head_dim_ratio: HeadDimRatioCurve | None = None
    attention_bwd_head_dim_ratio: HeadDimRatioCurve | None = None
    # Memory-bound elementwise work (norms, activations, residuals, optimizer on GPU).
    hbm_bandwidth: BytesPerSecond
    # A decoder layer's elementwise kernels as measured; None (older profiles): the counted bytes
    # (models.flops), which on H200 were a sixth of their time.
    layer_elementwise: LayerElementwise | None = None
    # A ViT block's, likewise; None: the counted bytes.
    vision_elementwise: VisionElementwise | None = None
    # The optimizer step's GPU work per trainable parameter kept on the GPU, as bytes at this HBM
    # bandwidth, measured from the step's busy time in real runs (`calibration.optimizer_step`). None
    # (older profiles): FusedAdam's counted bytes (models.timing), which on H200 were a third of it.
    optimizer_step_bytes_per_param: Bytes | None = None
    power_cap: Watts

    def attention_rates(self, seq_len, head_dim) -> tuple[float, float]:
        """(forward, backward) causal attention FLOP/s at this sequence length and head dim."""
        fwd, bwd = float(self.attention_fwd_bf16(seq_len)), float(self.attention_bwd_bf16(seq_len))
        if self.attention_fwd_head_dim_ratio is not None:
            fwd *= float(self.attention_fwd_head_dim_ratio(head_dim))
        if self.attention_bwd_head_dim_ratio is not None:
            bwd *= float(self.attention_bwd_head_dim_ratio(head_dim))
        return fwd, bwd


class PassIssue(_Strict):
    """A decoder layer's host issue time in each pass, over the plain forward's (with autograd)."""

    backward: Ratio  # the backward: about two kernels for each of the forward's, and autograd's walk
    checkpointed_forward: Ratio  # a checkpointed layer's first forward, run without autograd
    recompute: Ratio  # what a checkpointed layer adds to the backward: its forward again, and the checkpoint's own work


class HostSpec(_Strict):
    cpu: str
    cores: Count
    memory_gib: GiB
    memory_bandwidth: BytesPerSecond
    link: Literal["pcie", "c2c", "none"]
    h2d: BandwidthCurve
    d2h: BandwidthCurve
    # DeepSpeedCPUAdam throughput using all the host's cores (shared by the node's ranks).
    cpu_adam: ParamsPerSecond
    # One process's DeepSpeedCPUAdam throughput against its thread count (1, 2, 4, ... all cores);
    # None in profiles calibrated before it was measured (see cpu_adam_per_rank).
    cpu_adam_threads: ThreadRateCurve | None = None
    # The parameter refresh after a CPU step against one process's threads (calibration family
    # param_refresh): the CPU cast of fp32 into a host bf16 buffer (ZeRO-1/2, parameter offload), and
    # ZeRO-3's direct `gpu_bf16.copy_(cpu_fp32)` (cast into pageable memory, then a pageable copy).
    # None in profiles calibrated before they were measured (see param_cast_rate).
    param_cast_threads: ThreadRateCurve | None = None
    param_direct_upload_threads: ThreadRateCurve | None = None
    # The host's time to issue one tiny layer's forward and backward from Python (the host probe,
    # calibration/harness/host_probe.py): its single-thread speed, which sets host-bound steps.
    # None in profiles calibrated before it was measured (the issue constants are then used as fitted).
    issue_per_layer: Seconds | None = None
    # The host's time to issue a decoder layer's passes, over its forward's (calibration family
    # pass_issue): a GPU waits on the host pass by pass (models.timing). None in profiles calibrated
    # before it was measured: every pass then costs the forward's.
    pass_issue: PassIssue | None = None
    # ZeRO-3's fetch and release hooks in each pass, over the plain forward's (calibration family
    # zero3_hooks): a checkpointed forward runs without autograd, so its hooks register no backward
    # hooks. None in profiles calibrated before it was measured: every pass then costs the forward's.
    zero3_hook_pass: PassIssue | None = None

    def default_threads_per_rank(self, ranks_per_node) -> np.ndarray:
        """What the advisor's launch lines set: the cores shared evenly by the node's ranks."""
        return np.maximum(1, self.cores.value // np.maximum(np.asarray(ranks_per_node), 1))

    def cpu_adam_per_rank(self, threads, ranks_per_node, gpus_per_node) -> np.ndarray:
        """Params/s of one rank's CPU optimizer on `threads` threads while `ranks_per_node` ranks step
        at once. Two bounds: what its threads compute (the measured curve; without one, the all-core
        rate's share per thread, up to one GPU's share of the node's cores), and the host's memory
        bandwidth, which the node's ranks share (CPUAdam is memory-bound: on the 4-GPU H200 node, 4
        ranks of 16 threads stepped at the 2-GPU host's all-core rate over 4, not over 2). A thread
        is assumed to have a core of its own: more threads than cores are not modelled (the CLI warns)."""
        compute = self.cpu_rate_on_threads(threads, gpus_per_node)
        return np.minimum(compute, self.cpu_adam.value / np.maximum(np.asarray(ranks_per_node, dtype=float), 1.0))

    def param_cast_rate(self, threads) -> np.ndarray:
        """Params/s of one rank's fp32 -> bf16 cast on the host: the measured curve; without one, the
        host's memory bandwidth over the 6 bytes a parameter moves (read 4, write 2), shared by thread."""
        threads = np.maximum(np.asarray(threads, dtype=float), 1.0)
        if self.param_cast_threads is not None:
            return self.param_cast_threads(threads)
        return self.memory_bandwidth.value / 6.0 * np.minimum(threads, self.cores.value) / self.cores.value

    def param_direct_upload_rate(self, threads) -> np.ndarray:
        """Params/s of ZeRO-3's direct refresh: the measured curve; without one, the cast followed by
        a pinned upload of 2 bytes a parameter (no pageable penalty: not measured on that host)."""
        threads = np.maximum(np.asarray(threads, dtype=float), 1.0)
        if self.param_direct_upload_threads is not None:
            return self.param_direct_upload_threads(threads)
        pinned_bytes_per_s = float(self.h2d(np.asarray(2**30, dtype=float)))
        return 1.0 / (1.0 / self.param_cast_rate(threads) + 2.0 / pinned_bytes_per_s)

    def cpu_rate_on_threads(self, threads, gpus_per_node) -> np.ndarray:
        """Params/s one process's threads compute, alone on the host: the measured curve; without
        one, the all-core rate's share per thread, up to one GPU's share of the node's cores."""
        threads = np.maximum(np.asarray(threads, dtype=float), 1.0)
        if self.cpu_adam_threads is not None:
            return self.cpu_adam_threads(threads)
        share = self.cores.value / max(float(gpus_per_node), 1.0)
        return self.cpu_adam.value * np.minimum(threads, share) / self.cores.value


class CollectiveAtSize(_Strict):
    """The alpha-beta constants measured for one group size."""

    group_size: Count
    alpha: Seconds
    bus_bandwidth: BytesPerSecond


class Collective(_Strict):
    """Alpha-beta model: time = alpha + bus_factor(op, n) * bytes / bus_bandwidth.

    `alpha` and `bus_bandwidth` hold for `group_size_measured`. Bus bandwidth still changes with
    the group (NVLink: about +30% from 2 to 4 ranks on H200), so a profile calibrated at several
    sizes lists them in `by_group_size`; the model interpolates in log2(group size) between them
    and holds the end values outside their range.
    """

    alpha: Seconds
    bus_bandwidth: BytesPerSecond
    group_size_measured: Count
    by_group_size: list[CollectiveAtSize] = []

    @field_validator("by_group_size")
    @classmethod
    def _sizes_increase(cls, points: list[CollectiveAtSize]) -> list[CollectiveAtSize]:
        sizes = [p.group_size.value for p in points]
        if not all(0 < n <= MAX_GPUS for n in sizes):
            return points  # the profile's check of every constant names the entry out of its range
        if any(b <= a for a, b in zip(sizes, sizes[1:])) or any(n < 2 for n in sizes):
            raise ValueError(f"group sizes must be >= 2 and strictly increasing, got {sizes}")
        return points

    def constants_at(self, group_size) -> tuple[np.ndarray, np.ndarray]:
        """(alpha_s, bus_bandwidth_bytes_per_s) for each group size in `group_size`."""
        n = np.asarray(group_size, dtype=float)
        if not self.by_group_size:
            return np.full_like(n, self.alpha.value), np.full_like(n, self.bus_bandwidth.value)
        log_sizes = np.log2([p.group_size.value for p in self.by_group_size])
        log_n = np.log2(np.maximum(n, 1.0))
        alpha = np.interp(log_n, log_sizes, [p.alpha.value for p in self.by_group_size])
        bandwidth = np.interp(log_n, log_sizes, [p.bus_bandwidth.value for p in self.by_group_size])
        return alpha, bandwidth


class Network(_Strict):
    all_reduce: Collective
    all_gather: Collective
    reduce_scatter: Collective
    all_to_all: Collective


class Overlap(_Strict):
    """Contention when streams run concurrently: the fractional slowdown of each."""

    compute_slowdown_with_collective: Fraction
    compute_slowdown_with_all_to_all: Fraction
    compute_slowdown_with_copy: Fraction
    collective_slowdown_with_compute: Fraction


class WaitDecay(_Strict):
    """How a GPU's power falls when its work stops: not at once to `wait`, but from what it drew busy
    toward `wait`, with a time constant that grows with the busy stretch before the wait. On H200 it
    was about 0.3 times the stretch over three decades (data/calibration/README.md, 2026-12-01): tails
    of 16-40 us after 40 us GEMMs, 90-130 us after 290 us, 300-400 us after 1.1 ms, about 0.6 ms
    after 2 ms bursts, and 31 ms after 100 ms bursts (`decay_s` after `burst_s`, calibration family
    `wait_decay`). Longer stretches were not measured: the constant is held at `decay_s` there (taken
    as growing on, ZeRO-2 offload steps, whose CPU optimizer waits after 0.3-1 s micro-steps, came out
    9% over in-sample)."""

    decay_s: Seconds
    burst_s: Seconds

    def time_constant_s(self, busy_s) -> np.ndarray:
        """The decay's time constant after `busy_s` seconds of busy work."""
        return self.decay_s.value * np.minimum(1.0, np.asarray(busy_s, dtype=float) / self.burst_s.value)


class GpuPower(_Strict):
    """Average GPU board power in each phase. `wait_decay` is None in profiles written before it was
    measured: their waits draw `wait` however short."""

    idle: Watts
    wait: Watts
    compute: Watts
    memory_bound: Watts
    collective: Watts
    host_copy: Watts
    overlap: Watts
    wait_decay: WaitDecay | None = None


class CpuPower(_Strict):
    """Host CPU power; `measured` is false when no sensor existed and these are estimates."""

    idle: Watts
    optimizer: Watts
    measured: bool
    sensor: str


class Power(_Strict):
    gpu: GpuPower
    cpu: CpuPower
    # "module" when the GPU meter includes the CPU (GH200 NVML): CPU energy then is not added twice.
    nvml_scope: Literal["gpu", "module"]


class Overheads(_Strict):
    """DeepSpeed's own costs beyond bytes and FLOPs; fitted from short real runs.

    `layer_pass` is the host's time to issue one layer's forward (kernel launches, autograd,
    DeepSpeed's hooks); its backward and a checkpointed layer's passes take the measured ratios of
    `HostSpec.pass_issue`. A GPU whose work in a pass is shorter than the host's waits for it. The offload terms are per billion parameters
    stepped on the CPU, synchronous and SuperOffload apart, since their code paths differ; the
    synchronous path's `offload_step_serial_per_gparam` is the part that does not speed up with
    threads (one Python thread), fitted from runs at 1 and 16 threads. `zero3_offload_step_per_tensor` is
    what ZeRO-3's synchronous offload step adds to that serial part: stage3.py steps its sub-groups and
    walks their parameters one by one in Python, where ZeRO-1/2 step one flat partition (H200, machine BA,
    2026-12-03: the optimizer call of qwen2.5-1.5b 4k took 1.43 s under ZeRO-3 against 0.67 s under ZeRO-2;
    with one constant for both, ZeRO-3 offload ran 6% over its predictions and ZeRO-2 offload 4% under).
    `zero12_grad_hook` is ZeRO-1/2's Python hook per parameter tensor in each backward (it copies
    the gradient into the reduction bucket), on the same host thread; ZeRO-1's does that work only in
    the backward that ends the accumulation. `zero12_step_per_tensor` is
    ZeRO-1/2's step per trainable tensor without offload: its overflow check (amax, amin, isfinite,
    ...), gradient norm and partition copy launch a handful of tiny kernels for each tensor, one after
    another, so the step waits on the host (H200 step profiles, 2026-12-01: a trained ViT tower's 329
    more tensors added about 86 ms to those functions under cProfile). `step_per_tensor` is what every
    step outside ZeRO-3 and offload pays per trainable tensor before that: ZeRO-0's optimizer (DeepSpeed's
    FP16_Optimizer in bf16, the engine's choice without `data_types.grad_accum_dtype`) runs the same
    serial overflow check over every tensor as ZeRO-1/2's step (201 `has_inf_or_nan` calls a step each
    for TinyLlama, H200 step profiles) and casts and copies each one besides; on H200, a 256-wide
    decoder's step grew by about 190 us a tensor from 6 to 24 layers at ZeRO-0, where the fixed `step`
    had been fitted to 35 ms. ZeRO-0 has no gradient hook: its micro-steps launch the same kernels as
    ZeRO-1's (torch.profiler, TinyLlama 1k at four micro-batches). `zero3_host_serial` is the
    share of the shorter of host issue and GPU work that does not overlap under ZeRO-3 on several
    GPUs: the host waits on DeepSpeed's fetch and reduce events, so it cannot run ahead of the
    GPU (H200, 2026-11-30: qwen2.5-1.5b at 512 tokens, all host, took as long on 2 GPUs as on 1;
    at 8k, host and GPU near equal, 35% longer). Both are zero, their defaults, until fitted.
    `issue_fitted_at_per_layer` ties the issue constants to a host speed (see
    `HardwareProfile.host_issue_scale`). `compute_efficiency` scales the calibrated GEMM and memory-bound
    rates to what a training step gets; attention is not scaled (`GpuSpec.attention_rates`: the
    calibration times the kernel training calls, at the run's sequence and head dim).
    """

    step: Seconds
    micro_step: Seconds
    layer_pass: Seconds
    zero3_module_pass: Seconds
    zero12_grad_hook: Seconds = Quantity(
        value=0.0, unit="s", source="not fitted: no ZeRO-1/2 runs (neutral value)")
    zero12_step_per_tensor: Seconds = Quantity(
        value=0.0, unit="s", source="not fitted: profile written before it was modelled (neutral value)")
    step_per_tensor: Seconds = Quantity(
        value=0.0, unit="s", source="not fitted: profile written before it was modelled (neutral value)")
    zero3_host_serial: Fraction = Quantity(
        value=0.0, unit="fraction", source="not fitted: no ZeRO-3 runs on several GPUs (neutral value)")
    offload_step_per_gparam: Seconds
    offload_step_serial_per_gparam: Seconds = Quantity(
        value=0.0, unit="s", source="not fitted: no offload runs at several thread counts (neutral value)")
    zero3_offload_step_per_tensor: Seconds = Quantity(
        value=0.0, unit="s", source="not fitted: profile written before it was modelled (neutral value)")
    super_offload_step_per_gparam: Seconds
    compute_efficiency: Fraction
    # The host probe's issue time on the hosts `layer_pass`, `zero3_module_pass`, `zero12_grad_hook`,
    # `zero12_step_per_tensor` and `step_per_tensor` describe (fitted: where the fit's runs without a probe ran): on a host whose probe reads otherwise
    # (`HostSpec.issue_per_layer`) they scale with it.
    issue_fitted_at_per_layer: Seconds | None = None

    @model_validator(mode="before")
    @classmethod
    def _drop_replaced(cls, data):
        """Profiles written before 2026-12-01 carry two constants the runs did not bear out, dropped
        on reading: `host_sync_per_doubling` (the issue time grown by log2 of the ranks; it fitted to
        0, and `zero3_host_serial` replaced it) and `comm_efficiency` (a scale on the calibrated bus
        bandwidth; 84 runs left it at 1.2 +- 0.6, the fit's bound, and fitting it changed nothing:
        collectives now run at the calibrated bandwidth). Profiles written before 2026-12-07 price
        ZeRO-3's walk over its parameters at the offloaded step per billion parameters
        (`zero3_offload_step_per_gparam`); it goes per tensor now, so that is dropped too and
        `zero3_offload_step_per_tensor` reads as not fitted until the profile is fitted again."""
        dropped = ("host_sync_per_doubling", "comm_efficiency", "zero3_offload_step_per_gparam")
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if k not in dropped}
        return data


class MemorySpec(_Strict):
    """GPU memory beyond what tensors allocate. torch's caching allocator reserves more than the
    peak allocation: `fragmentation` is that excess as a share of it for steps that neither offload
    the optimizer nor checkpoint, `fragmentation_checkpointed` for checkpointed steps, whose
    recomputation allocates and frees a layer's activations at a time, and for steps that keep the
    optimizer on the CPU `fragmentation_offload` (activations kept) and
    `fragmentation_offload_checkpointed`. The last holds the most: traced on H200, ZeRO-1/2's
    initialisation leaves about twice the bf16 parameters cached, which a checkpointed offload
    step's small activations do not fill, and its loss and fp64 norm casts take blocks beside it. On
    H200 (316 fitted runs, ZeRO-1/2 offload's start-up blocks taken out first) the pool sat at the
    median 31% above the peak allocation with offload and checkpointing (58 runs), 8% with offload
    alone (10), 20% checkpointed without offload (132) and 15% with neither (116). None takes
    `fragmentation` (`fragmentation_offload_checkpointed`: `fragmentation_offload` first, the one
    offload figure of profiles fitted before the split).
    `offload_start_pool` is what a ZeRO-1/2 step with optimizer offload holds beyond its share, as a
    multiple of its bf16 trainable parameters: the blocks DeepSpeed's start-up leaves cached when it
    flattens them (traced at about twice them free before the first step; a step reuses part), which
    a step with small activations does not fill: 0.645 on H200 over 33 runs (None: nothing, as
    profiles fitted before it).
    `collective_pool` is what the pool holds beyond those shares in a step whose ranks exchange data
    (more than one GPU), in GiB, not a share: the 35 fitted runs on 2 and 4 GPUs held a median 2.54
    GiB more, across ZeRO stages and dp/sp splits, where one-GPU steps on the same hosts held none (why
    is not measured); None: nothing. `framework_reserved` is device memory outside torch's pool
    (CUDA context, NCCL, cuBLAS). `host_process_per_rank` is each training process's host memory
    before any offload (the CUDA context, PyTorch, DeepSpeed, the data): about 1.8 GiB on H200 hosts."""

    framework_reserved: GiB
    fragmentation: Fraction
    fragmentation_checkpointed: Fraction | None = None
    fragmentation_offload: Fraction | None = None
    fragmentation_offload_checkpointed: Fraction | None = None
    offload_start_pool: Ratio | None = None
    collective_pool: GiB | None = None
    host_process_per_rank: GiB = Quantity(
        value=0.0, unit="GiB", source="not measured: fitted from real runs' host memory (neutral value)")


class FitRecord(_Strict):
    """What `advisor fit` changed: every constant as it was before the fit, the provenance before
    it, and the runs it was fitted to. Refitting starts from `prefit`, so fits never stack."""

    date: str
    run_ids: list[str]
    prefit: dict[str, Quantity | None]  # dotted path -> the constant before the fit (None: absent)
    prefit_provenance: Provenance


class HardwareProfile(_Strict):
    schema_version: int
    name: str
    provenance: Provenance
    gpus_per_node: Count
    gpu: GpuSpec
    host: HostSpec
    intra_node: Network
    inter_node: Network
    overlap: Overlap
    power: Power
    overheads: Overheads
    memory: MemorySpec
    fit: FitRecord | None = None  # set by advisor fit (provenance kind "fitted")

    @model_validator(mode="before")
    @classmethod
    def _check_version(cls, data):
        if isinstance(data, dict) and data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(
                f"unknown schema_version {shown(data.get('schema_version'))}; this advisor reads {SCHEMA_VERSION}"
            )
        return data

    @model_validator(mode="after")
    def _physically_possible(self) -> "HardwareProfile":
        """Rates, bandwidths, capacities, powers and counts are positive; times, slowdowns and
        efficiencies are not negative (a zero time is a cost that is absent); every constant and curve
        lies within its unit's physical range and counts are whole; shares lie in [0, 1]; each GPU phase
        draws between idle and the cap, the CPU optimizer at least the CPU's idle."""
        dump = self.model_dump(exclude={"fit"})
        for name, q in _leaves(dump, {"value", "unit", "source"}):
            if not np.isfinite(q["value"]):
                raise ValueError(f"{name}: must be a finite number, got {q['value']}")
            zero_is_absent = q["unit"] in ("s", "fraction") or name in _MAY_BE_ZERO
            if q["value"] < 0 or (q["value"] == 0 and not zero_is_absent):
                what = "zero or more" if zero_is_absent else "positive"
                raise ValueError(f"{name}: must be {what} ({q['unit']}), got {q['value']}")
            _check_range(name, [q["value"]], q["unit"])
        for name, curve in _leaves(dump, {"x", "y", "x_unit", "y_unit"}):
            _check_range(f"{name}.y", curve["y"], curve["y_unit"])
        for name in _SHARES:
            value = _value_at(self, name)
            if value is not None and value > 1:
                raise ValueError(f"{name}: a share, must lie in [0, 1], got {value}")
        idle, cap = self.power.gpu.idle.value, self.gpu.power_cap.value
        if idle > cap:
            raise ValueError(f"power.gpu.idle: {idle} W is above gpu.power_cap {cap} W")
        gp = self.power.gpu
        watts = {phase: getattr(gp, phase).value for phase in GpuPower.model_fields if phase != "wait_decay"}
        for key in ("decay_s", "burst_s") if gp.wait_decay is not None else ():
            seconds = getattr(gp.wait_decay, key).value
            if not seconds > 0:
                raise ValueError(f"power.gpu.wait_decay.{key}: must be positive (s), got {seconds}")
        for phase, w in watts.items():
            if not idle <= w <= cap:
                raise ValueError(f"power.gpu.{phase}: {w} W must lie between idle ({idle} W) and the cap ({cap} W)")
        if self.power.cpu.optimizer.value < self.power.cpu.idle.value:
            raise ValueError(f"power.cpu.optimizer: {self.power.cpu.optimizer.value} W is below power.cpu.idle "
                             f"({self.power.cpu.idle.value} W)")
        return self

    @property
    def host_issue_scale(self) -> float:
        """How much slower this profile's host issues work than the hosts its issue constants were
        fitted on: the ratio of the two host-probe readings; 1 where either is unknown. Lent H200 hosts
        ran one host-bound ZeRO-3 step 1.5x apart, and a run's residual followed its probe."""
        here, fitted_at = self.host.issue_per_layer, self.overheads.issue_fitted_at_per_layer
        if here is None or fitted_at is None or not fitted_at.value > 0:
            return 1.0
        return here.value / fitted_at.value

    def on_host(self, issue_per_layer_s: float | None) -> "HardwareProfile":
        """This profile on a host whose probe read `issue_per_layer_s` (a run's `host_probe`); itself
        when the run has no probe."""
        if issue_per_layer_s is None or not issue_per_layer_s > 0:
            return self
        probed = Quantity(value=float(issue_per_layer_s), unit="s", source="the run's host probe")
        return self.model_copy(update={"host": self.host.model_copy(update={"issue_per_layer": probed})})

    def describe(self) -> str:
        p = self.provenance
        return f"{self.name} ({p.kind}, {p.gpu}, {p.date})"

    def trust(self) -> str:
        """One line on how far to trust this profile's numbers, for the top of every table."""
        p = self.provenance
        return {
            "datasheet": f"{self.name}: datasheet figures, not measured; run `advisor calibrate` on your machine",
            "measured": f"{self.name}: measured on {p.gpu} ({p.date}), not yet fitted to real runs",
            "fitted": f"{self.name}: measured on {p.gpu} and fitted to real runs ({p.date})",
            "derived": f"{self.name}: derived from another machine's measurements by datasheet ratios, not measured; "
                       "run `advisor calibrate` on your machine",
            "cpu": f"{self.name}: measured on a CPU without a GPU; for tests, not for decisions",
        }[p.kind]

    def to_json(self) -> str:
        return json.dumps(self.model_dump(), indent=2)


# Quantities whose zero means "absent" (said in their docstrings) although their unit is not a time.
_MAY_BE_ZERO = {"memory.framework_reserved", "memory.host_process_per_rank", "memory.collective_pool",
                "memory.offload_start_pool"} | {
    f"gpu.{block}.{width}" for block in ("layer_elementwise", "vision_elementwise")
    for width in ("per_hidden", "per_kv", "per_ffn")}  # a width that moves no bytes of its own
# Fractions that are shares of a whole (the slowdowns and efficiencies may exceed 1: a collective
# beside compute was measured 87-90% slower on H200).
_SHARES = ("memory.fragmentation", "memory.fragmentation_checkpointed", "memory.fragmentation_offload",
           "memory.fragmentation_offload_checkpointed")


# The physical range of a constant (and of a curve's y) by its unit. Past them a number is a typo or
# a broken measurement, not a machine: a GPU of 1e30 GiB had recommend pick a micro-batch of 1,128 GiB.
# Today's parts: 0.1-8 TB/s HBM, up to 2.5e15 dense flop/s, a 1,000-1,200 W GPU, 0.1-2 TB of GPU memory.
_UNIT_RANGE = {
    "bytes/s": (1e6, 1e14),  # at most 100 TB/s
    "flop/s": (1e6, 1e17),
    "params/s": (1e3, 1e13),
    "W": (0.0, 1e4),
    "s": (0.0, 3600.0),
    "GiB": (0.0, 65536.0),
    "count": (1.0, float(MAX_GPUS)),
    "fraction": (0.0, 100.0),  # slowdowns and efficiencies may exceed 1 (a collective ran 90% slower)
    "ratio": (0.0, 1e3),
    "bytes": (0.0, 1e6),  # bytes a parameter or an element moves
}
# Constants with a range of their own.
_KEY_RANGE = {
    "gpus_per_node": (1.0, float(MAX_GPUS_PER_NODE)),
    "gpu.memory_gib": (1.0, 4096.0),
    "host.memory_gib": (1.0, 65536.0),
    "host.cores": (1.0, 65536.0),
}


def _check_range(name: str, values: list[float], unit: str) -> None:
    low, high = _KEY_RANGE.get(name, _UNIT_RANGE.get(unit, (-np.inf, np.inf)))
    for value in values:
        if not low <= value <= high:
            raise ValueError(f"{name}: must lie in [{low:g}, {high:g}] {unit}, got {value:g}")
        if unit == "count" and not float(value).is_integer():
            raise ValueError(f"{name}: a count, must be a whole number, got {value:g}")


def _leaves(node: dict, keys: set[str], prefix: str = ""):
    """(dotted name, dump) of every node of a profile's dump that holds `keys` (a constant's, a
    curve's), lists included."""
    if keys <= node.keys():
        yield prefix[:-1], node
        return
    for key, child in node.items():
        children = child if isinstance(child, list) else [child]
        for i, item in enumerate(children):
            if isinstance(item, dict):
                where = f"{prefix}{key}.{i}." if isinstance(child, list) else f"{prefix}{key}."
                yield from _leaves(item, keys, where)


def sourced(profile: "HardwareProfile") -> dict[str, str]:
    """Every constant and curve of the profile by dotted name, with its source (the fit's record of
    earlier values left out)."""
    return {name: node["source"] for name, node in _leaves(profile.model_dump(exclude={"fit"}), {"source"})}


def _value_at(profile: "HardwareProfile", name: str) -> float | None:
    node = profile
    for key in name.split("."):
        node = getattr(node, key)
    return None if node is None else float(node.value)


def parse_profile(data: dict, origin: str = "<dict>") -> HardwareProfile:
    try:
        return HardwareProfile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(part) for part in first["loc"]) or "(top level)"
        if not first["loc"] and ": " in first["msg"]:  # a whole-profile check names its key itself
            key, _, message = first["msg"].removeprefix("Value error, ").partition(": ")
            raise ProfileError(f"{origin}: bad key '{key}': {message}") from None
        raise ProfileError(f"{origin}: bad key '{key}': {first['msg'].removeprefix('Value error, ')}") from None


def shipped_profiles() -> list[str]:
    """The names of the shipped profiles: NAME.json is a profile; NAME.band.json and the like are its companions."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.json") if "." not in p.stem)


def profile_path(name_or_path: str | Path = DEFAULT_PROFILE) -> Path:
    """The file of a shipped profile's name (`gh200`, `h200`), or the path given."""
    path = Path(name_or_path)
    if path.suffix != ".json":
        path = PROFILES_DIR / f"{name_or_path}.json"
        if not path.exists():
            raise ProfileError(f"unknown profile '{name_or_path}'; shipped profiles: {', '.join(shipped_profiles())}")
    if not path.exists():
        raise ProfileError(f"profile file not found: {path}")
    return path


def load_profile(name_or_path: str | Path = DEFAULT_PROFILE) -> HardwareProfile:
    """Load a shipped profile by name (`gh200`, `h200`) or any profile JSON by path."""
    path = profile_path(name_or_path)
    return parse_profile(read_json(path, ProfileError), origin=str(path))
