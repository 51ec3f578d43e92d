"""FLOP counts against the published formulas and a hand count."""
from __future__ import annotations

import numpy as np
import pytest

from models.architecture import Architecture, VisionEncoder, load_architecture
from models.flops import checkpointed_layers, matmul_params, micro_step_work
from models.params import count_params
from models.workload import Workload


def _layer_dense(w: Workload, work, part: str) -> np.ndarray:
    return sum(getattr(g, f"{part}_flops") for g in work.gemms if not g.vision and g.name != "lm_head")


def test_llama2_7b_parameter_count_matches_the_published_one():
    # Hugging Face reports 6,738,415,616 parameters for meta-llama/Llama-2-7b-hf.
    w = Workload(load_architecture("llama-2-7b"), 4096)
    assert count_params(w).llm == 6_738_415_616


@pytest.mark.parametrize("model, seq", [("llama-2-7b", 4096), ("qwen2.5-7b", 32768), ("llama-3-8b", 8192)])
def test_training_flops_per_token_are_6n_plus_causal_attention(model, seq):
    """6N (N = decoder matmul weights + LM head) plus 6*L*h*s: the causal half of PaLM's 12*L*h*s."""
    a = load_architecture(model)
    w = Workload(a, seq)
    h = a.hidden_size
    n = a.num_layers * (2 * h * h + 2 * h * a.kv_dim + 3 * h * a.intermediate_size) + h * a.vocab_size
    assert matmul_params(w) == n
    work = micro_step_work(w, micro_batch=1, sp=1, checkpoint_every=0)
    per_token = float(work.total_flops()) / seq
    expected = 6 * n + 6 * a.num_layers * h * seq
    assert per_token == pytest.approx(expected, rel=1e-12)


def test_full_recomputation_adds_one_forward_of_every_layer():
    a = load_architecture("llama-2-7b")
    w = Workload(a, 4096)
    plain = micro_step_work(w, 1, 1, 0)
    full = micro_step_work(w, 1, 1, 1)
    dense_plain = _layer_dense(w, plain, "fwd") + _layer_dense(w, plain, "bwd")
    dense_full = dense_plain + _layer_dense(w, full, "recompute")
    assert float(dense_full / dense_plain) == pytest.approx(4 / 3, rel=1e-12)
    # the LM head is outside the checkpointed layers: not recomputed
    head = next(g for g in full.gemms if g.name == "lm_head")
    assert float(head.recompute_flops) == 0.0
    # the attention core is recomputed too: 2 + 4 (fwd + bwd) -> + 2
    attn_plain = plain.attn_fwd_flops + plain.attn_bwd_flops
    assert float((attn_plain + full.attn_recompute_flops) / attn_plain) == pytest.approx(4 / 3, rel=1e-12)


@pytest.mark.parametrize("k, layers", [(0, 0), (1, 32), (2, 16), (3, 11), (4, 8), (32, 1)])
def test_every_kth_layer_checkpointing_recomputes_ceil_l_over_k_layers(k, layers):
    assert int(checkpointed_layers(32, k)) == layers
    w = Workload(load_architecture("llama-2-7b"), 2048)
    work = micro_step_work(w, 1, 1, k)
    plain = micro_step_work(w, 1, 1, 0)
    per_layer_fwd = _layer_dense(w, plain, "fwd") / 32
    assert float(_layer_dense(w, work, "recompute")) == pytest.approx(float(per_layer_fwd * layers), rel=1e-12)


def test_ulysses_splits_tokens_for_gemms_and_heads_for_attention():
    a = load_architecture("qwen2.5-7b")
    w = Workload(a, 32768)
    sp = np.array([1, 2, 4])
    work = micro_step_work(w, micro_batch=2, sp=sp, checkpoint_every=0)
    np.testing.assert_allclose(work.tokens_per_gpu, 2 * 32768 / sp)
    q = next(g for g in work.gemms if g.name == "q_proj")
    np.testing.assert_allclose(q.flops_per_call, 2 * (2 * 32768 / sp) * a.hidden_size**2)
    # Per GPU the attention core is the full sequence over heads/sp: the group total is unchanged.
    np.testing.assert_allclose(work.attn_fwd_flops * sp, work.attn_fwd_flops[0])
    assert work.attn_seq_len == 32768
    np.testing.assert_allclose(work.total_flops() * sp, work.total_flops()[0], rtol=1e-12)


def _tiny_vlm(gated: bool = False) -> Architecture:
    vision = VisionEncoder(hidden_size=8, num_layers=2, num_heads=2, intermediate_size=16, patch_size=2,
                           image_size=4, projector_hidden_size=12, gated_mlp=gated)
    return Architecture(name="tiny-vlm", hidden_size=8, num_layers=1, num_heads=2, num_kv_heads=2,
                        intermediate_size=16, vocab_size=10, vision=vision)


def _vision_flops(work) -> tuple[float, float]:
    fwd = sum(float(g.fwd_flops) for g in work.gemms if g.vision) + float(work.vis_attn_fwd_flops)
    bwd = sum(float(g.bwd_flops) for g in work.gemms if g.vision) + float(work.vis_attn_bwd_flops)
    return fwd, bwd


def test_tiny_vit_hand_count():
    """One 4x4 image in 2x2 patches: 4 patch tokens of width 8, two blocks, a 12-wide projector.

    Forward, by hand (2*M*N*K per GEMM):
      patch embedding  2*4*(3*2*2)*8            =   768
      per block: q,k,v,o 4*(2*4*8*8) = 2048, fc1 2*4*8*16 = 1024, fc2 1024   -> x2 blocks = 8192
      attention (bidirectional) 4*p^2*h = 4*16*8 = 512 per block  -> x2        = 1024
      projector 2*4*8*12 + 2*4*12*8                                             = 1536
      total                                                                     = 11520
    Frozen encoder: backward only through the projector: fc1 weight grad (768) + fc2 both (1536) = 2304.
    Trained encoder: patch embedding weight grad 768 + 2*(8192 + 1024) + 2*1536 = 22272.
    """
    arch = _tiny_vlm()
    frozen = micro_step_work(Workload(arch, 16, images=1), 1, 1, 0)
    assert _vision_flops(frozen) == (11520.0, 2304.0)
    trained = micro_step_work(Workload(arch, 16, images=1, train_vision=True), 1, 1, 0)
    assert _vision_flops(trained) == (11520.0, 22272.0)
    # recomputing a trained encoder repeats both blocks' forward (GEMMs + attention), not the patch
    # embedding or projector; a frozen encoder runs without autograd and recomputes nothing
    rec = micro_step_work(Workload(arch, 16, images=1, train_vision=True), 1, 1, 1)
    vis_rec = sum(float(g.recompute_flops) for g in rec.gemms if g.vision) + float(rec.vis_attn_recompute_flops)
    assert vis_rec == 8192.0 + 1024.0
    frozen_rec = micro_step_work(Workload(arch, 16, images=1), 1, 1, 1)
    assert sum(float(g.recompute_flops) for g in frozen_rec.gemms if g.vision) == 0.0


def test_vision_groups_are_split_across_the_sp_group():
    arch = _tiny_vlm()
    w = Workload(arch, 64, images=3)
    work = micro_step_work(w, micro_batch=2, sp=np.array([1, 2, 4]), checkpoint_every=0)
    np.testing.assert_array_equal(work.vis_groups_per_gpu, [6, 4, 2])  # 2 samples x ceil(3/sp)


def test_video_frames_fold_by_the_temporal_patch():
    a = load_architecture("qwen2.5-vl-7b")
    w = Workload(a, 32768, frames=16)
    assert w.vision_groups == 8
    work = micro_step_work(w, 1, 1, 0)
    patch = next(g for g in work.gemms if g.name == "vit_patch_embed")
    p = (448 // 14) ** 2
    assert float(patch.flops_per_call) == 2.0 * 8 * p * (3 * 14 * 14 * 2) * 1152


def test_elementwise_bytes_scale_with_tokens_and_include_the_loss():
    a = load_architecture("qwen2.5-7b")
    w = Workload(a, 8192)
    work = micro_step_work(w, np.array([1, 2]), 1, 0)
    np.testing.assert_allclose(work.elem_fwd_bytes[1], 2 * work.elem_fwd_bytes[0])
    # the fp32 loss on a 152k vocabulary moves 14 bytes per vocabulary entry per token forward
    assert float(work.elem_fwd_bytes[0]) > 8192 * 14 * a.vocab_size


def test_causal_attention_flops_count_half_the_scores_and_backward_twice():
    from models.flops import causal_attention_flops

    full_fwd = 4 * 2 * 8 * 4096**2 * 128  # QK^T and PV, 2*b*h*s^2*d each
    assert causal_attention_flops(2, 8, 4096, 128, backward=False) == pytest.approx(full_fwd / 2)
    assert causal_attention_flops(2, 8, 4096, 128, backward=True) == pytest.approx(2.0 * full_fwd / 2)

