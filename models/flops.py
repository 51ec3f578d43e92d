"""FLOPs and memory traffic of one micro-step on one GPU, by operation class.

Why by class: each runs at a different rate. Dense GEMMs run at the profile's GEMM curve
at their real size (FLOPs per call), the causal attention core at the fused-attention
curve for its sequence length, and norms, activations, residuals and the loss on the
logits are memory-bound (bytes over HBM bandwidth).

Counting conventions (they define what the profile's rates mean):
- A GEMM of M x K by K x N is 2*M*N*K FLOPs. Backward is two GEMMs of the same size
  (input gradient and weight gradient): 2x forward. A layer whose input needs no gradient
  (the first projector layer behind a frozen encoder, the patch embedding) does only the
  weight gradient: 1x. A frozen encoder does no backward at all.
- Causal attention forward per sequence and layer: QK^T and PV are 2*s^2*d FLOPs per head
  each, and the causal mask halves them: 2*s^2*h with h = heads*head_dim. Backward is
  counted as 2x forward (model FLOPs; FlashAttention's recomputation of the scores is
  part of its measured rate). So training attention costs 6*L*h*s FLOPs per token, the
  causal half of PaLM's 12*L*h*s (Chowdhery et al. 2022, appendix B).
  The ViT's attention is bidirectional: 4*p^2*h per image of p patches and layer.
- Training FLOPs per token without recomputation: 6*N + 6*L*h*s, where N counts the
  decoder's matmul parameters plus the LM head (h*vocab), not the embedding lookup.
- Recomputation (`checkpoint_every` k > 0) checkpoints layers 0, k, 2k, ...: ceil(L/k)
  layers run their forward again in backward. k = 1 repeats every layer's forward, which
  makes the decoder layers' dense FLOPs 4/3 of the plain 6N share; the LM head is not
  recomputed.
- Ulysses sequence parallelism (sp): GEMMs and elementwise work see micro_batch*seq/sp
  tokens per GPU; the attention core sees the full sequence with heads/sp.
- A vision sample's images (or temporal frame groups) are split across the sp group:
  each GPU encodes ceil(groups/sp) of them per sample.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from models.workload import Workload

if TYPE_CHECKING:
    from models.profile import LayerElementwise, VisionElementwise

BF16, FP32, FP64 = 2, 4, 8  # bytes per element


# Causal attention's backward counted as this many times its forward (model FLOPs: dQ, dK, dV;
# FlashAttention's recomputation of the scores is part of its measured rate, not of the count).
ATTENTION_BWD_PER_FWD = 2.0


def causal_attention_flops(batch, heads, seq_len, head_dim, backward: bool = False):
    """FLOPs of causal attention over full sequences, the unmasked half only: QK^T and PV are
    2*b*h*s^2*d each, halved for causal, so forward is 2*b*h*s^2*d; backward ATTENTION_BWD_PER_FWD
    times that. The one count the cost model and the calibration's attention rates share."""
    fwd = 2.0 * batch * heads * np.asarray(seq_len, dtype=float) ** 2 * head_dim
    return ATTENTION_BWD_PER_FWD * fwd if backward else fwd


def checkpointed_layers(num_layers: int, checkpoint_every) -> np.ndarray:
    """Layers whose forward runs again in backward: 0, L, or ceil(L/k) for every k-th layer."""
    k = np.asarray(checkpoint_every)
    return np.where(k > 0, -(-num_layers // np.maximum(k, 1)), 0)


@dataclass(frozen=True)
class GemmClass:
    """GEMMs of one shape on one GPU per micro-step. Arrays broadcast over strategies."""

    name: str
    flops_per_call: np.ndarray  # FLOPs of one call, the x of the profile's GEMM curve
    fwd_calls: float  # calls in one forward pass
    bwd_factor: float  # backward FLOPs / forward FLOPs: 2, 1 (weight gradient only) or 0
    recompute_calls: np.ndarray  # extra forward calls from activation checkpointing
    vision: bool  # part of the vision tower (its own phase)

    @property
    def fwd_flops(self) -> np.ndarray:
        return self.flops_per_call * self.fwd_calls

    @property
    def bwd_flops(self) -> np.ndarray:
        return self.flops_per_call * self.fwd_calls * self.bwd_factor

    @property
    def recompute_flops(self) -> np.ndarray:
        return self.flops_per_call * self.recompute_calls


@dataclass(frozen=True)
class MicroStepWork:
    """Work of one micro-step on one GPU (FLOPs and bytes), split the way time is computed."""

    tokens_per_gpu: np.ndarray  # LLM tokens one GPU's GEMMs see
    gemms: tuple[GemmClass, ...]
    attn_seq_len: int  # x of the attention curves (full sequence, also under Ulysses)
    attn_head_dim: int  # x of the attention rate's head-dim ratio
    attn_fwd_flops: np.ndarray
    attn_recompute_flops: np.ndarray
    elem_fwd_bytes: np.ndarray
    elem_bwd_bytes: np.ndarray
    elem_recompute_bytes: np.ndarray
    checkpointed_layers: np.ndarray
    # vision tower (zeros without one)
    vis_patches_per_group: int
    vis_head_dim: int
    vis_groups_per_gpu: np.ndarray
    vis_attn_fwd_flops: np.ndarray
    vis_attn_bwd_factor: float
    vis_attn_recompute_flops: np.ndarray
    vis_elem_fwd_bytes: np.ndarray
    vis_elem_bwd_bytes: np.ndarray
    vis_elem_recompute_bytes: np.ndarray
    vis_checkpointed_layers: np.ndarray

    @property
    def attn_bwd_flops(self) -> np.ndarray:
        return ATTENTION_BWD_PER_FWD * self.attn_fwd_flops

    @property
    def vis_attn_bwd_flops(self) -> np.ndarray:
        return self.vis_attn_bwd_factor * self.vis_attn_fwd_flops

    def total_flops(self) -> np.ndarray:
        """Every FLOP of the micro-step on this GPU, recomputation included."""
        gemm = sum(g.fwd_flops + g.bwd_flops + g.recompute_flops for g in self.gemms)
        attn = self.attn_fwd_flops + self.attn_bwd_flops + self.attn_recompute_flops
        vis = self.vis_attn_fwd_flops + self.vis_attn_bwd_flops + self.vis_attn_recompute_flops
        return gemm + attn + vis


def _llm_gemms(w: Workload, t: np.ndarray, n_ckpt: np.ndarray) -> list[GemmClass]:
    a = w.arch
    h, q, kv, f = a.hidden_size, a.attention_dim, a.kv_dim, a.intermediate_size
    per_layer = {  # name: (in, out) of one linear layer in a decoder block
        "q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
        "gate_proj": (h, f), "up_proj": (h, f), "down_proj": (f, h),
    }
    out = [
        GemmClass(name, 2.0 * t * k_in * k_out, a.num_layers, 2.0, n_ckpt, False)
        for name, (k_in, k_out) in per_layer.items()
    ]
    out.append(GemmClass("lm_head", 2.0 * t * h * a.vocab_size, 1, 2.0, np.zeros_like(n_ckpt), False))
    return out


def counted_layer_bytes_per_token(a) -> float:
    """A decoder layer's elementwise forward bytes per token as counted from its ops (bf16, fused)."""
    h, q, kv, f = a.hidden_size, a.attention_dim, a.kv_dim, a.intermediate_size
    return float(BF16 * (2 * 2 * h + 2 * (q + kv) + 3 * f + 2 * 3 * h))


def counted_vit_block_bytes_per_token(hidden, ffn, gated_mlp=False) -> float:
    """A ViT block's elementwise forward bytes per patch token as counted from its ops (bf16, fused):
    two LayerNorms (4h each), GELU (read and write f) or SwiGLU (read 2f, write f), two residual
    adds (6h each)."""
    act = 6 * ffn if gated_mlp else 4 * ffn
    return float(8 * hidden + act + 12 * hidden)


def layer_elementwise_bytes_per_token(a, measured: "LayerElementwise | None" = None) -> float:
    """A decoder layer's elementwise forward bytes per token.

    Where the profile measured its layer's kernels (`measured`): a third of their effective bytes
    (backward is counted as twice forward). Otherwise the bytes counted from the ops: two RMSNorms
    (read h, write h), RoPE on q and k (read and write q + kv), SwiGLU (read gate and up, write f),
    two residual adds (read 2h, write h); unfused fp32 kernels take several times that. The q/k and
    sandwich norms: their measured bytes where `measured` separated them, else counted."""
    h, q, kv, f = a.hidden_size, a.attention_dim, a.kv_dim, a.intermediate_size
    # the norms' counted bytes (read and write): a lower bound of their unfused kernels
    counted_qk_norms, counted_sandwich_norms = BF16 * 2 * a.qk_norm_dim, BF16 * 2 * a.sandwich_norm_dim
    if measured is None:
        return float(counted_layer_bytes_per_token(a) + counted_qk_norms + counted_sandwich_norms)
    layer = measured.bytes_per_token(h, q, kv, f, a.qk_norm_dim, a.sandwich_norm_dim) / 3.0
    layer += counted_qk_norms if measured.per_qk_norm is None else 0.0
    layer += counted_sandwich_norms if measured.per_sandwich_norm is None else 0.0
    return float(layer)


def _llm_elementwise_bytes_per_token(w: Workload, measured: "LayerElementwise | None" = None) -> tuple[float, float]:
    """(per decoder layer, outside the layers) forward bytes per token.

    Per layer: `layer_elementwise_bytes_per_token`. Outside: embedding lookup and final norm (4h
    each) and the loss on the logits (`loss_bytes_per_vocab`). Backward moves about twice the
    forward's bytes (saved input + incoming gradient in, gradient out).
    """
    a = w.arch
    outside_fwd = BF16 * 2 * 2 * a.hidden_size + loss_bytes_per_vocab(w)[0] * a.vocab_size
    return layer_elementwise_bytes_per_token(a, measured), float(outside_fwd)


def loss_bytes_per_vocab(w: Workload) -> tuple[float, float]:
    """(forward, backward) memory traffic of the cross-entropy per token and vocabulary entry.

    In fp32 (logits cast first): forward casts bf16 -> fp32 (2 + 4) and runs the log-softmax (read
    and write 4) = 14; backward writes the gradient (4), runs the log-softmax backward (read 8,
    write 4) and casts back to bf16 (read 4, write 2) = 22. In bf16 there is no cast: forward 2 + 2
    = 4, backward 2 + (4 + 2) = 8."""
    d = float(w.loss_bytes)
    if w.loss_dtype == "bf16":
        return 2 * d, 4 * d
    return BF16 + d + 2 * d, d + 3 * d + d + BF16



def micro_step_work(w: Workload, micro_batch, sp, checkpoint_every,
                    layer_elementwise: "LayerElementwise | None" = None,
                    vision_elementwise: "VisionElementwise | None" = None) -> MicroStepWork:
    """FLOPs and bytes of one micro-step on one GPU; arguments may be arrays (one per strategy).
    `layer_elementwise`, `vision_elementwise`: the profile's measured elementwise bytes of a decoder
    layer and of a ViT block, else the counted ones."""
    a = w.arch
    mb = np.asarray(micro_batch, dtype=float)
    sp_ = np.asarray(sp, dtype=float)
    ck = np.asarray(checkpoint_every)
    mb, sp_, ck = np.broadcast_arrays(mb, sp_, ck)
    t = mb * w.seq_len / sp_
    n_ckpt = checkpointed_layers(a.num_layers, ck).astype(float)

    gemms = _llm_gemms(w, t, n_ckpt)
    # Under Ulysses each GPU attends the full sequence with heads / sp of the heads.
    attn_fwd = mb * a.num_layers * causal_attention_flops(1, a.num_heads, w.seq_len, a.head_dim) / sp_
    attn_rec = mb * n_ckpt * causal_attention_flops(1, a.num_heads, w.seq_len, a.head_dim) / sp_

    layer_b, outside_b = _llm_elementwise_bytes_per_token(w, layer_elementwise)
    elem_fwd = t * (a.num_layers * layer_b + outside_b)
    v_ = a.vocab_size
    loss_fwd, loss_bwd = loss_bytes_per_vocab(w)
    elem_bwd = t * (2.0 * (a.num_layers * layer_b + outside_b - loss_fwd * v_) + loss_bwd * v_)
    elem_rec = t * n_ckpt * layer_b

    zeros = np.zeros_like(t)
    vis = dict(
        vis_patches_per_group=0, vis_head_dim=0, vis_groups_per_gpu=zeros, vis_attn_fwd_flops=zeros, vis_attn_bwd_factor=0.0,
        vis_attn_recompute_flops=zeros, vis_elem_fwd_bytes=zeros, vis_elem_bwd_bytes=zeros,
        vis_elem_recompute_bytes=zeros, vis_checkpointed_layers=zeros,
    )
    if a.vision is not None and w.vision_groups:
        vgemms, vis = _vision_work(w, mb, sp_, ck, vision_elementwise)
        gemms += vgemms
    return MicroStepWork(
        tokens_per_gpu=t, gemms=tuple(gemms), attn_seq_len=w.seq_len, attn_head_dim=a.head_dim, attn_fwd_flops=attn_fwd,
        attn_recompute_flops=attn_rec, elem_fwd_bytes=elem_fwd, elem_bwd_bytes=elem_bwd,
        elem_recompute_bytes=elem_rec, checkpointed_layers=n_ckpt, **vis,
    )


def _vision_work(w: Workload, mb, sp_, ck, measured: "VisionElementwise | None" = None) -> tuple[list[GemmClass], dict]:
    """The ViT and projector of one micro-step on one GPU.

    Frozen encoder: forward only (no weight gradients, and no input gradients because
    nothing before it is trained); the first projector layer then needs only its weight
    gradient. Checkpointing applies to a trained encoder's blocks with the LLM's policy;
    a frozen encoder runs without autograd and has nothing to recompute.
    """
    v, h = w.arch.vision, w.arch.hidden_size
    p = v.patches_per_image(w.image_size)
    groups = mb * np.ceil(w.vision_groups / sp_)  # images or frame groups this GPU encodes
    tv = groups * p  # patch tokens
    tm = tv / v.spatial_merge**2  # tokens after the spatial merge (into the LLM)
    trained = w.train_vision
    n_ckpt = checkpointed_layers(v.num_layers, ck).astype(float) if trained else np.zeros_like(tv)
    enc_bwd = 2.0 if trained else 0.0
    hv, fv = v.hidden_size, v.intermediate_size
    layer = {"vit_qkvo": (hv, hv, 4), "vit_fc_in": (hv, fv, 2 if v.gated_mlp else 1), "vit_fc_out": (fv, hv, 1)}
    gemms = [
        GemmClass(name, 2.0 * tv * k_in * k_out, v.num_layers * n, enc_bwd, n_ckpt * n, True)
        for name, (k_in, k_out, n) in layer.items()
    ]
    zeros = np.zeros_like(tv)
    patch_in = 3 * v.patch_size**2 * v.temporal_patch
    gemms.append(GemmClass("vit_patch_embed", 2.0 * tv * patch_in * hv, 1, 1.0 if trained else 0.0, zeros, True))
    merged = hv * v.spatial_merge**2
    gemms.append(GemmClass("projector_fc1", 2.0 * tm * merged * v.projector_hidden_size, 1,
                           2.0 if trained else 1.0, zeros, True))
    gemms.append(GemmClass("projector_fc2", 2.0 * tm * v.projector_hidden_size * h, 1, 2.0, zeros, True))

    attn_fwd = groups * v.num_layers * 4.0 * p**2 * hv
    attn_rec = groups * n_ckpt * 4.0 * p**2 * hv
    # Per patch token and block, where the profile measured a ViT block's kernels (`measured`): a third
    # of their effective bytes (backward is counted as twice forward); otherwise the counted bytes.
    # The projector's GELU (4 * its hidden) is counted either way.
    layer_b = (measured.bytes_per_token(hv, fv) / 3.0 if measured is not None
               else counted_vit_block_bytes_per_token(hv, fv, v.gated_mlp))
    elem_fwd = tv * v.num_layers * layer_b + tm * 4.0 * v.projector_hidden_size
    elem_bwd = (2.0 * tv * v.num_layers * layer_b if trained else zeros) + 2.0 * tm * 4.0 * v.projector_hidden_size
    vis = dict(
        vis_patches_per_group=p, vis_head_dim=v.head_dim, vis_groups_per_gpu=groups, vis_attn_fwd_flops=attn_fwd,
        vis_attn_bwd_factor=enc_bwd, vis_attn_recompute_flops=attn_rec, vis_elem_fwd_bytes=elem_fwd,
        vis_elem_bwd_bytes=elem_bwd, vis_elem_recompute_bytes=tv * n_ckpt * layer_b,
        vis_checkpointed_layers=n_ckpt,
    )
    return gemms, vis


def matmul_params(w: Workload) -> int:
    """N of the 6N rule: the decoder's matmul weights plus the LM head (no embedding lookup, no norms)."""
    a = w.arch
    h = a.hidden_size
    per_layer = 2 * h * a.attention_dim + 2 * h * a.kv_dim + 3 * h * a.intermediate_size
    return a.num_layers * per_layer + h * a.vocab_size
