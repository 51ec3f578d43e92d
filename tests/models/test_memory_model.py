"""Memory model against DeepSpeed's own estimators, hand counts, and the shipped real runs.

DeepSpeed's estimators (`estimate_zero2_model_states_mem_needs`,
`estimate_zero3_model_states_mem_needs`) are imported here only, never in models/.
They give one figure of model states per GPU; the model splits it into what lives through the
whole step (`gpu_bytes`), the gradients held from backward to the step (`grad_gpu_bytes`) and
the step's transient copies (`step_gpu_bytes`). Known, deliberate differences, each asserted
exactly below:
- `additional_buffer_factor` (1.5 by default) is a safety margin on host memory; the model
  predicts the allocation itself.
- Host memory: the estimators count bytes, the model what torch's pinned-memory allocator holds
  (each pinned buffer rounded up to a power of two, `models.host_memory`) and ZeRO-1/2's pinned
  bf16 buffers, which the estimators leave out. So the model's host figure is at least the
  estimate's bytes (buffer factor divided out), and exactly the hand count below. ZeRO-2
  offload's estimate is max(4 * gpus, 16) bytes/param; the 4 * gpus term is the initialisation
  peak (every rank's fp32 copy on the CPU), not the training steady state, so the comparison is
  made where 16 wins (up to 4 GPUs).
- ZeRO-2 GPU, 2P + 18P/n: 2P + 12P/n live all the time, the bf16 gradient partition (2P/n)
  from backward to step, its fp32 copy (4P/n) in the step only; and the step first flattens
  the partition into a new bf16 tensor (2P/n) that the estimator leaves out. So the model's
  step peak is the estimate + 2P/n.
- ZeRO-3 GPU, 18P/n: DeepSpeed 0.19 allocates bf16 parameter partitions (2), a persistent bf16
  gradient partition buffer (2) and the fp32 master, momentum and variance (12); the step makes a
  flat bf16 copy (2) and an fp32 copy (4) of one sub-group's gradients at a time. So the step peak
  is 22P/n while a rank holds at most one sub-group. The estimator's `4 * largest_layer` is the
  gathered parameters, which the model counts as buffers (`stage3_max_live_parameters`).
- ZeRO-3 offload host: the bf16 gradient partition buffer (`grad_partitions_flat_buffer`)
  is on the host with optimizer offload: 2 bytes/param more than the estimator, before rounding.
"""
from __future__ import annotations


import numpy as np
import pytest

from models.architecture import Architecture, VisionEncoder, load_architecture
from models.flops import micro_step_work
from models.memory import (
    GEMM_WORKSPACE_BYTES,
    LOSS_TENSORS,
    MAX_LIVE_PARAMETERS,
    MOMENTS,
    activation_bytes_per_token,
    estimate,
    model_states,
)
from models.layout import SUB_GROUP_SIZE, Layout, offload_fraction
from models.host_memory import pinned_bytes
from models.params import count_params
from models.profile import load_profile
from models.strategy import Strategy, StrategyBatch
from models.workload import Workload
from runs.measured import shipped_run_files

ds12 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
ds3 = pytest.importorskip("deepspeed.runtime.zero.stage3")

BUFFER_FACTOR = 1.5  # DeepSpeed's additional_buffer_factor default
# The host-bound runs measured with the harness's old sampling thread keep their memory: only
# their time was slowed (data/runs/README.md).
RUNS = shipped_run_files()


def _counts(model: str):
    return count_params(Workload(load_architecture(model), 4096))


def _states(counts, gpus, stage, opt=0, ratio=1.0, param=0, ga=1, super_offload=(False,)):
    b = StrategyBatch.from_strategies([
        Strategy(gpus=gpus, gpus_per_node=gpus, zero_stage=stage, offload_optimizer="cpu" if opt else "none",
                 offload_ratio=ratio, offload_param="cpu" if param else "none", grad_accum=ga, super_offload=sup)
        for sup in super_offload])
    return model_states(counts, Layout.of(b, counts), b.grad_accum, b.super_offload)


def _gpu_host(counts, gpus, stage, **kw):
    """(step-peak model states per GPU, host bytes per node)."""
    s = _states(counts, gpus, stage, **kw)
    return float(s.step_peak_gpu_bytes[0]), float(s.host_bytes_per_rank[0]) * gpus


def _estimate(workload: Workload, strategy: Strategy):
    b = StrategyBatch.from_strategies([strategy])
    work = micro_step_work(workload, b.micro_batch, b.sp, b.checkpoint_every)
    return estimate(workload, count_params(workload), work, b, load_profile("h200"))


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_zero2_gpu_states_are_deepspeed_s_estimate_plus_the_flattened_partition(gpus):
    c = _counts("llama-2-7b")
    p = c.trainable
    _, gpu = ds12.estimate_zero2_model_states_mem_needs(p, num_gpus_per_node=gpus, cpu_offload=False)
    s = _states(c, gpus, 2)
    assert float(s.step_peak_gpu_bytes[0]) == pytest.approx(gpu + 2 * p / gpus, rel=1e-6)
    assert float(s.gpu_bytes[0]) == pytest.approx(2 * p + 12 * p / gpus)  # what the forward sees
    assert float(s.grad_gpu_bytes[0]) == pytest.approx(2 * p / gpus)
    assert float(s.host_bytes_per_rank[0]) == 0.0


@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_zero2_offload_matches_deepspeed_up_to_its_buffer_factor(gpus):
    c = _counts("llama-2-7b")
    p = c.trainable
    cpu, gpu = ds12.estimate_zero2_model_states_mem_needs(p, num_gpus_per_node=gpus, cpu_offload=True)
    ours_gpu, ours_host = _gpu_host(c, gpus, 2, opt=1)
    assert ours_gpu == pytest.approx(gpu, rel=1e-6)  # bf16 parameters only
    assert ours_host >= cpu / BUFFER_FACTOR  # 16 bytes/param on the node, and what pinning adds
    r = p / gpus
    # pinned: fp32 master and its gradient, the bf16 partition copy, the largest parameter's bf16
    # buffer; plain: Adam's two moments
    pinned = 2 * pinned_bytes(4 * r) + pinned_bytes(2 * r) + pinned_bytes(2 * c.largest_module)
    assert ours_host == pytest.approx(gpus * (float(pinned) + 8 * r), rel=1e-12)


@pytest.mark.parametrize("gpus", [2, 4])
def test_zero3_gpu_states_match_deepspeed_plus_gradient_partition_and_flat_copy(gpus):
    c = _counts("qwen2.5-1.5b")
    p = c.trainable
    assert p / gpus <= SUB_GROUP_SIZE  # one sub-group per rank: its fp32 gradient copy is whole
    _, gpu, largest = ds3.estimate_zero3_model_states_mem_needs(
        p, c.largest_module, num_gpus_per_node=gpus, cpu_offload=False, cpu_offload_params=False)
    s = _states(c, gpus, 3)
    assert float(s.step_peak_gpu_bytes[0]) == pytest.approx(gpu - largest + 4 * p / gpus, rel=1e-6)
    assert float(s.gpu_bytes[0]) == pytest.approx(16 * p / gpus)  # persistent on ZeRO-3
    assert float(s.grad_gpu_bytes[0]) == 0.0  # the gradient partition buffer is in gpu_bytes
    assert float(s.host_bytes_per_rank[0]) == 0.0


def test_zero3_fp32_gradient_copy_is_one_sub_group_at_a_time():
    c = _counts("llama-2-7b")
    p = c.trainable
    s = _states(c, 4, 3)
    assert p / 4 > SUB_GROUP_SIZE
    assert float(s.step_peak_gpu_bytes[0]) == pytest.approx(16 * p / 4 + 6 * SUB_GROUP_SIZE, rel=1e-12)


@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_zero3_optimizer_offload_matches_deepspeed(gpus):
    c = _counts("llama-2-7b")
    p = c.trainable
    cpu, gpu, largest = ds3.estimate_zero3_model_states_mem_needs(
        p, c.largest_module, num_gpus_per_node=gpus, cpu_offload=True, cpu_offload_params=False, zero_init=True)
    ours_gpu, ours_host = _gpu_host(c, gpus, 3, opt=1)
    assert ours_gpu == pytest.approx(gpu - largest, rel=1e-6)  # bf16 parameter partition
    assert ours_host >= cpu / BUFFER_FACTOR + 2 * p
    assert ours_host == pytest.approx(gpus * _zero3_offload_host_rank(p / gpus), rel=1e-12)


@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_zero3_parameter_offload_matches_deepspeed(gpus):
    c = _counts("llama-2-7b")
    p = c.trainable
    cpu, gpu, largest = ds3.estimate_zero3_model_states_mem_needs(
        p, c.largest_module, num_gpus_per_node=gpus, cpu_offload=True, cpu_offload_params=True, zero_init=True)
    ours_gpu, ours_host = _gpu_host(c, gpus, 3, opt=1, param=1)
    assert gpu == largest and ours_gpu == 0.0  # nothing but gathered parameters stays on the GPU
    assert ours_host >= cpu / BUFFER_FACTOR + 2 * p
    r = p / gpus  # the bf16 parameter partition is pinned too, and so was each parameter's own at zero.Init
    each = sum(float(pinned_bytes(2 * n / gpus)) for n in c.decoder_tensors)
    assert ours_host == pytest.approx(gpus * (_zero3_offload_host_rank(r, param_offload=True)
                                              + float(pinned_bytes(2 * r)) + each), rel=1e-12)


def _zero3_offload_host_rank(r: float, share: float = 1.0, param_offload: bool = False) -> float:
    """ZeRO-3 optimizer offload by hand, per rank: the fp32 master and Adam's moments plain, each
    sub-group's fp32 gradient pinned, the bf16 gradient partitions pinned; and, when the bf16
    parameters are on the GPU, the bf16 copy of one sub-group that the cast to them makes on the host."""
    offloaded = share * r
    groups, last = divmod(offloaded, SUB_GROUP_SIZE)
    grads = groups * float(pinned_bytes(4 * SUB_GROUP_SIZE)) + float(pinned_bytes(4 * last))
    cast = 0.0 if param_offload else 2 * min(offloaded, SUB_GROUP_SIZE)
    return 12 * offloaded + grads + float(pinned_bytes(2 * r)) + cast


def test_zero0_and_zero1_hand_counts():
    c = _counts("llama-2-7b")
    p = c.trainable
    z0 = _states(c, 4, 0)
    # FP16_Optimizer for bf16: flat bf16 parameters and fp32 master/m/v whole; the bf16 gradients;
    # the step casts every gradient to fp32 (4P) and concatenates them (4P)
    assert (float(z0.gpu_bytes[0]), float(z0.grad_gpu_bytes[0]), float(z0.step_gpu_bytes[0])) == (14 * p, 2 * p, 8 * p)
    z1, z2 = _states(c, 4, 1), _states(c, 4, 2)
    assert float(z1.step_peak_gpu_bytes[0]) == float(z2.step_peak_gpu_bytes[0]) == pytest.approx(2 * p + 20 * p / 4)


def _deepspeed_cpu_share(n_sub: int, ratio: float) -> float:
    """stage3.py: sub-group i goes to the CPU when i >= int((1 - ratio) * n_sub)."""
    return sum(1 for i in range(n_sub) if i >= int((1 - ratio) * n_sub)) / n_sub


@pytest.mark.parametrize("params_per_rank", [5e8, 1e9, 2.5e9, 3.5e9, 7.9e9, 9.5e9])
@pytest.mark.parametrize("ratio", [0.1, 0.3, 0.5, 0.75, 0.9, 1.0])
def test_partial_offload_rounds_to_whole_sub_groups_like_deepspeed(params_per_rank, ratio):
    n_sub = int(np.ceil(params_per_rank / SUB_GROUP_SIZE))
    got = float(offload_fraction(3, 1, ratio, params_per_rank))
    assert got == pytest.approx(_deepspeed_cpu_share(n_sub, ratio))
    assert float(offload_fraction(2, 1, ratio, params_per_rank)) == 1.0  # ZeRO-1/2: all or nothing
    assert float(offload_fraction(3, 0, ratio, params_per_rank)) == 0.0


def test_activation_per_token_hand_count_and_ulysses():
    a = load_architecture("qwen2.5-0.5b")  # GQA: 14 heads, 2 KV heads
    w = Workload(a, 4096)
    full, ck = activation_bytes_per_token(w)
    h, f = 896, 4864
    # two RMSNorms (12h each: two fp32 copies of the input, the bf16 normalised value, the output),
    # q, k and v repeated to all heads, the SDPA output (2h each), SwiGLU's 4 wide tensors (8f),
    # and the fp32 log-sum-exp per head
    assert float(full) == 2 * 12 * h + 4 * 2 * h + 8 * f + 4 * 14
    assert ck == 2 * h
    full_sp, _ = activation_bytes_per_token(w, sp=np.array([1, 2]))
    assert list(full_sp - full) == [0.0, 2 * h]  # Ulysses: the all-to-all output feeding o_proj


@pytest.mark.parametrize("loss_dtype, bytes_per_logit", [("bf16", 2), ("fp32", 4)])
def test_peak_is_the_loss_not_a_sum_of_everything(loss_dtype, bytes_per_logit):
    """The brief's example: qwen2.5-0.5b at 32k with checkpointing. At the loss the checkpoints,
    the final norm and the cross-entropy's 3 tokens x vocab tensors (in the loss dtype: fp32 when the
    logits are cast first) are alive; the gradient buckets and the step's copies come later, when
    the logits are gone."""
    a = load_architecture("qwen2.5-0.5b")
    w = Workload(a, 32768, loss_dtype=loss_dtype)
    m = _estimate(w, Strategy(gpus=1, zero_stage=2, checkpoint_every=1))
    t, h, p = 32768, a.hidden_size, count_params(w).trainable
    loss = 2 * p + 12 * p + GEMM_WORKSPACE_BYTES + t * (a.num_layers * 2 * h + 12 * h
                                                       + LOSS_TENSORS * bytes_per_logit * a.vocab_size)
    assert float(m.moment_gpu_bytes["loss"][0]) == pytest.approx(loss)
    assert m.peak_moment(0) == "loss" and float(m.allocated_gpu_bytes[0]) == pytest.approx(loss)
    total = sum(float(m.moment_gpu_bytes[name][0]) for name in MOMENTS)
    assert float(m.allocated_gpu_bytes[0]) < total * 0.6  # a peak, not a sum of everything ever allocated


def test_zero2_step_peak_when_activations_are_small():
    """qwen2.5-1.5b, 8k, checkpointed, one GPU: the step's flat bf16 and fp32 gradient copies
    (22 bytes/param in all) outweigh the loss (on bf16 logits, as the shipped run computed it)."""
    w = Workload(load_architecture("qwen2.5-1.5b"), 8192, loss_dtype="bf16")
    m = _estimate(w, Strategy(gpus=1, zero_stage=2, checkpoint_every=1))
    p = count_params(w).trainable
    assert m.peak_moment(0) == "step"
    assert float(m.allocated_gpu_bytes[0]) == pytest.approx(22 * p + GEMM_WORKSPACE_BYTES)


def test_zero12_buckets_and_accumulated_gradients_enter_the_backward():
    """Two bf16 buckets of reduce_bucket_size appear at the first gradient hook (one without
    overlap_comm); with accumulation the earlier micro-steps' gradient partition is held too."""
    w = Workload(load_architecture("qwen2.5-0.5b"), 2048)
    p = count_params(w).trainable
    base = _estimate(w, Strategy(gpus=1, zero_stage=2))
    one = _estimate(w, Strategy(gpus=1, zero_stage=2, overlap_comm=False))
    ga = _estimate(w, Strategy(gpus=1, zero_stage=2, grad_accum=4))
    rbs = Strategy().reduce_bucket_size
    head = lambda m: float(m.moment_gpu_bytes["head"][0])  # noqa: E731
    assert head(base) - head(one) == pytest.approx(2 * rbs)
    assert head(ga) - head(base) == pytest.approx(2 * p)
    assert float(ga.moment_gpu_bytes["loss"][0] - base.moment_gpu_bytes["loss"][0]) == pytest.approx(2 * p)


def test_zero12_second_reduction_holds_the_partition_and_the_bucket_s_flat_copy():
    """Traced on both ranks (2x H200, TinyLlama 8k ZeRO-1 and ZeRO-2, checkpointed): rank 1 owns the
    first bucket's gradients, so it reduces the second bucket holding its gradient partition and
    the bucket's flat copy (allreduce_bucket). Its peak, 13.03 GiB, is that moment; rank 0's,
    12.36 GiB, is the step. A model whose parameters fit one bucket has no second reduction, and
    ZeRO-3 none of this kind."""
    w = Workload(load_architecture("tinyllama-1.1b"), 8192, loss_dtype="bf16")
    for stage in (1, 2):
        m = _estimate(w, Strategy(gpus=2, zero_stage=stage, checkpoint_every=1))
        assert m.peak_moment(0) == "second_reduce"
        assert float(m.allocated_gpu_bytes[0]) / 2**30 == pytest.approx(13.03, rel=0.01)
        assert float(m.moment_gpu_bytes["step"][0]) / 2**30 == pytest.approx(12.36, rel=0.01)
    smaller_bucket = _estimate(w, Strategy(gpus=2, zero_stage=2, checkpoint_every=1, reduce_bucket_size=2 * 10**8))
    assert float(smaller_bucket.moment_gpu_bytes["second_reduce"][0]) < float(m.moment_gpu_bytes["second_reduce"][0])
    one_bucket = _estimate(w, Strategy(gpus=2, zero_stage=2, checkpoint_every=1, reduce_bucket_size=2 * 10**9))
    assert float(one_bucket.moment_gpu_bytes["second_reduce"][0]) == 0.0
    z3 = _estimate(w, Strategy(gpus=2, zero_stage=3, checkpoint_every=1))
    assert float(z3.moment_gpu_bytes["second_reduce"][0]) == 0.0


def test_zero3_gathered_parameters_only_where_gathering_allocates():
    """One GPU without parameter offload: a 'gathered' parameter is a view of its partition.
    Several GPUs, or parameters on the host: up to stage3_max_live_parameters are resident."""
    w = Workload(load_architecture("qwen2.5-1.5b"), 8192)
    c = count_params(w)
    one = _estimate(w, Strategy(gpus=1, zero_stage=3, offload_optimizer="cpu", checkpoint_every=1))
    off = _estimate(w, Strategy(gpus=1, zero_stage=3, offload_optimizer="cpu", offload_param="cpu",
                                checkpoint_every=1))
    two = _estimate(w, Strategy(gpus=2, zero_stage=3, offload_optimizer="cpu", checkpoint_every=1))
    gathered = 2 * min(MAX_LIVE_PARAMETERS, c.forward_params)
    loss = lambda m: float(m.moment_gpu_bytes["loss"][0])  # noqa: E731
    assert loss(off) - loss(one) == pytest.approx(gathered - 2 * c.trainable)  # partition now on the host
    assert loss(two) - loss(one) == pytest.approx(gathered - 2 * c.trainable / 2)


def test_frozen_vision_encoder_costs_bf16_parameters_only():
    vision = VisionEncoder(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=256, patch_size=4,
                           image_size=16, projector_hidden_size=128)
    arch = Architecture(name="vlm", hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=4,
                        intermediate_size=512, vocab_size=1000, vision=vision)
    frozen = count_params(Workload(arch, 256, images=1))
    trained = count_params(Workload(arch, 256, images=1, train_vision=True))
    assert frozen.vision_encoder == trained.vision_encoder > 0
    enc = frozen.vision_encoder
    step = lambda c, gpus, stage: _gpu_host(c, gpus, stage)[0]  # noqa: E731
    assert step(trained, 1, 0) - step(frozen, 1, 0) == 24 * enc - 2 * enc
    # ZeRO-2 does not shard frozen weights (they are in no optimizer group); ZeRO-3 does
    # a text-only batch still holds the tower's weights and the projector's optimizer state
    text_only = count_params(Workload(arch, 256))
    assert (text_only.vision_encoder, text_only.projector, text_only.frozen) == (enc, frozen.projector, enc)
    assert not text_only.vision_active and text_only.forward_params == text_only.llm
    llm_only = count_params(Workload(Architecture(**{**arch.__dict__, "vision": None}), 256))
    assert step(frozen, 4, 2) - step(llm_only, 4, 2) == pytest.approx(2 * enc + 20 * frozen.projector / 4 + 2 * frozen.projector)
    assert step(frozen, 4, 3) - step(llm_only, 4, 3) == pytest.approx(2 * enc / 4 + 22 * frozen.projector / 4)


def test_partial_zero3_offload_keeps_the_gpu_sub_groups_whole_state_on_the_gpu():
    c = _counts("llama-2-70b")
    p = c.trainable
    per_rank = p / 8
    share = _deepspeed_cpu_share(int(np.ceil(per_rank / SUB_GROUP_SIZE)), 0.5)
    assert 0 < share < 1
    gpu, host = _gpu_host(c, 8, 3, opt=1, ratio=0.5)
    # bf16 parameters + fp32 master, m, v and fp32 gradients of the GPU sub-groups (persistent)
    assert gpu == pytest.approx(2 * per_rank + 16 * (1 - share) * per_rank)
    # host per node (8 ranks here): the CPU share's states + the bf16 gradient buffer for all
    assert host == pytest.approx(8 * _zero3_offload_host_rank(per_rank, share))


def test_superoffload_holds_its_gradients_twice_and_the_worker_s_pinned_buffer_on_the_host():
    """Handing the gradients to the worker moves them to shared memory; the pinned blocks they leave
    stay cached. The worker pins an fp32 buffer for the largest sub-group, rounded up."""
    c = _counts("llama-2-7b")
    p = c.trainable
    s = _states(c, 4, 3, opt=1, super_offload=(False, True))
    extra = float(s.host_bytes_per_rank[1] - s.host_bytes_per_rank[0])
    assert extra == 4 * p / 4 + float(pinned_bytes(4 * min(p / 4, SUB_GROUP_SIZE)))
    assert float(s.gpu_bytes[0]) == float(s.gpu_bytes[1])


def test_superoffload_host_memory_of_the_runs_that_sampled_it_counting_shared_pages_once():
    """The runs whose harness sampled the process tree's proportional set size (shared pages once):
    14.5-15.4% under before the shared gradients and the buffer's rounding were counted. The worker
    process's own runtime is not counted, so a little under is expected; more than 5% is not."""
    errors = _host_errors(lambda record: bool(record.result.peak_host_mem_pss_gib),
                          lambda result: result.peak_host_mem_pss_gib)
    assert len(errors) >= 3
    assert min(errors) > -0.05 and max(errors) < 0.05, errors


def _shipped_runs():
    """(label, workload, strategy, measured max_memory_allocated GiB) of the shipped runs, as the fit reads them."""
    from runs.jsonl import read_records
    from runs.measured import to_measured_run

    out = []
    for record in (r for path in RUNS for r in read_records(path)):
        if record.result.status != "ok" or not record.result.peak_gpu_mem_gib:
            continue
        run = to_measured_run(record)
        out.append((run.label, run.workload, run.strategy, record.result.peak_gpu_mem_gib))
    return out


def test_allocated_memory_of_the_shipped_h200_runs():
    """A regression guard: 70 runs (1, 2 and 4 GPUs) were used to check the structure, in-sample; 16
    more (one GPU, fp32 loss) and then 14 (1 and 2 GPUs, offload at 1-16 threads), both 2026-11-30,
    were predicted before they ran (see benchmarks/memory_accuracy.py), and 36 more on 2026-11-30
    (1 and 2 GPUs, 24 of them labels already seen, measured again: a label counts once), and 11 new
    labels on 2026-12-01 (offload at 1-16 threads, 1 and 2 GPUs, predicted before they ran), and 11
    more that day on one GPU, each predicted before it ran (six before the refit, five after), and
    the ZeRO-3 thread test's two, and five more labels on a later slice that day (host-bound, with
    checkpointing and without, predicted before they ran), and 13 held-out labels on two more slices
    (two decoder shapes no preset has among them), and the last thread test's two, and 13 settings
    run again with expandable segments (their allocation is the default allocator's), and 16 steps of
    a 256-wide decoder (host-bound, 2026-12-01, predicted before they ran), and 8 settings never
    measured on the next slice and 7 more of TinyLlama at 1-4 micro-batches, and 7 more labels of ZeRO-0/1/2
    at 1-4 micro-batches on two more slices, and 6 settings never measured on the next, and 8 ZeRO-3
    settings and 6 of ZeRO-2 offload at 2-4 micro-batches on two more, and 8 more ZeRO-3 settings
    and 7 GPU-bound ones on two more, and two host-bound settings at one thread run again and again
    on the next, and 8 host-bound settings never measured on the next, and 3 of CPU offload on the
    last (2026-12-02; all predicted before they ran), and 35 labels run again on two more, and 19 more
    from three closed loops and a sweep of CPU checkpointing on the next two, and 5 of CPU
    checkpointing under ZeRO-1 and ZeRO-3, with and without offload, on two more, and 5 CPU-offload
    settings never measured on the next (predicted before they ran), and TinyLlama's ZeRO-3 offload at
    two reduce buckets on the next, and 8 memory settings never measured, with 3 of SuperOffload, on
    the next, and 4 more of parameter offload and SuperOffload on the next, and 10 + 6 of Llama-3.2-1B
    and -3B, architectures never fitted, on the next two, and 6 of a Gemma-2B-shaped decoder (head 256,
    one KV head, a 256k vocabulary) on the next, and 2 more labels (that shape's ZeRO-0 step at 4k and
    qwen2.5-3b's at 2k) whose passes' power was traced on the last two, and 8 labels measured again with the
    20-s window (2026-12-04), and 5 labels of ZeRO-3 steps measured on four leases and in two processes of
    one (2026-12-04), and 8 of Qwen3 (heads wider than hidden / heads, q/k norms) on two more (2026-12-05;
    all predicted before they ran; within 0.2% but
    SuperOffload's +2% to +4% and llama-1.3b-mha's parameter offload, +4.9%). On average
    within 1%; an under-prediction is an OOM the advisor would recommend. The worst under was TinyLlama
    at 8k, ZeRO-1/2, 4 GPUs, 6.6%, until the second reduction's moment (traced on both ranks,
    2026-12-01); then ZeRO-3 with offload under Ulysses sp 4, 5.8%, until ZeRO-3's flat copy of the
    bucket was counted in fp32 under Ulysses (2026-12-02); now it is a 7B ZeRO-3 run with a quarter
    of its states offloaded, 3.6%. The worst over were ZeRO-1/2 offload runs, checkpointed, at the
    first reduction (gqa-2.4b +8.7% and +10.3%, TinyLlama +10.8%) until the traces of 2026-12-02 showed
    that the reduction's flat copy is freed before the fp64 norm casts begin. Now TinyLlama 32k ZeRO-3
    at sp 4 (4 GPUs) is 7.6% over, since the fp32 copy moved its peak from the loss to the first
    reduction, and llama-1.3b-mha 4k with parameter offload +4.9%; every other run is within +4%."""
    errors = {}
    for label, w, s, measured in _shipped_runs():
        predicted = float(_estimate(w, s).allocated_gpu_bytes[0]) / 2**30
        errors[label] = predicted / measured - 1
    assert len(errors) == 496
    assert max(errors.values()) < 0.08, max(errors, key=errors.get)
    assert np.mean(np.abs(list(errors.values()))) < 0.01
    assert min(errors.values()) > -0.05, min(errors, key=errors.get)


def test_pinned_buffers_hold_the_next_power_of_two():
    gib = 2**30
    assert [float(x) for x in pinned_bytes([5.75 * gib, 8 * gib, 8 * gib + 1, 0.0])] == [8 * gib, 8 * gib, 16 * gib, 0.0]


def test_accumulating_zero2_offload_pins_one_buffer_per_parameter():
    """accumulated_grads_in_cpu: a pinned bf16 buffer per parameter, each rounded on its own."""
    c = _counts("qwen2.5-1.5b")
    s = _states(c, 1, 2, opt=1, ga=1), _states(c, 1, 2, opt=1, ga=4)
    extra = float(s[1].host_bytes_per_rank[0] - s[0].host_bytes_per_rank[0])
    assert sum(c.decoder_tensors) == c.trainable
    assert extra == pytest.approx(sum(float(pinned_bytes(2 * n)) for n in c.decoder_tensors))
    assert extra > 2 * c.trainable  # the rounding is not free


def _host_errors(wanted, measured) -> list[float]:
    """Predicted / measured - 1 of the peak host memory (per node) of every ok shipped run that
    `wanted(record)` keeps, measured as `measured(result)` says."""
    from runs.jsonl import read_records
    from runs.measured import to_measured_run
    from models.predict import predict

    profile, errors = load_profile("h200"), []
    for path in RUNS:
        for record in read_records(path):
            if record.result.status == "ok" and wanted(record):
                run = to_measured_run(record)
                errors.append(predict(run.workload, run.strategy, profile).peak_host_mem_gib
                              / measured(record.result) - 1)
    return errors


def _offload_host_errors(zero3: bool) -> list[float]:
    """Against the peak resident memory (VmHWM, summed over the node's ranks): every untraced shipped
    CPU-offload run of ZeRO-3 (`zero3`) or of ZeRO-1/2, SuperOffload's left out."""
    def wanted(record) -> bool:
        s = record.candidate.strategy
        return bool(record.result.peak_host_mem_gib and s is not None and not record.result.memory_traced
                    and s.get("offload_optimizer", "none") != "none" and (s["zero_stage"] == 3) == zero3
                    and not s.get("super_offload"))

    return _host_errors(wanted, lambda result: result.peak_host_mem_gib)


def test_zero12_offload_host_memory_of_the_shipped_runs_is_not_under_predicted():
    """Every shipped ZeRO-1/2 CPU-offload run against the model: counting bytes without the pinned
    allocator's rounding was 16-40% short on all of them (benchmarks/host_memory_accuracy.py prints
    the table)."""
    errors = _offload_host_errors(zero3=False)
    assert len(errors) >= 40
    assert min(errors) > -0.03 and max(errors) < 0.03


def test_zero1_carries_whole_gradients_and_its_buckets_on_the_gpu_to_the_boundary_even_with_offload():
    """ZeRO-1 reduces only at the accumulation boundary: every parameter's bf16 gradient, and the two
    buckets its first backward allocated, stay on the GPU between micro-steps; no per-parameter buffer
    is pinned on the host. A held-out run, qwen2.5-0.5b 16k ZeRO-1 offload at two micro-steps, held
    2.8 GiB more on the GPU than predicted and 1.5 GiB less on the host; with the gradients counted it
    was still 1.9 GiB short, and its trace showed both 1 GB buckets alive at the loss."""
    w = Workload(load_architecture("qwen2.5-0.5b"), 16384)
    p = count_params(w).trainable

    def at(stage, ga):
        return _estimate(w, Strategy(gpus=1, zero_stage=stage, offload_optimizer="cpu", checkpoint_every=1, grad_accum=ga))

    z1 = float(at(1, 2).moment_gpu_bytes["loss"][0] - at(1, 1).moment_gpu_bytes["loss"][0])
    z2 = float(at(2, 2).moment_gpu_bytes["loss"][0] - at(2, 1).moment_gpu_bytes["loss"][0])
    assert z1 == pytest.approx(2 * p + 2 * 2 * Strategy().reduce_bucket_size) and z2 == 0.0
    assert float(at(1, 2).host_bytes_per_rank[0]) == float(at(1, 1).host_bytes_per_rank[0])
    assert float(at(2, 2).host_bytes_per_rank[0]) > float(at(2, 1).host_bytes_per_rank[0])


def test_cpu_checkpointing_pins_each_older_checkpoint_and_keeps_the_newest_on_the_gpu():
    """DeepSpeed's activation offload engine (keep_last_count=1): the newest checkpoint stays on the GPU,
    each older one goes to a pinned host buffer of its own, rounded up to a power of two. qwen2.5-1.5b
    at 32k: a checkpoint is 96 MiB and pins 128; counting bytes left its host memory 15.5% short."""
    w = Workload(load_architecture("qwen2.5-1.5b"), 32768)
    gpu_ck, cpu_ck = (_estimate(w, Strategy(gpus=1, zero_stage=2, checkpoint_every=1, cpu_checkpointing=c))
                      for c in (False, True))
    layers, one = w.arch.num_layers, 32768 * 2 * w.arch.hidden_size
    assert one == 96 * 2**20
    host = float(cpu_ck.host_bytes_per_rank[0] - gpu_ck.host_bytes_per_rank[0])
    assert host == (layers - 1) * 128 * 2**20
    moved = float(gpu_ck.moment_gpu_bytes["loss"][0] - cpu_ck.moment_gpu_bytes["loss"][0])
    assert moved == (layers - 1) * one  # the newest stays


def test_zero3_offload_host_memory_of_the_shipped_runs_is_not_under_predicted():
    """Every shipped ZeRO-3 optimizer-offload run but SuperOffload's: each held about 1.8 GiB a rank more
    than the pinned count (0.9 for qwen2.5-0.5b) until the host's bf16 cast of one sub-group, on its way
    to the GPU, was counted; with parameter offload, 7-11% more until the pinned partition zero.Init
    makes for each parameter was. Within -2% in-sample; a held-out run (qwen2.5-0.5b 8k with
    parameter offload, machine AP) came in at -3.7%: the bound is the target, 5% under."""
    errors = _offload_host_errors(zero3=True)
    assert len(errors) >= 25
    assert min(errors) > -0.05 and max(errors) < 0.07


def test_zero3_under_ulysses_holds_its_bucket_and_the_bucket_s_flat_copy_in_fp32():
    """Ulysses communicates in fp32 (seq_parallel_communication_data_type): ZeRO-3's bucket and the flat
    copy reduce_scatter_coalesced makes of it are fp32, 2 bytes an element more than at sp 1. Every
    llama-2-7b ZeRO-3 run at sp 2-4 peaked at the first reduction 0.7-1.2 GiB above the bf16 count."""
    w = Workload(load_architecture("llama-2-7b"), 16384)
    p = count_params(w).trainable
    rbs = Strategy().reduce_bucket_size
    end = [float(_estimate(w, Strategy(gpus=2, zero_stage=3, sp=sp, checkpoint_every=1)).moment_gpu_bytes["end"][0])
           for sp in (1, 2)]
    assert end[1] - end[0] == pytest.approx(2 * rbs + 2 * min(rbs, p))
