"""Memory model against DeepSpeed's own estimators and hand counts.

DeepSpeed's estimators (`estimate_zero2_model_states_mem_needs`,
`estimate_zero3_model_states_mem_needs`) are imported here only, never in models/.
Known, deliberate differences, each asserted exactly below:
- `additional_buffer_factor` (1.5 by default) is a safety margin on host memory; the model
  predicts the allocation itself, so host figures agree after dividing it out.
- Host at ZeRO-2 offload: max(4 * gpus, 16) bytes/param; the 4 * gpus term is the
  initialisation peak (every rank's fp32 copy on the CPU), not the training steady state,
  so the comparison is made where 16 wins (up to 4 GPUs).
- ZeRO-3 GPU: DeepSpeed counts 18/n bytes per parameter; DeepSpeed 0.19 allocates bf16
  parameter partitions (2) and the bf16 gradient partition buffer (2) and the fp32 master,
  momentum and variance (12), plus an fp32 gradient copy for one sub-group at a time (4 while
  a rank holds at most one sub-group), so 20/n. Its `4 * largest_layer` term is our ZeRO-3
  gathered-parameter and gathered-gradient buffer (`buffers`).
- ZeRO-3 offload host: the bf16 gradient partition buffer (`grad_partitions_flat_buffer`)
  is on the host with optimizer offload: 2 bytes/param more than the estimator.
"""
from __future__ import annotations

import numpy as np
import pytest

from models.architecture import Architecture, VisionEncoder, load_architecture
from models.flops import micro_step_work
from models.memory import (
    LOGITS_BYTES_PER_VOCAB,
    SUB_GROUP_SIZE,
    activation_bytes_per_token,
    activations,
    buffers,
    model_states,
    offload_fraction,
)
from models.params import count_params
from models.strategy import Strategy, StrategyBatch
from models.workload import Workload

ds12 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
ds3 = pytest.importorskip("deepspeed.runtime.zero.stage3")

BUFFER_FACTOR = 1.5  # DeepSpeed's additional_buffer_factor default


def _counts(model: str):
    return count_params(Workload(load_architecture(model), 4096))


def _states(counts, gpus, stage, opt=0, ratio=1.0, param=0, ga=1):
    s = model_states(counts, np.array([gpus]), np.array([stage]), np.array([opt]), np.array([ratio]),
                     np.array([param]), np.array([ga]))
    return float(s.gpu_bytes[0]), float(s.host_bytes_per_rank[0]) * gpus  # one node: host per node


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_zero2_gpu_states_match_deepspeed(gpus):
    c = _counts("llama-2-7b")
    p = c.trainable
    cpu, gpu = ds12.estimate_zero2_model_states_mem_needs(p, num_gpus_per_node=gpus, cpu_offload=False)
    ours, host = _states(c, gpus, 2)
    assert ours == pytest.approx(gpu, rel=1e-6)  # 2P + 18P/n, int-truncated by DeepSpeed
    assert host == 0.0


@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_zero2_offload_matches_deepspeed_up_to_its_buffer_factor(gpus):
    c = _counts("llama-2-7b")
    p = c.trainable
    cpu, gpu = ds12.estimate_zero2_model_states_mem_needs(p, num_gpus_per_node=gpus, cpu_offload=True)
    ours_gpu, ours_host = _states(c, gpus, 2, opt=1)
    assert ours_gpu == pytest.approx(gpu, rel=1e-6)  # bf16 parameters only
    assert ours_host * BUFFER_FACTOR == pytest.approx(cpu, rel=1e-6)  # 16 bytes/param on the node


@pytest.mark.parametrize("gpus", [2, 4])
def test_zero3_gpu_states_match_deepspeed_plus_the_bf16_gradient_partition(gpus):
    c = _counts("qwen2.5-1.5b")
    p = c.trainable
    assert p / gpus <= SUB_GROUP_SIZE  # one sub-group per rank: its fp32 gradient copy is whole
    cpu, gpu, largest = ds3.estimate_zero3_model_states_mem_needs(
        p, c.largest_module, num_gpus_per_node=gpus, cpu_offload=False, cpu_offload_params=False)
    ours, host = _states(c, gpus, 3)
    assert ours == pytest.approx(gpu - largest + 2 * p / gpus, rel=1e-6)
    assert host == 0.0
    # DeepSpeed's 4 * largest layer is the gathered module (bf16 params + grads): our buffer has
    # it, plus the prefetch bucket and one reduce bucket (both bf16)
    b = StrategyBatch.from_strategies([Strategy(gpus=gpus, zero_stage=3)])
    extra = 2 * b.prefetch_bucket_size[0] + 2 * b.reduce_bucket_size[0]
    assert float(buffers(c, b)[0]) - extra == largest


def test_zero3_fp32_gradient_copy_is_one_sub_group_at_a_time():
    c = _counts("llama-2-7b")
    p = c.trainable
    ours, _ = _states(c, 4, 3)
    assert p / 4 > SUB_GROUP_SIZE
    assert ours == pytest.approx(16 * p / 4 + 4 * SUB_GROUP_SIZE, rel=1e-12)


@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_zero3_optimizer_offload_matches_deepspeed(gpus):
    c = _counts("llama-2-7b")
    p = c.trainable
    cpu, gpu, largest = ds3.estimate_zero3_model_states_mem_needs(
        p, c.largest_module, num_gpus_per_node=gpus, cpu_offload=True, cpu_offload_params=False, zero_init=True)
    ours_gpu, ours_host = _states(c, gpus, 3, opt=1)
    assert ours_gpu == pytest.approx(gpu - largest, rel=1e-6)  # bf16 parameter partition
    assert ours_host * BUFFER_FACTOR == pytest.approx(cpu + BUFFER_FACTOR * 2 * p, rel=1e-6)


@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_zero3_parameter_offload_matches_deepspeed(gpus):
    c = _counts("llama-2-7b")
    p = c.trainable
    cpu, gpu, largest = ds3.estimate_zero3_model_states_mem_needs(
        p, c.largest_module, num_gpus_per_node=gpus, cpu_offload=True, cpu_offload_params=True, zero_init=True)
    ours_gpu, ours_host = _states(c, gpus, 3, opt=1, param=1)
    assert gpu == largest and ours_gpu == 0.0  # nothing but the gathered layer stays on the GPU
    assert ours_host * BUFFER_FACTOR == pytest.approx(cpu + BUFFER_FACTOR * 2 * p, rel=1e-6)


def test_zero0_and_zero1_hand_counts():
    c = _counts("llama-2-7b")
    p = c.trainable
    z0, _ = _states(c, 4, 0)
    assert z0 == 20 * p  # FP16_Optimizer for bf16: everything whole
    z1, _ = _states(c, 4, 1)
    assert z1 == pytest.approx(2 * p + 2 * p + 16 * p / 4)


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


def test_activation_per_token_hand_count_and_checkpointing():
    a = load_architecture("llama-2-7b")
    w = Workload(a, 4096)
    full, ck = activation_bytes_per_token(w)
    h, f = 4096, 11008
    assert full == 2 * (6 * h + 2 * h + 4 * f) + 4 * 32  # LLaMA-2-7B has no GQA: kv = h
    assert ck == 2 * h
    plain, host0 = activations(w, micro_step_work(w, 1, 1, 0), False)
    ckpt, host1 = activations(w, micro_step_work(w, 1, 1, 1), False)
    cpu, host2 = activations(w, micro_step_work(w, 1, 1, 1), True)
    t = 4096
    logits = t * LOGITS_BYTES_PER_VOCAB * a.vocab_size
    # no checkpointing: 32 full layers + final norm in/out + the logits at the loss
    assert float(plain) == pytest.approx(t * (32 * full + 4 * h) + logits)
    # full checkpointing keeps 32 layer inputs; the peak adds the larger of the logits and
    # one recomputed layer with its gradient workspace
    recompute = t * full + t * 2 * (2 * f + 2 * h)
    assert float(ckpt) == pytest.approx(t * (32 * ck + 4 * h) + max(logits, recompute))
    assert float(host0) == 0.0 and float(host1) == 0.0
    # CPU checkpointing moves exactly the checkpoints to the host
    assert float(ckpt - cpu) == pytest.approx(t * 32 * ck)
    assert float(host2) == pytest.approx(t * 32 * ck)


def test_logits_dominate_at_32k_tokens_and_a_150k_vocabulary():
    a = load_architecture("qwen2.5-7b")
    w = Workload(a, 32768)
    act, _ = activations(w, micro_step_work(w, 1, 1, 1), False)
    logits = 32768 * 10 * 152064
    assert logits / 2**30 > 46  # bf16 + fp32 + log-softmax of 32k x 152k
    assert float(act) > logits
    # Ulysses divides them by sp
    act4, _ = activations(w, micro_step_work(w, 1, 4, 1), False)
    assert float(act4) == pytest.approx(float(act) / 4)


def test_frozen_vision_encoder_costs_bf16_parameters_only():
    vision = VisionEncoder(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=256, patch_size=4,
                           image_size=16, projector_hidden_size=128)
    arch = Architecture(name="vlm", hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=4,
                        intermediate_size=512, vocab_size=1000, vision=vision)
    frozen = count_params(Workload(arch, 256, images=1))
    trained = count_params(Workload(arch, 256, images=1, train_vision=True))
    assert frozen.vision_encoder == trained.vision_encoder > 0
    enc = frozen.vision_encoder
    z0_frozen, _ = _states(frozen, 1, 0)
    z0_trained, _ = _states(trained, 1, 0)
    assert z0_trained - z0_frozen == 20 * enc - 2 * enc
    # ZeRO-2 does not shard frozen weights (they are in no optimizer group); ZeRO-3 does
    # a text-only batch still holds the tower's weights and the projector's optimizer state
    text_only = count_params(Workload(arch, 256))
    assert (text_only.vision_encoder, text_only.projector, text_only.frozen) == (enc, frozen.projector, enc)
    assert not text_only.vision_active and text_only.forward_params == text_only.llm
    llm_only = count_params(Workload(Architecture(**{**arch.__dict__, "vision": None}), 256))
    z2_frozen, _ = _states(frozen, 4, 2)
    z2_none, _ = _states(llm_only, 4, 2)
    assert z2_frozen - z2_none == pytest.approx(2 * enc + 18 * frozen.projector / 4 + 2 * frozen.projector)
    z3_frozen, _ = _states(frozen, 4, 3)
    z3_none, _ = _states(llm_only, 4, 3)
    assert z3_frozen - z3_none == pytest.approx(2 * enc / 4 + 20 * frozen.projector / 4)


def test_partial_zero3_offload_keeps_the_gpu_sub_groups_whole_state_on_the_gpu():
    c = _counts("llama-2-70b")
    p = c.trainable
    per_rank = p / 8
    share = _deepspeed_cpu_share(int(np.ceil(per_rank / SUB_GROUP_SIZE)), 0.5)
    assert 0 < share < 1
    gpu, host = _states(c, 8, 3, opt=1, ratio=0.5)
    # bf16 parameters + fp32 master, m, v and fp32 gradients of the GPU sub-groups (persistent)
    assert gpu == pytest.approx(2 * per_rank + 16 * (1 - share) * per_rank)
    # host per node (8 ranks here): 16 bytes for the CPU share + the bf16 gradient buffer for all
    assert host == pytest.approx(8 * (16 * share * per_rank + 2 * per_rank))


def test_superoffload_adds_its_workers_gradient_buffer_on_the_host():
    c = _counts("llama-2-7b")
    p = c.trainable
    s = model_states(c, np.array([4, 4]), np.array([3, 3]), np.array([1, 1]), np.array([1.0, 1.0]),
                     np.array([0, 0]), np.array([1, 1]), np.array([False, True]))
    extra = float(s.host_bytes_per_rank[1] - s.host_bytes_per_rank[0])
    assert extra == 4 * min(p / 4, SUB_GROUP_SIZE)
    assert float(s.gpu_bytes[0]) == float(s.gpu_bytes[1])
