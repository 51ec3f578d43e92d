"""The validation model: a LLaMA-style decoder, optionally fed by a ViT encoder and an MLP projector.

Built from `models.architecture.Architecture`, so the harness trains exactly the shapes the cost
model counts: RMSNorm, RoPE, GQA attention through torch SDPA (causal; q and k normalised per head
where the config says so), SwiGLU (outputs normalised again in Gemma 3's sandwich), untied logits
(tied when the preset ties them). The vision path is patch embedding (temporal patches folded in),
bidirectional SDPA blocks, spatial merge and a two-layer MLP projector whose outputs replace the
LLM input embeddings at the vision-token positions.

Two hooks make it a DeepSpeed model without DeepSpeed imports here: `checkpoint_fn` wraps each
checkpointed block (pass `deepspeed.checkpointing.checkpoint`), and `attention_wrapper` wraps the
core attention (pass a factory building `deepspeed.sequence.layer.DistributedAttention`).
Under Ulysses each rank holds `seq / sp` positions; `position_offset` says where its shard starts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from models.architecture import Architecture, VisionEncoder


@dataclass(frozen=True)
class Checkpointing:
    """Which blocks recompute their activations: every `every`-th block (0: none, 1: all)."""

    every: int = 0
    fn: Callable | None = None  # deepspeed.checkpointing.checkpoint, or torch's

    def wraps(self, index: int) -> bool:
        return self.every > 0 and self.fn is not None and index % self.every == 0


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(variance + self.eps)).type_as(x) * self.weight


class Embedding(nn.Embedding):
    """Token embedding initialised N(0, 0.02) as LLaMA/GPT-2 do (torch's N(0, 1) would make
    tied logits, and the loss, huge). Done in reset_parameters, which runs inside __init__,
    so it also holds under deepspeed.zero.Init, which partitions right after."""

    def reset_parameters(self):
        nn.init.normal_(self.weight, std=0.02)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float = 10000.0):
    """cos/sin of shape [seq, head_dim/2] for absolute `positions` (RoFormer, Su et al. 2021)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim))
    angles = positions.float()[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [batch, seq, heads, head_dim]; rotates the two halves of each head."""
    x1, x2 = x.float().chunk(2, dim=-1)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).type_as(x)


class CoreAttention(nn.Module):
    """softmax(QK^T/sqrt(d))V on [batch, seq, heads, head_dim]; GQA by repeating KV heads."""

    def __init__(self, causal: bool):
        super().__init__()
        self.causal = causal

    def forward(self, q, k, v):
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [b, heads, s, d]
        if k.shape[1] != q.shape[1]:
            repeat = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return y.transpose(1, 2)  # [b, s, heads, d]


class DecoderAttention(nn.Module):
    def __init__(self, arch: Architecture, attention_wrapper: Callable | None):
        super().__init__()
        h, self.n_heads, self.n_kv, self.head_dim = arch.hidden_size, arch.num_heads, arch.num_kv_heads, arch.head_dim
        self.q_proj = nn.Linear(h, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, h, bias=False)
        # Qwen3's and Gemma 3's norm over each head of q and k, before RoPE
        self.q_norm, self.k_norm = (RMSNorm(self.head_dim), RMSNorm(self.head_dim)) if arch.qk_norm else (None, None)
        core = CoreAttention(causal=True)
        self.core = attention_wrapper(core) if attention_wrapper else core

    def forward(self, x, cos, sin):
        b, s, _ = x.shape  # s is this rank's shard under Ulysses
        q = self.q_proj(x).view(b, s, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(b, s, self.n_kv, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        v = self.v_proj(x).view(b, s, self.n_kv, self.head_dim)
        if isinstance(self.core, CoreAttention):
            y = self.core(q, k, v)
        else:  # DistributedAttention: all-to-all to [b, s, heads/sp, d], attend, and back
            y = self.core(q, k, v, 0)
        return self.o_proj(y.reshape(b, s, self.n_heads * self.head_dim))


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderBlock(nn.Module):
    def __init__(self, arch: Architecture, attention_wrapper: Callable | None):
        super().__init__()
        self.input_norm = RMSNorm(arch.hidden_size)
        self.attn = DecoderAttention(arch, attention_wrapper)
        self.post_attn_norm = RMSNorm(arch.hidden_size)
        self.mlp = SwiGLU(arch.hidden_size, arch.intermediate_size)
        # Gemma 3's sandwich: the attention's and the MLP's outputs normalised again before each residual add
        self.attn_out_norm, self.mlp_out_norm = ((RMSNorm(arch.hidden_size), RMSNorm(arch.hidden_size))
                                                 if arch.sandwich_norms else (nn.Identity(), nn.Identity()))

    def forward(self, x, cos, sin):
        x = x + self.attn_out_norm(self.attn(self.input_norm(x), cos, sin))
        return x + self.mlp_out_norm(self.mlp(self.post_attn_norm(x)))


class VisionBlock(nn.Module):
    """Pre-norm ViT block: bidirectional multi-head attention and a GELU (or gated) MLP."""

    def __init__(self, v: VisionEncoder):
        super().__init__()
        self.n_heads, self.head_dim = v.num_heads, v.head_dim
        self.norm1 = nn.LayerNorm(v.hidden_size)
        self.qkv = nn.Linear(v.hidden_size, 3 * v.hidden_size)
        self.proj = nn.Linear(v.hidden_size, v.hidden_size)
        self.norm2 = nn.LayerNorm(v.hidden_size)
        self.gated = v.gated_mlp
        self.fc1 = nn.Linear(v.hidden_size, (2 if v.gated_mlp else 1) * v.intermediate_size)
        self.fc2 = nn.Linear(v.intermediate_size, v.hidden_size)
        self.core = CoreAttention(causal=False)

    def forward(self, x):
        n, t, c = x.shape  # [images, patches, vision hidden]
        q, k, v = self.qkv(self.norm1(x)).view(n, t, 3, self.n_heads, self.head_dim).unbind(2)
        x = x + self.proj(self.core(q, k, v).reshape(n, t, c))
        hidden = self.fc1(self.norm2(x))
        if self.gated:
            gate, up = hidden.chunk(2, dim=-1)
            hidden = F.silu(gate) * up
        else:
            hidden = F.gelu(hidden)
        return x + self.fc2(hidden)


class VisionTower(nn.Module):
    """Pixels [groups, temporal_patch, 3, H, W] -> LLM embeddings [groups, tokens_per_group, hidden]."""

    def __init__(self, v: VisionEncoder, llm_hidden: int, image_size: int, checkpointing: Checkpointing):
        super().__init__()
        self.v, self.image_size, self.checkpointing = v, image_size, checkpointing
        patch_dim = 3 * v.temporal_patch * v.patch_size**2
        self.patch_embed = nn.Linear(patch_dim, v.hidden_size)
        self.pos_embed = nn.Parameter(torch.zeros(v.patches_per_image(image_size), v.hidden_size))
        self.blocks = nn.ModuleList(VisionBlock(v) for _ in range(v.num_layers))
        self.norm = nn.LayerNorm(v.hidden_size)
        merged = v.hidden_size * v.spatial_merge**2
        self.projector = nn.Sequential(
            nn.Linear(merged, v.projector_hidden_size), nn.GELU(), nn.Linear(v.projector_hidden_size, llm_hidden)
        )

    def encoder_parameters(self):
        """Everything but the projector: what `freeze` turns off."""
        return [p for name, p in self.named_parameters() if not name.startswith("projector.")]

    def patchify(self, pixels: torch.Tensor) -> torch.Tensor:
        g, tp, c, hgt, wid = pixels.shape  # [groups, temporal_patch, 3, H, W]
        p, side = self.v.patch_size, self.image_size // self.v.patch_size
        x = pixels[..., : side * p, : side * p].reshape(g, tp, c, side, p, side, p)
        return x.permute(0, 3, 5, 1, 2, 4, 6).reshape(g, side * side, tp * c * p * p)  # [g, patches, patch_dim]

    def merge(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate each m x m neighbourhood of patch tokens (Qwen2-VL's spatial merge)."""
        m = self.v.spatial_merge
        if m == 1:
            return x
        g, t, c = x.shape
        side = int(math.isqrt(t))
        x = x.view(g, side // m, m, side // m, m, c).permute(0, 1, 3, 2, 4, 5)
        return x.reshape(g, (side // m) ** 2, m * m * c)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        encoder_trained = self.patch_embed.weight.requires_grad
        with torch.set_grad_enabled(encoder_trained and torch.is_grad_enabled()):
            x = self.patch_embed(self.patchify(pixels)) + self.pos_embed  # [g, patches, vision hidden]
            for i, block in enumerate(self.blocks):
                if encoder_trained and self.checkpointing.wraps(i):
                    x = self.checkpointing.fn(block, x)
                else:
                    x = block(x)
            x = self.norm(x)
        return self.projector(self.merge(x))  # [g, llm tokens per group, llm hidden]


class Transformer(nn.Module):
    """Decoder (plus optional vision tower). `forward` returns the mean next-token loss of this shard."""

    def __init__(
        self,
        arch: Architecture,
        image_size: int | None = None,
        checkpointing: Checkpointing = Checkpointing(),
        attention_wrapper: Callable | None = None,
        loss_dtype: str = "fp32",
    ):
        super().__init__()
        self.arch, self.checkpointing = arch, checkpointing
        self.loss_dtype = loss_dtype  # "fp32": the logits are cast before the cross-entropy, as Hugging Face does
        self.embed_tokens = Embedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList(DecoderBlock(arch, attention_wrapper) for _ in range(arch.num_layers))
        self.norm = RMSNorm(arch.hidden_size)
        self.lm_head = nn.Linear(arch.hidden_size, arch.vocab_size, bias=False)
        if arch.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.vision = None
        if arch.vision is not None:
            side = image_size or arch.vision.image_size
            self.vision = VisionTower(arch.vision, arch.hidden_size, side, checkpointing)

    def freeze_vision_encoder(self) -> None:
        assert self.vision is not None, "no vision encoder to freeze"
        for p in self.vision.encoder_parameters():
            p.requires_grad_(False)

    def forward(self, tokens, targets, position_offset: int = 0, pixels=None, vision_keep=None, vision_positions=None):
        """tokens, targets: [batch, shard]. Multimodal: `pixels` [groups, tp, 3, H, W] are the
        groups whose tokens touch this shard; of their flattened encoder outputs, rows
        `vision_keep` replace the flattened [batch * shard] embeddings at `vision_positions`."""
        b, s = tokens.shape
        x = self.embed_tokens(tokens)  # [b, s, hidden]
        if pixels is not None and pixels.numel():
            vision_embeds = self.vision(pixels).reshape(-1, self.arch.hidden_size)  # [groups * tokens, hidden]
            vision_embeds = vision_embeds.index_select(0, vision_keep).to(x.dtype)
            x = x.reshape(b * s, -1).index_copy(0, vision_positions, vision_embeds).view(b, s, -1)
        positions = torch.arange(position_offset, position_offset + s, device=tokens.device)
        cos, sin = rope_tables(positions, self.arch.head_dim)
        for i, layer in enumerate(self.layers):
            if self.checkpointing.wraps(i):
                # The RoPE tables go in by closure, not as arguments: DeepSpeed's cpu_checkpointing empties
                # every floating tensor argument once the block's forward is done, and every layer shares them.
                x = self.checkpointing.fn(partial(layer, cos=cos, sin=sin), x)
            else:
                x = layer(x, cos, sin)
        logits = self.lm_head(self.norm(x))  # [b, s, vocab]
        if self.loss_dtype == "fp32":
            logits = logits.float()
        return F.cross_entropy(logits.view(b * s, -1), targets.reshape(-1))
