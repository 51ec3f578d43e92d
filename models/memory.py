"""Peak GPU memory and host memory of each strategy, with the DeepSpeed allocations behind them.

Model states follow what DeepSpeed 0.19 allocates with bf16 and Adam (read from its
source, `runtime/zero/stage_1_and_2.py`, `stage3.py`, `fp16/fused_optimizer.py`):
- bf16 parameters (2 bytes), bf16 gradients (2), fp32 master weights, momentum and
  variance (12), and an fp32 copy of the gradients (4) made for the optimizer step.
- ZeRO-0 (FP16_Optimizer for bf16): everything whole on every GPU: 20 bytes/param.
- ZeRO-1: the 16 bytes of optimizer state and fp32 gradients sharded; bf16 grads whole.
- ZeRO-2: bf16 gradients sharded too. ZeRO-3: bf16 parameters sharded too; without
  offload its fp32 gradient copy exists for one sub-group (`sub_group_size`) at a time.
- Optimizer offload moves the 16 bytes to pinned host memory; under ZeRO-3 the bf16
  gradient partition buffer lives on the host too (`grad_partitions_flat_buffer`).
  ZeRO-3's partial `ratio` offloads whole sub-groups: DeepSpeed puts sub-group i on the
  CPU when i >= int((1 - ratio) * n_subgroups), so a rank with one sub-group offloads all.
- Parameter offload (ZeRO-3) keeps the bf16 partition on the host as well.
- SuperOffload adds its CPU-Adam worker's fp32 gradient buffer (one sub-group) on the host.
- A frozen vision encoder is bf16 parameters only (ZeRO-3 shards them; ZeRO 0-2 do not,
  because frozen parameters are not in the optimizer's groups).
Activations assume fused (flash / SDPA) attention, so there is no s^2 term; see
`activation_bytes_per_token` for the tensors counted. Host memory is per node.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.flops import BF16, MicroStepWork
from models.params import ParamCounts
from models.profile import HardwareProfile
from models.strategy import OFFLOAD_CPU, StrategyBatch
from models.workload import Workload

GIB = 2**30
SUB_GROUP_SIZE = 1_000_000_000  # DeepSpeed's zero_optimization.sub_group_size default (elements)
MAX_LIVE_PARAMETERS = 1_000_000_000  # stage3_max_live_parameters default (elements)
OPTIMIZER_BYTES_PER_PARAM = 12  # fp32 master + Adam momentum + variance
FP32_GRAD_BYTES_PER_PARAM = 4
LOGITS_BYTES_PER_VOCAB = 10  # bf16 logits (2) + fp32 copy for the loss (4) + saved log-softmax (4)


@dataclass(frozen=True)
class ModelStates:
    """Bytes per GPU and per rank on the host for parameters, gradients and optimizer state."""

    gpu_bytes: np.ndarray
    host_bytes_per_rank: np.ndarray
    offload_fraction: np.ndarray  # share of the optimizer state on the CPU (DeepSpeed's sub-group rounding)


@dataclass(frozen=True)
class MemoryEstimate:
    """Per GPU, bytes; host per node, bytes. `peak_gpu_bytes` is what must fit in the GPU."""

    model_states_gpu_bytes: np.ndarray
    buffers_gpu_bytes: np.ndarray
    activations_gpu_bytes: np.ndarray
    allocated_gpu_bytes: np.ndarray  # what torch.cuda.max_memory_allocated would show
    peak_gpu_bytes: np.ndarray  # allocated x (1 + fragmentation) + framework reserve
    host_bytes_per_rank: np.ndarray
    host_bytes_per_node: np.ndarray
    offload_fraction: np.ndarray


def offload_fraction(stage, offload_optimizer, ratio, params_per_rank, sub_group_size=SUB_GROUP_SIZE) -> np.ndarray:
    """Share of a rank's optimizer state DeepSpeed puts on the CPU.

    ZeRO-1/2 offload everything. ZeRO-3 assigns whole sub-groups: with n of them,
    those with index >= int((1 - ratio) * n) go to the CPU (stage3.py, `subgroup_to_device`).
    """
    stage = np.asarray(stage)
    on = np.asarray(offload_optimizer) == OFFLOAD_CPU
    n_sub = np.maximum(1.0, np.ceil(np.asarray(params_per_rank, dtype=float) / sub_group_size))
    on_gpu = np.floor((1.0 - np.asarray(ratio, dtype=float)) * n_sub)  # int() in DeepSpeed, same float rounding
    z3 = (n_sub - np.minimum(on_gpu, n_sub)) / n_sub
    return np.where(on, np.where(stage == 3, z3, 1.0), 0.0)


def model_states(counts: ParamCounts, gpus, stage, offload_optimizer, ratio, offload_param,
                 grad_accum=1, super_offload=False, sub_group_size=SUB_GROUP_SIZE) -> ModelStates:
    """Model-state bytes per GPU and host bytes per rank (arrays broadcast over strategies)."""
    n = np.asarray(gpus, dtype=float)
    stage = np.asarray(stage)
    p, f = float(counts.trainable), float(counts.frozen)
    shard = np.where(stage >= 1, n, 1.0)
    p_rank = p / shard  # trainable parameters whose optimizer state this rank owns
    r = offload_fraction(stage, offload_optimizer, ratio, p_rank, sub_group_size)
    opt_off = np.asarray(offload_optimizer) == OFFLOAD_CPU
    par_off = (np.asarray(offload_param) == OFFLOAD_CPU) & (stage == 3)

    params16 = BF16 * (p + f) / np.where(stage == 3, n, 1.0)
    params16_gpu = np.where(par_off, 0.0, params16)
    grads16 = np.select([stage <= 1, stage == 2], [BF16 * p, BF16 * p / n], BF16 * p / n)
    grads16_gpu = np.where((stage >= 2) & opt_off, 0.0, grads16)
    opt_gpu = OPTIMIZER_BYTES_PER_PARAM * (1 - r) * p_rank
    # ZeRO-3 without offload makes the fp32 gradient copy one sub-group at a time; with (partial)
    # offload the GPU sub-groups keep theirs (initialize_optimizer_states).
    fp32_grad_gpu = np.where((stage == 3) & ~opt_off,
                             FP32_GRAD_BYTES_PER_PARAM * np.minimum(p_rank, sub_group_size),
                             FP32_GRAD_BYTES_PER_PARAM * (1 - r) * p_rank)
    gpu = params16_gpu + grads16_gpu + opt_gpu + fp32_grad_gpu

    host = (OPTIMIZER_BYTES_PER_PARAM + FP32_GRAD_BYTES_PER_PARAM) * r * p_rank
    host = host + np.where((stage == 3) & opt_off, BF16 * p_rank, 0.0)  # pinned bf16 grad partition buffer
    accum = (np.asarray(grad_accum) > 1) & opt_off & (stage <= 2)  # accumulated_grads_in_cpu (bf16)
    host = host + np.where(accum, BF16 * p_rank, 0.0)
    host = host + np.where(par_off, params16, 0.0)
    # SuperOffload's CPU-Adam worker copies each sub-group's gradients into its own fp32 buffer
    # sized for the largest sub-group (superoffload_utils.py, max_grad_numel).
    sup = np.asarray(super_offload, dtype=bool) & opt_off & (stage == 3)
    host = host + np.where(sup, FP32_GRAD_BYTES_PER_PARAM * np.minimum(r * p_rank, sub_group_size), 0.0)
    return ModelStates(gpu_bytes=gpu, host_bytes_per_rank=host, offload_fraction=r)


def activation_bytes_per_token(workload: Workload) -> tuple[float, float]:
    """(one decoder layer kept for backward, one checkpointed layer) in bytes per token.

    Kept for backward, bf16: the layer input and both norm outputs (3h), the post-attention
    residual (h), q (h), k and v (2*kv), the attention output (h), the SwiGLU's gate, up,
    silu(gate) and product (4f); plus the attention's fp32 log-sum-exp (4 bytes per head).
    A checkpointed layer keeps only its input (h).
    """
    a = workload.arch
    h, kv, f = a.hidden_size, a.kv_dim, a.intermediate_size
    full = BF16 * (6 * h + 2 * kv + 4 * f) + 4 * a.num_heads
    return float(full), float(BF16 * h)


def _vit_bytes_per_token(workload: Workload) -> float:
    """One ViT block kept for backward: 8 hidden-sized tensors, the MLP's 2 (gated: 4) wide ones."""
    v = workload.arch.vision
    wide = 4 if v.gated_mlp else 2
    return float(BF16 * (8 * v.hidden_size + wide * v.intermediate_size) + 4 * v.num_heads)


def activations(workload: Workload, work: MicroStepWork, cpu_checkpointing) -> tuple[np.ndarray, np.ndarray]:
    """(peak activation bytes on the GPU, checkpoint bytes moved to the host) for one micro-step.

    The peak is what is kept for backward plus the larger of two transients: the logits
    at the loss (bf16 + fp32 + log-softmax, large at 150k vocabularies) or, with
    checkpointing, one layer's recomputed activations; plus the backward's gradient
    workspace (gate and up gradients, two hidden-sized gradients).
    """
    a = workload.arch
    t = work.tokens_per_gpu
    full, ckpt = activation_bytes_per_token(workload)
    n_ck = work.checkpointed_layers
    cpu_ck = np.asarray(cpu_checkpointing, dtype=bool)
    ckpt_bytes = t * n_ck * ckpt
    kept = t * (a.num_layers - n_ck) * full + np.where(cpu_ck, 0.0, ckpt_bytes) + t * BF16 * 2 * a.hidden_size
    logits = t * LOGITS_BYTES_PER_VOCAB * a.vocab_size
    workspace = t * BF16 * (2 * a.intermediate_size + 2 * a.hidden_size)
    recompute = np.where(n_ck > 0, t * full, 0.0)
    peak = kept + np.maximum(logits, recompute + workspace)

    if a.vision is not None and workload.vision_groups:
        v = a.vision
        tv = work.vis_groups_per_gpu * work.vis_patches_per_group
        tm = tv / v.spatial_merge**2
        projector = tm * BF16 * (v.hidden_size * v.spatial_merge**2 + 2 * v.projector_hidden_size)
        vis = projector
        if workload.train_vision:
            nv = work.vis_checkpointed_layers
            vfull = _vit_bytes_per_token(workload)
            vck = tv * nv * BF16 * v.hidden_size
            vis = vis + tv * (v.num_layers - nv) * vfull + np.where(cpu_ck, 0.0, vck)
            ckpt_bytes = ckpt_bytes + vck
        peak = peak + vis
    return peak, np.where(cpu_ck, ckpt_bytes, 0.0)


def buffers(counts: ParamCounts, b: StrategyBatch) -> np.ndarray:
    """Communication buffers per GPU, bytes.

    ZeRO-0: the flattened all-reduce bucket. ZeRO-1/2: contiguous-gradient buckets of
    reduce_bucket_size elements, two with overlap_comm (double buffering). ZeRO-3: one
    gradient bucket, the live gathered parameters (largest module + prefetch bucket,
    capped by stage3_max_live_parameters) and the largest module's gathered gradient.
    """
    stage = b.zero_stage
    bucket = BF16 * b.reduce_bucket_size.astype(float)
    z0 = BF16 * np.minimum(b.reduce_bucket_size, counts.trainable).astype(float)
    z12 = bucket * np.where(b.overlap_comm, 2.0, 1.0)
    live = np.minimum(MAX_LIVE_PARAMETERS, counts.largest_module + b.prefetch_bucket_size.astype(float))
    z3 = bucket + BF16 * live + BF16 * counts.largest_module
    return np.select([stage == 0, stage <= 2], [z0, z12], z3)


def estimate(workload: Workload, counts: ParamCounts, work: MicroStepWork, b: StrategyBatch,
             profile: HardwareProfile) -> MemoryEstimate:
    states = model_states(counts, b.gpus, b.zero_stage, b.offload_optimizer, b.offload_ratio,
                          b.offload_param, b.grad_accum, b.super_offload)
    buf = buffers(counts, b)
    act, ckpt_host = activations(workload, work, b.cpu_checkpointing)
    allocated = states.gpu_bytes + buf + act
    frag = profile.memory.fragmentation.value
    reserve = profile.memory.framework_reserved.value * GIB
    peak = allocated * (1.0 + frag) + reserve
    host_rank = states.host_bytes_per_rank + ckpt_host
    ranks_per_node = np.minimum(b.gpus, b.gpus_per_node)
    return MemoryEstimate(
        model_states_gpu_bytes=states.gpu_bytes, buffers_gpu_bytes=buf, activations_gpu_bytes=act,
        allocated_gpu_bytes=allocated, peak_gpu_bytes=peak, host_bytes_per_rank=host_rank,
        host_bytes_per_node=host_rank * ranks_per_node, offload_fraction=states.offload_fraction,
    )
