"""Parameter counts a strategy's memory and communication depend on.

What is trained matters, not only how big the model is: a frozen vision encoder has
bf16 weights but no gradients and no optimizer state, and ZeRO-3 gathers it in the
forward pass only. ZeRO-3 also works module by module, so the largest module (often the
embedding or the LM head at a 150k vocabulary) sets the gathered-parameter buffer, and
the number of modules sets the fetch/release hook overhead.
"""
from __future__ import annotations

from dataclasses import dataclass

from models.architecture import Architecture, VisionEncoder
from models.workload import Workload

# One ViT block: q, k, v, out, fc1, fc2 (+ a gate projection when gated), two LayerNorms.
VIT_MODULES_PER_LAYER = 8
# Trainable parameter tensors of a ViT block as the harness builds it: six modules (two LayerNorms,
# fused QKV, out, fc1, fc2; a gated MLP doubles fc1's width, not its count), a weight and a bias each.
# The decoder's modules have a weight each and no bias: its tensors are its modules.
VIT_TENSORS_PER_LAYER = 12


def vit_layer_params(v: VisionEncoder) -> int:
    """One ViT block: attention 4*h^2, MLP 2*h*f (3 when gated), two LayerNorms (weight and bias).
    Linear biases are ignored (under 0.1% of the block)."""
    mlp = (3 if v.gated_mlp else 2) * v.hidden_size * v.intermediate_size
    return 4 * v.hidden_size**2 + mlp + 4 * v.hidden_size


def patch_embed_params(v: VisionEncoder) -> int:
    """The patch embedding convolution: 3 colour channels x patch^2 x temporal patch -> hidden."""
    return 3 * v.patch_size**2 * v.temporal_patch * v.hidden_size


def projector_params(v: VisionEncoder, text_hidden: int) -> int:
    """Two-layer MLP from the (spatially merged) vision features into the LLM's hidden size."""
    merged = v.hidden_size * v.spatial_merge**2
    return merged * v.projector_hidden_size + v.projector_hidden_size * text_hidden


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts of one workload's model, split by what is trained."""

    llm: int  # decoder blocks, embeddings, final norm
    vision_encoder: int  # ViT blocks + patch embedding; 0 without a vision tower
    projector: int
    train_vision: bool
    layer: int  # one decoder block
    vit_layer: int  # one ViT block (0 without a vision tower)
    largest_module: int  # ZeRO-3 gathers one module at a time; this one sets the buffer
    modules_llm: int  # modules with parameters in the LLM (ZeRO-3 fetch/release hooks)
    modules_per_llm_layer: int  # of them, in one decoder layer (what a recomputed layer hooks again)
    modules_vision: int  # modules with parameters in the encoder and projector (0 when it gets no input)
    vision_active: bool  # the workload feeds the vision tower images or frames
    trainable_tensors: int  # parameter tensors with gradients (a step outside ZeRO-3 visits each)
    decoder_tensors: tuple[int, ...]  # elements of each of the decoder's parameter tensors

    @property
    def trainable(self) -> int:
        """Parameters with gradients and optimizer state."""
        return self.llm + self.projector + (self.vision_encoder if self.train_vision else 0)

    @property
    def frozen(self) -> int:
        """Parameters stored in bf16 only (the frozen vision encoder)."""
        return 0 if self.train_vision else self.vision_encoder

    @property
    def total(self) -> int:
        return self.llm + self.vision_encoder + self.projector

    @property
    def forward_params(self) -> int:
        """Parameters a forward pass uses (ZeRO-3 gathers them): the tower only when it gets input."""
        return self.llm + (self.vision_encoder + self.projector if self.vision_active else 0)

    @property
    def backward_params(self) -> int:
        """Parameters a backward pass uses: no frozen encoder, no idle tower."""
        if not self.vision_active:
            return self.llm
        return self.llm + self.projector + (self.vision_encoder if self.train_vision else 0)


def decoder_tensors(arch: Architecture) -> tuple[int, ...]:
    """Elements of each decoder parameter tensor, in Hugging Face's layout: the embedding, each
    layer's (`Architecture.layer_tensors`), the final norm, an untied LM head."""
    h = arch.hidden_size
    head = () if arch.tie_embeddings else (arch.vocab_size * h,)
    return (arch.vocab_size * h,) + arch.layer_tensors * arch.num_layers + (h,) + head


def count_params(workload: Workload) -> ParamCounts:
    arch: Architecture = workload.arch
    h, v = arch.hidden_size, arch.vision
    llm_modules_per_layer = len(arch.layer_tensors)  # one weight a module, no biases
    llm_modules = arch.num_layers * llm_modules_per_layer + 2 + (0 if arch.tie_embeddings else 1)
    largest = max(arch.vocab_size * h, h * arch.intermediate_size, h * arch.attention_dim)
    enc = proj = vit_layer = vis_modules = 0
    tensors = llm_modules  # one weight each
    # A vision tower's weights (and the projector's optimizer state) exist whether or not this
    # workload feeds it; its hooks and gathers run only when it does.
    if v is not None:
        vit_layer = vit_layer_params(v)
        enc = v.num_layers * vit_layer + patch_embed_params(v)
        proj = projector_params(v, h)
        per_layer = VIT_MODULES_PER_LAYER + (1 if v.gated_mlp else 0)
        if workload.vision_groups:
            vis_modules = v.num_layers * per_layer + 2 + 2  # + patch embed, post-norm; projector's 2 linears
        tensors += 4  # the projector's two linears, trained whether or not the encoder is
        if workload.train_vision:
            tensors += v.num_layers * VIT_TENSORS_PER_LAYER + 5  # + patch embed (2), position embedding, post-norm (2)
        largest = max(
            largest,
            v.hidden_size * v.intermediate_size,
            v.hidden_size * v.spatial_merge**2 * v.projector_hidden_size,
            v.projector_hidden_size * h,
        )
    return ParamCounts(
        llm=arch.llm_params,
        vision_encoder=enc,
        projector=proj,
        train_vision=workload.train_vision,
        layer=arch.layer_params,
        vit_layer=vit_layer,
        largest_module=largest,
        modules_llm=llm_modules,
        modules_per_llm_layer=llm_modules_per_layer,
        modules_vision=vis_modules,
        vision_active=bool(v is not None and workload.vision_groups),
        trainable_tensors=tensors,
        decoder_tensors=decoder_tensors(arch),
    )
