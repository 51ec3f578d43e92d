"""Peak GPU memory and host memory of each strategy: the largest of the memory in use at the
moments of a training step where it peaks, not a sum of everything that is ever allocated.

What is allocated where, read from DeepSpeed 0.19 (`runtime/zero/stage_1_and_2.py`, `stage3.py`,
`fp16/fused_optimizer.py`, `partitioned_param_coordinator.py`, `superoffload/`) with bf16 and Adam,
and from the harness's model (`calibration/harness/model.py`):

Model states that live through the whole step (`model_states`, P trainable parameters, n GPUs):
- ZeRO-0 (bf16 runs DeepSpeed's FP16_Optimizer): bf16 flat parameters (2P) and fp32 master,
  momentum and variance (12P). Its bf16 gradients (2P) exist from backward to the step.
- ZeRO-1/2: bf16 parameters whole (2P), fp32 master/momentum/variance sharded (12P/n). The bf16
  gradients of this rank's partition (2P/n, `grads_in_partition`) exist from backward to the step.
  ZeRO-1 and ZeRO-2 allocate the same on the GPU in 0.19 (both keep only the partition's gradients).
- ZeRO-3: bf16 parameter partition (2P/n), a bf16 gradient partition buffer (2P/n,
  `grad_partitions_flat_buffer`) and the fp32 states (12P/n), all persistent.
- Optimizer offload moves the fp32 states (and ZeRO-3's gradient partition buffer) to host
  memory, much of it pinned and so rounded up to a power of two (`models.host_memory`); ZeRO-3's
  partial `ratio` offloads whole sub-groups (i >= int((1 - ratio) * n_sub)), and a GPU sub-group
  then also keeps its fp32 gradient. Parameter offload keeps ZeRO-3's bf16 partition on the host.
  A frozen vision encoder is bf16 parameters only.
Buffers: ZeRO-1/2 allocate two (one without overlap_comm) bf16 gradient buckets of
`reduce_bucket_size` elements at the first gradient hook of a backward and free them in the
reduction's epilogue, which ZeRO-2 runs after every backward and ZeRO-1 only at the accumulation
boundary (so under accumulation ZeRO-1's buckets are alive through the next micro-step's forward);
ZeRO-3 keeps one such bucket from initialisation on, in fp32 under Ulysses, which communicates in
fp32 (sp > 1: measured on 4x H200 as +0.93 GiB after `deepspeed.initialize` for the default
5e8-element bucket, in all five ZeRO-3 sp runs, none of the sp 1 ones); ZeRO-1/2 optimizer offload
keeps a bf16 staging buffer of the largest parameter. ZeRO-3 keeps gathered parameters while they are reused
within `stage3_max_reuse_distance`, up to `stage3_max_live_parameters` (1e9 elements each by
default). The model takes that cap, min(max live, parameters the forward uses): the measured
qwen2.5-1.5b runs (2 GPUs, or parameter offload) sit at it, although a reading of the trace and
prefetch rules suggests about half; so it is the least certain term. On one GPU without parameter
offload "gathering" only makes views of the partitions, so it costs nothing.

The moments (`estimate`), each a sum of what is alive together:
- loss: end of forward and the loss backward. Saved activations of every layer, and the
  cross-entropy in the workload's loss dtype: its backward holds the saved log-softmax, the
  incoming gradient and the log-softmax gradient, 3 tensors of tokens x vocab (fp32 when the
  logits are cast first, as Hugging Face does: 12 bytes per entry; bf16: 6). The forward's
  moment is smaller (bf16 logits, their fp32 copy, the log-softmax: 10 bytes).
- head: the first gradient hook, after the LM head's backward: activations still saved, the
  ZeRO-1/2 buckets just allocated, the LM head's gradient (a tied embedding keeps it to the end).
- layer: the last decoder layer's backward: its recomputed activations (checkpointing) and the
  MLP's gradient workspace.
- reduce: the first full gradient bucket (only when the trainable parameters exceed it): the
  layers not yet back-propagated, plus what the reduction allocates (a flat copy of the bucket;
  with optimizer offload, a GPU copy of the gradient partition and the fp64 copy that its norm is
  computed on).
- second_reduce (ZeRO-1/2): the next bucket's reduction on the rank that owns the first bucket's
  gradients, which holds its gradient partition from the first reduction on.
- end: the end of backward, activations freed, all gradients held.
- step: the optimizer step with its transient gradient copies (ZeRO-0: fp32 copies of every
  gradient and their flat concatenation; ZeRO-1/2: a flat bf16 copy of the partition and its
  fp32 copy; ZeRO-3: the same for one sub-group; the fp64 copy of the largest gradient that the
  norm is computed on).
Activations assume fused (flash / SDPA) attention, so there is no s^2 term. Host memory is per node.
With CPU checkpointing, DeepSpeed's activation offload engine keeps the newest checkpoint on the
GPU and moves each older one to a pinned host buffer of its own (rounded up to a power of two,
`models.host_memory.pinned_bytes`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.flops import BF16, FP32, FP64, MicroStepWork
from models.host_memory import offloaded_host_bytes, pinned_bytes
from models.layout import SUB_GROUP_SIZE, Layout
from models.params import ParamCounts
from models.profile import HardwareProfile
from models.strategy import StrategyBatch
from models.workload import Workload

GIB = 2**30
MAX_LIVE_PARAMETERS = 1_000_000_000  # stage3_max_live_parameters default (elements)
NORM_CHUNK_ELEMENTS = 250_000_000  # ZeRO-3's _constant_buffered_norm2 casts to fp64 in chunks this long
OPTIMIZER_BYTES_PER_PARAM = 12  # fp32 master + Adam momentum + variance
FP32_GRAD_BYTES_PER_PARAM = 4
# Cross-entropy: in its backward the saved log-softmax output, the gradient coming from nll_loss
# and the log-softmax gradient are alive together, in the loss dtype (Workload.loss_bytes).
LOSS_TENSORS = 3
# The harness's RMSNorm saves, per hidden element, two fp32 copies of its input (one squared for
# the variance, one scaled: 4 + 4 bytes), the bf16 normalised value (2) and its output (2).
RMSNORM_BYTES_PER_ELEMENT = 2 * FP32 + 2 * BF16
# cuBLAS and cuBLASLt workspaces, allocated through torch's caching allocator (so counted by
# max_memory_allocated); 32 MiB each is the size cuBLAS recommends, and torch uses, on Hopper.
GEMM_WORKSPACE_BYTES = 2 * 32 * 2**20
MOMENTS = ("loss", "head", "layer", "reduce", "second_reduce", "end", "step")
# The allocator's pool over the allocated peak, a profile figure for each kind of step (each the median of
# the fitted runs of its kind, `models.fit`): profile field -> the runs it is taken over. Offloading
# steps split by checkpointing: traced (2026-12-04, BW), a checkpointed ZeRO-2 offload step's pool
# kept the blocks DeepSpeed's initialisation left cached (about twice the bf16 parameters) beside
# logits-sized blocks its loss could not fit into them, 1.57-1.64x its small allocated peak; an
# offload step that keeps its activations filled those blocks, 1.11-1.15x (BW, BX), as steps without offload.
# Since 2026-12-05 a ZeRO-1/2 offload step's start-up blocks are a term of their own
# (`start_pool_base_bytes`), a multiple of its parameters, and the shares are what is left.
FRAGMENTATION_FIELDS = {
    "fragmentation_offload_checkpointed": "checkpointed measured runs with optimizer offload",
    "fragmentation_offload": "non-checkpointed measured runs with optimizer offload",
    "fragmentation_checkpointed": "checkpointed measured runs without optimizer offload",
    "fragmentation": "non-checkpointed measured runs without optimizer offload"}
# What a profile without a field's own figure takes instead (profiles fitted before offloading
# steps were split hold one figure for all of them in `fragmentation_offload`).
FRAGMENTATION_FALLBACK = {"fragmentation_offload_checkpointed": "fragmentation_offload"}


def fragmentation_index(offloads_optimizer, checkpointed) -> np.ndarray:
    """Which of FRAGMENTATION_FIELDS (by position) a step's pool takes."""
    return np.select([offloads_optimizer & checkpointed, offloads_optimizer, checkpointed], [0, 1, 2], 3)


def start_pool_base_bytes(zero_stage, offloads_optimizer, trainable_params) -> np.ndarray:
    """What `memory.offload_start_pool` multiplies: a ZeRO-1/2 optimizer-offload step's bf16 trainable
    parameters (each rank flattens them all at start-up), 0 for any other step. Traced on H200
    (2026-12-04, BW): DeepSpeed's start-up left about twice them cached in the pool, and a step whose
    activations are small does not fill those blocks, so its pool is not a share of its peak."""
    z12_offload = np.isin(zero_stage, (1, 2)) & np.asarray(offloads_optimizer, dtype=bool)
    return np.where(z12_offload, BF16 * float(trainable_params), 0.0)


def start_pool_ratio(mem) -> float:
    """A profile's `memory.offload_start_pool`; 0 for a profile fitted before it existed."""
    return mem.offload_start_pool.value if mem.offload_start_pool is not None else 0.0


def fragmentation_shares(mem) -> np.ndarray:
    """A profile's `memory` shares in FRAGMENTATION_FIELDS' order; an absent one takes its
    FRAGMENTATION_FALLBACK, else `fragmentation`."""
    def share(field):
        value = getattr(mem, field)
        if value is None and field in FRAGMENTATION_FALLBACK:
            return share(FRAGMENTATION_FALLBACK[field])
        return (value or mem.fragmentation).value

    return np.array([share(field) for field in FRAGMENTATION_FIELDS])


@dataclass(frozen=True)
class ModelStates:
    """Parameters, gradients and optimizer state: bytes per GPU, and per rank on the host."""

    gpu_bytes: np.ndarray  # alive through the whole step (forward included)
    grad_gpu_bytes: np.ndarray  # gradients held from the end of backward to the step (and across accumulation)
    step_gpu_bytes: np.ndarray  # transient gradient copies of the optimizer step, on top of both
    host_bytes_per_rank: np.ndarray

    @property
    def step_peak_gpu_bytes(self) -> np.ndarray:
        """Model states at the optimizer step, the figure DeepSpeed's estimators approximate."""
        return self.gpu_bytes + self.grad_gpu_bytes + self.step_gpu_bytes


@dataclass(frozen=True)
class MemoryEstimate:
    """Per GPU, bytes; host per node, bytes. `peak_gpu_bytes` is what must fit in the GPU."""

    model_states_gpu_bytes: np.ndarray  # persistent model states (see ModelStates.gpu_bytes)
    buffers_gpu_bytes: np.ndarray  # persistent buffers: ZeRO-3 bucket, offload staging, GEMM workspaces
    activations_gpu_bytes: np.ndarray  # activations and loss buffers at the loss (the forward's peak)
    moment_gpu_bytes: dict[str, np.ndarray]  # what is allocated at each moment of `MOMENTS`
    allocated_gpu_bytes: np.ndarray  # the largest of them: what torch.cuda.max_memory_allocated would show
    reserved_gpu_bytes: np.ndarray  # allocated x (1 + fragmentation) (+ start pool, collective_pool): max_memory_reserved
    peak_gpu_bytes: np.ndarray  # reserved + memory outside torch's pool: what must fit on the GPU
    host_bytes_per_rank: np.ndarray
    host_bytes_per_node: np.ndarray
    layout: Layout  # what the time model reads too

    def peak_moment(self, i: int) -> str:
        """The moment of the step at which strategy i's GPU memory peaks."""
        return max(MOMENTS, key=lambda name: float(self.moment_gpu_bytes[name][i]))


def model_states(counts: ParamCounts, lay: Layout, grad_accum=1, super_offload=False) -> ModelStates:
    """Model-state bytes per GPU and host bytes per rank (arrays broadcast over strategies)."""
    n, stage = lay.gpus, lay.zero_stage
    p, f = float(counts.trainable), float(counts.frozen)
    largest = float(counts.largest_module)
    p_rank = lay.trainable_per_rank
    r = lay.offload_fraction
    opt_off, par_off, z3 = lay.optimizer_offload, lay.param_offload, lay.z3

    params16 = BF16 * (p + f) / np.where(z3, n, 1.0)
    params16_gpu = np.where(par_off, 0.0, params16)
    opt_gpu = OPTIMIZER_BYTES_PER_PARAM * (1 - r) * p_rank
    # ZeRO-3 with (partial) offload gives each GPU sub-group a persistent fp32 gradient buffer.
    fp32_grad_gpu = np.where(z3 & opt_off, FP32_GRAD_BYTES_PER_PARAM * (1 - r) * p_rank, 0.0)
    grad_partition_gpu = np.where(z3 & ~opt_off, BF16 * p_rank, 0.0)  # grad_partitions_flat_buffer
    gpu = params16_gpu + opt_gpu + fp32_grad_gpu + grad_partition_gpu

    # Gradients held between backward and step: ZeRO-0 param.grad (whole), ZeRO-1/2 the partition.
    grads = np.select([stage == 0, (stage <= 2) & ~opt_off], [BF16 * p, BF16 * p_rank], 0.0)
    # The step's transient copies. ZeRO-0: p.grad.to(fp32) for every gradient (4P) and their
    # flattening (4P). ZeRO-1/2: the partition flattened (2P/n) and cast to fp32 (4P/n). ZeRO-3:
    # the same for one sub-group at a time. Before them, the gradient norm casts each gradient
    # tensor to fp64, one at a time. With optimizer offload the step runs on the CPU.
    norm64 = FP64 * np.minimum(largest, p_rank)
    z12_step = np.maximum((BF16 + FP32) * p_rank, norm64)
    z3_step = np.maximum((BF16 + FP32) * np.minimum(p_rank, SUB_GROUP_SIZE), FP64 * np.minimum(largest / n, p_rank))
    step = np.select([stage == 0, opt_off, stage <= 2], [2 * FP32 * p, 0.0, z12_step], z3_step)

    host = offloaded_host_bytes(counts, lay, grad_accum, super_offload)
    return ModelStates(gpu_bytes=gpu, grad_gpu_bytes=grads, step_gpu_bytes=step, host_bytes_per_rank=host)


def activation_bytes_per_token(workload: Workload, sp=1) -> tuple[np.ndarray, float]:
    """(one decoder layer kept for backward, one checkpointed layer) in bytes per token.

    What autograd saves in the harness's decoder layer: two RMSNorms of 12 bytes per hidden
    element each (`RMSNORM_BYTES_PER_ELEMENT`). Attention keeps q and,
    after the GQA repeat to all heads, k and v (heads x head_dim wide each, `attention_dim`), the
    SDPA output (the same width) and its fp32 log-sum-exp (4 bytes per head). The SwiGLU keeps gate,
    silu(gate), up and their product (4f). Under Ulysses (sp > 1) the all-to-all's output feeding
    o_proj is a tensor of its own (attention_dim). With q and k normalised per head (Qwen3), each
    norm keeps its two fp32 copies and its bf16 normalised value (RoPE, next, keeps only its tables)
    and an fp32 rsqrt per head; Gemma 3's sandwich norms the same over h. A checkpointed layer keeps
    only its input (h).
    """
    a = workload.arch
    h, q, f = a.hidden_size, a.attention_dim, a.intermediate_size
    full = 2 * RMSNORM_BYTES_PER_ELEMENT * h + BF16 * (4 * q + 4 * f) + FP32 * a.num_heads
    if a.qk_norm:
        full += (RMSNORM_BYTES_PER_ELEMENT - BF16) * (q + a.kv_dim) + FP32 * (a.num_heads + a.num_kv_heads)
    if a.sandwich_norms:  # two more norms whose outputs go to the residual adds, which keep nothing
        full += 2 * (RMSNORM_BYTES_PER_ELEMENT - BF16) * h
    ulysses = np.where(np.asarray(sp) > 1, BF16 * q, 0.0)
    return full + ulysses, float(BF16 * h)


def final_norm_bytes_per_token(workload: Workload) -> float:
    """The final RMSNorm's saved tensors, its output being the LM head's input."""
    return float(RMSNORM_BYTES_PER_ELEMENT * workload.arch.hidden_size)


def _vit_bytes_per_token(workload: Workload) -> float:
    """One ViT block kept for backward: both LayerNorms' inputs and outputs, the fused qkv
    output (3 hidden-sized), the attention output (h), the MLP's input and output of the
    activation (2 wide, gated 4); plus the attention's fp32 log-sum-exp."""
    v = workload.arch.vision
    wide = 4 if v.gated_mlp else 2
    return float(BF16 * (8 * v.hidden_size + wide * v.intermediate_size) + FP32 * v.num_heads)


def _vision_saved(workload: Workload, work: MicroStepWork, cpu_ck) -> tuple[np.ndarray, np.ndarray]:
    """(vision activations kept on the GPU for backward, checkpoints moved to the host).

    The projector keeps its merged input and the GELU's input and output. A trained encoder
    also keeps each block's activations (or, checkpointed, the block input), the patch
    embedding's input and the final LayerNorm's input; a frozen one runs without autograd.
    """
    a = workload.arch
    zero = np.zeros_like(work.tokens_per_gpu)
    if a.vision is None or not workload.vision_groups:
        return zero, zero
    v = a.vision
    tv = work.vis_groups_per_gpu * work.vis_patches_per_group
    tm = tv / v.spatial_merge**2
    kept = tm * BF16 * (v.hidden_size * v.spatial_merge**2 + 2 * v.projector_hidden_size)
    host = zero
    if workload.train_vision:
        nv = work.vis_checkpointed_layers
        vck = tv * nv * BF16 * v.hidden_size
        patch_in = 3 * v.patch_size**2 * v.temporal_patch
        kept = kept + tv * (v.num_layers - nv) * _vit_bytes_per_token(workload) + np.where(cpu_ck, 0.0, vck)
        kept = kept + tv * BF16 * (patch_in + v.hidden_size)
        host = np.where(cpu_ck, nv * pinned_bytes(tv * BF16 * v.hidden_size), 0.0)
    return kept, host


def estimate(workload: Workload, counts: ParamCounts, work: MicroStepWork, b: StrategyBatch,
             profile: HardwareProfile) -> MemoryEstimate:
    """Memory of each strategy at each moment of the step (see the module docstring); the peak is their max."""
    a = workload.arch
    h, f, vocab, layers = a.hidden_size, a.intermediate_size, a.vocab_size, a.num_layers
    lay = Layout.of(b, counts)
    states = model_states(counts, lay, b.grad_accum, b.super_offload)
    stage, n = lay.zero_stage, lay.gpus
    p = float(counts.trainable)
    p_rank = lay.trainable_per_rank
    opt_off, par_off = lay.optimizer_offload, lay.param_offload
    z12, z3 = lay.z12, lay.z3
    rbs = b.reduce_bucket_size.astype(float)
    cpu_ck = np.asarray(b.cpu_checkpointing, dtype=bool)

    # Persistent buffers
    z3_bucket = np.where(z3, np.where(b.sp > 1, FP32, BF16) * rbs, 0.0)  # Ulysses communicates in fp32
    offload_staging = np.where(z12 & opt_off, BF16 * float(counts.largest_module), 0.0)
    buffers = z3_bucket + offload_staging + GEMM_WORKSPACE_BYTES
    base = states.gpu_bytes + buffers
    gathered = np.where(z3 & ((n > 1) | par_off), BF16 * np.minimum(MAX_LIVE_PARAMETERS, counts.forward_params), 0.0)
    base = base + gathered
    # Earlier micro-steps' gradients, carried to the boundary: ZeRO-0 and ZeRO-1 keep every
    # parameter's bf16 gradient (param.grad; ZeRO-1 reduces only at the boundary, with or without
    # offload), ZeRO-2 reduces each micro-step into its partition (on the host when offloaded).
    carried = np.select([stage <= 1, (stage == 2) & ~opt_off], [BF16 * p, BF16 * p_rank], 0.0)
    accumulated = np.where(b.grad_accum > 1, carried, 0.0)
    buckets = np.where(z12, BF16 * rbs * np.where(b.overlap_comm, 2.0, 1.0), 0.0)
    # ZeRO-1 frees its buckets only in the boundary's epilogue (engine.allreduce_gradients), so under
    # accumulation the first micro-step's buckets are alive through the next forward and its loss.
    # Traced (qwen2.5-0.5b 16k ZeRO-1 offload, two micro-steps): both buckets live at the loss's peak.
    buckets_carried = np.where((stage == 1) & (b.grad_accum > 1), buckets, 0.0)

    # Activations
    t = work.tokens_per_gpu
    full, ckpt = activation_bytes_per_token(workload, b.sp)
    n_ck = work.checkpointed_layers
    # CPU checkpointing (DeepSpeed's activation offload engine) keeps the newest checkpoint on the GPU
    # (keep_last_count=1) and moves each older one to a pinned host buffer of its own.
    on_host = np.where(cpu_ck, np.maximum(n_ck - 1, 0), 0)
    layer_stack = t * (layers - n_ck) * full + t * (n_ck - on_host) * ckpt
    vision, vision_host = _vision_saved(workload, work, cpu_ck)
    kept = layer_stack + vision
    final_norm = t * final_norm_bytes_per_token(workload)
    loss = t * LOSS_TENSORS * workload.loss_bytes * vocab
    recompute = np.where(n_ck > 0, t * full, 0.0)
    workspace = t * BF16 * 3 * f  # MLP backward: product's gradient, then silu(gate)'s and up's
    head = BF16 * float(vocab * h)  # the LM head's gradient
    tied_head = head if a.tie_embeddings else 0.0  # accumulates until the embedding's backward

    # The first full bucket: untied, the LM head's gradient is its first entry; then whole layers
    # (a bucket is reduced when the next gradient would overflow it). A tied embedding comes last.
    head_first = 0.0 if a.tie_embeddings else float(vocab * h)
    layers_done = np.clip(np.floor((rbs - head_first) / counts.layer), 0, layers)
    remaining = layer_stack * (layers - layers_done) / layers
    first_bucket = np.where(layers_done < layers, head_first + layers_done * counts.layer,
                            np.minimum(rbs, p - (vocab * h if a.tie_embeddings else 0.0)))
    first_bucket = np.minimum(first_bucket, p)
    # The second bucket: whole layers again, or what is left at the end of backward.
    layers_done_second = np.clip(np.floor((first_bucket + rbs - head_first) / counts.layer), 0, layers)
    remaining_second = layer_stack * (layers - layers_done_second) / layers
    second_bucket = np.clip(p - first_bucket, 0.0, rbs)
    largest_first = float(h * f) if a.tie_embeddings else float(vocab * h)
    largest_last = float(vocab * h)  # the embedding is back-propagated last
    # Every reduction concatenates its bucket into a flat copy: ZeRO-3's reduce_scatter_coalesced,
    # and ZeRO-1/2's allreduce_bucket (average_tensor sends every slice down the multi-rank
    # all-reduce path by default, use_multi_rank_bucket_allreduce). Traced on both ranks of
    # TinyLlama 8k ZeRO-1/2 on 2x H200: 0.92 GiB at allreduce_bucket on rank 1. Under Ulysses ZeRO-3
    # communicates in seq_parallel_communication_data_type (fp32 by default; engine.py): its bucket
    # holds fp32 gradients (z3_bucket above) and their flat copy is fp32 too.
    # Every llama-2-7b ZeRO-3 run at sp 2-4 (2 and 4 GPUs) peaked here 0.7-1.2 GiB above a bf16 copy.
    flat_copy = np.where(z3 & (b.sp > 1), FP32, BF16) * np.minimum(rbs, p)

    def offload_transient(numel):
        """Reducing an offloaded gradient: ZeRO-1/2 casts its partition to fp64 for the norm;
        ZeRO-3 copies the partition to the GPU and casts it to fp64 in chunks."""
        part = numel / n
        return np.where(z12, FP64 * np.minimum(part, p_rank),
                        BF16 * part + FP64 * np.minimum(part, NORM_CHUNK_ELEMENTS))

    # Under Ulysses, ZeRO-1/2 reduce the bucket in fp32 (allreduce_bucket): a full fp32 copy of it.
    # An earlier reading (each destination rank's share, rbs/n) fitted sp 2 but left TinyLlama at
    # sp 4 18% short (4x H200); the full copy matches both within 7%.
    ulysses = z12 & (b.sp > 1)
    ulysses_fp32 = np.where(ulysses, FP32 * rbs, 0.0)
    # With optimizer offload, ZeRO-1/2 cast each reduced gradient to fp64 for its norm only after the
    # reduction has returned and freed its flat copy (reduce_ipg_grads: average_tensor, then
    # copy_grads_in_partition): the larger of the two is held, not both. Traced on one H200 (gqa-2.4b
    # 8k ZeRO-2 offload): the fp64 casts at the peak, no flat copy beside them.
    z12_flat = BF16 * first_bucket + np.where(ulysses, FP32 * first_bucket, 0.0)
    reduce_extra = np.where(z3, flat_copy + np.where(opt_off, offload_transient(largest_first), 0.0),
                            np.where(opt_off, np.maximum(z12_flat, offload_transient(largest_first)), z12_flat))
    # ZeRO-1/2 allocate a rank's gradient partition (grads_in_partition) when the first bucket that
    # holds its gradients has been reduced. Backward begins with the last partition's parameters,
    # so their owner reduces the second bucket with its partition already allocated: the peak of
    # backward on that rank (the trace's rank 1, 0.63 GiB above rank 0).
    second_flat = BF16 * second_bucket + np.where(ulysses, FP32 * second_bucket, 0.0)
    second_extra = np.where(opt_off, np.maximum(second_flat, offload_transient(float(h * f))), BF16 * p_rank + second_flat)
    end_extra = np.where(z3, flat_copy, ulysses_fp32) + np.where(opt_off, offload_transient(largest_last), 0.0)

    moments = {
        "loss": base + accumulated + buckets_carried + kept + final_norm + loss,
        "head": base + accumulated + buckets + kept + final_norm + head,
        "layer": base + accumulated + buckets + kept + recompute + workspace + tied_head,
        "reduce": np.where((stage >= 1) & (p > rbs),
                           base + accumulated + buckets + remaining + vision + recompute + tied_head + reduce_extra,
                           0.0),
        "second_reduce": np.where(z12 & (p > rbs),
                                  base + accumulated + buckets + remaining_second + vision + recompute + tied_head
                                  + second_extra, 0.0),
        "end": base + accumulated + buckets + states.grad_gpu_bytes + np.where(stage >= 1, tied_head, 0.0) + end_extra,
        "step": states.gpu_bytes + buffers + states.grad_gpu_bytes + states.step_gpu_bytes,
    }
    allocated = np.maximum.reduce([moments[name] for name in MOMENTS])
    mem = profile.memory
    shares = fragmentation_shares(mem)
    collective = mem.collective_pool.value * GIB if mem.collective_pool is not None else 0.0
    start_pool = start_pool_ratio(mem) * start_pool_base_bytes(stage, opt_off, p)
    reserved = (allocated * (1.0 + shares[fragmentation_index(opt_off, n_ck > 0)]) + start_pool
                + np.where(n > 1, collective, 0.0))
    peak = reserved + mem.framework_reserved.value * GIB
    ckpt_host = on_host * pinned_bytes(t * ckpt) + vision_host
    host_rank = states.host_bytes_per_rank + ckpt_host + profile.memory.host_process_per_rank.value * GIB
    return MemoryEstimate(
        model_states_gpu_bytes=states.gpu_bytes, buffers_gpu_bytes=buffers,
        activations_gpu_bytes=kept + final_norm + loss, moment_gpu_bytes=moments,
        allocated_gpu_bytes=allocated, reserved_gpu_bytes=reserved, peak_gpu_bytes=peak, host_bytes_per_rank=host_rank,
        host_bytes_per_node=host_rank * lay.ranks_per_node, layout=lay,
    )
