"""What is trained: an architecture, a context length, and (for multimodal models) the
images or video frames whose vision tokens take part of that context."""
from __future__ import annotations

from dataclasses import dataclass

from models.architecture import Architecture


LOSS_DTYPE_BYTES = {"fp32": 4, "bf16": 2}


class WorkloadError(ValueError):
    """A workload that cannot exist (vision tokens that overflow the context, ...)."""


@dataclass(frozen=True)
class Workload:
    """`seq_len` is the whole LLM context per sample, vision tokens included."""

    arch: Architecture
    seq_len: int
    images: int = 0  # images per sample
    frames: int = 0  # video frames per sample
    image_size: int | None = None  # pixels per side; the preset's when None
    train_vision: bool = False  # encoder trained, or frozen (the projector is always trained)
    # The dtype the cross-entropy runs in: Hugging Face's ForCausalLMLoss (and most training scripts)
    # cast the logits to fp32 first; "bf16" keeps them in the model's dtype.
    loss_dtype: str = "fp32"

    def __post_init__(self):
        if self.loss_dtype not in LOSS_DTYPE_BYTES:
            raise WorkloadError(f"loss dtype must be one of {', '.join(LOSS_DTYPE_BYTES)}, got {self.loss_dtype!r}")
        if self.seq_len < 1:
            raise WorkloadError(f"sequence length must be positive, got {self.seq_len}")
        if (self.images or self.frames) and self.arch.vision is None:
            raise WorkloadError(f"model '{self.arch.name}' has no vision encoder; --images/--frames need one")
        if self.images and self.frames:
            raise WorkloadError("give images or video frames per sample, not both")
        if self.vision_tokens >= self.seq_len:
            raise WorkloadError(
                f"{self.vision_tokens} vision tokens ({self.describe_vision()}) do not fit in a context of {self.seq_len} tokens"
            )

    @property
    def vision_groups(self) -> int:
        """Encoder inputs per sample: images, or frames folded by the temporal patch."""
        if self.arch.vision is None:
            return 0
        if self.frames:
            return -(-self.frames // self.arch.vision.temporal_patch)
        return self.images

    @property
    def vision_tokens(self) -> int:
        if not self.vision_groups:
            return 0
        return self.vision_groups * self.arch.vision.llm_tokens_per_image(self.image_size)

    @property
    def loss_bytes(self) -> int:
        """Bytes per logit in the loss."""
        return LOSS_DTYPE_BYTES[self.loss_dtype]

    def describe_vision(self) -> str:
        if self.frames:
            return f"{self.frames} frames"
        return f"{self.images} images" if self.images else "no vision input"
