"""Random training data for one rank: token ids, and for multimodal runs pixels placed in the context.

The content is random because only shapes cost time and energy. One batch is made once and
reused every step, so no data loading enters the measured window. Under Ulysses the ranks of a
sequence-parallel group share one sample (seeded by their data-parallel index) and each keeps its
`seq / sp` slice (pixels included). Vision groups (images, or frames folded by the temporal patch) are spread evenly
along the context, so each sequence-parallel rank encodes about `groups / sp` of them: the ranks
whose shard a group touches encode it (a group straddling two shards is encoded by both).
The pixels of all the sample's groups are drawn on every rank (host memory, once) so that
ranks of a group agree; each rank moves only its own groups to the device.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from models.workload import Workload


@dataclass(frozen=True)
class Batch:
    tokens: torch.Tensor  # [micro_batch, shard] int64
    targets: torch.Tensor  # [micro_batch, shard] int64
    position_offset: int  # first absolute position of this shard
    pixels: torch.Tensor | None = None  # [groups here, temporal_patch, 3, H, W]
    vision_keep: torch.Tensor | None = None  # rows of the flattened encoder output used here
    vision_positions: torch.Tensor | None = None  # where they go in the flattened [micro_batch * shard]

    def as_kwargs(self) -> dict:
        return {
            "tokens": self.tokens,
            "targets": self.targets,
            "position_offset": self.position_offset,
            "pixels": self.pixels,
            "vision_keep": self.vision_keep,
            "vision_positions": self.vision_positions,
        }

    @property
    def vision_groups(self) -> int:
        return 0 if self.pixels is None else int(self.pixels.shape[0])


def vision_group_starts(workload: Workload) -> list[int]:
    """First context position of each vision group of one sample, spread evenly."""
    groups = workload.vision_groups
    if not groups:
        return []
    stride = workload.seq_len // groups
    per_group = workload.vision_tokens // groups
    assert stride >= per_group, "Workload guarantees vision tokens fit in the context"
    return [g * stride for g in range(groups)]


def make_batch(
    workload: Workload,
    micro_batch: int,
    sp: int,
    sp_rank: int,
    dp_rank: int,
    device: torch.device,
    dtype: torch.dtype,
) -> Batch:
    """This rank's micro-batch. `seq_len` must divide by `sp` (Ulysses splits it evenly)."""
    seq = workload.seq_len
    if seq % sp:
        raise ValueError(f"sequence length {seq} must divide by the sequence-parallel degree {sp}")
    shard = seq // sp
    lo, hi = sp_rank * shard, (sp_rank + 1) * shard
    gen = torch.Generator().manual_seed(1234 + dp_rank)
    sample = torch.randint(0, workload.arch.vocab_size, (micro_batch, seq + 1), generator=gen)
    tokens = sample[:, lo:hi].to(device)
    targets = sample[:, lo + 1 : hi + 1].to(device)
    if not workload.vision_groups:
        return Batch(tokens, targets, lo)

    vision = workload.arch.vision
    per_group = vision.llm_tokens_per_image(workload.image_size)
    starts = vision_group_starts(workload)
    keep, positions, groups_here = [], [], []
    for b in range(micro_batch):
        for g, start in enumerate(starts):
            first, last = max(start, lo), min(start + per_group, hi)
            if first >= last:
                continue
            base = len(groups_here) * per_group  # this group's rows in the flattened encoder output
            keep.extend(base + (p - start) for p in range(first, last))
            positions.extend(b * shard + (p - lo) for p in range(first, last))
            groups_here.append(b * len(starts) + g)
    side = workload.image_size or vision.image_size
    # Every group of the sample, so that ranks sharing a sample see the same pixels.
    pixels = torch.randn(micro_batch * len(starts), vision.temporal_patch, 3, side, side, generator=gen)
    pixels = pixels[torch.tensor(groups_here, dtype=torch.long)].to(device, dtype)
    as_index = lambda xs: torch.tensor(xs, dtype=torch.long, device=device)  # noqa: E731
    return Batch(tokens, targets, lo, pixels, as_index(keep), as_index(positions))
