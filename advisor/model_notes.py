"""Notes on what the profile never measured for this model's shapes, so that a user reads a
prediction made by extrapolation as one.

The attention rate depends on the head dim (SDPA's kernels tile by it); a profile measures it at a
few head dims and takes a head dim beyond them at the nearest one's rate (`models.profile.Curve`
clamps). The shipped h200 measured 64-256 (machine CB, 2026-12-05); before it, Gemma's heads of 256 were
timed at 128's rate.
"""
from __future__ import annotations

from models.architecture import Architecture
from models.profile import HardwareProfile


def head_dim_notes(arch: Architecture, profile: HardwareProfile) -> list[str]:
    """A note for each attention (the decoder's, a vision tower's) whose head dim lies outside the
    head dims the profile's attention was measured at; none when the profile has no head-dim curve."""
    curve = profile.gpu.attention_fwd_head_dim_ratio
    if curve is None:
        return []
    low, high = curve.x[0], curve.x[-1]
    heads = {"the decoder's": arch.head_dim}
    if arch.vision is not None:
        heads["the vision tower's"] = arch.vision.head_dim
    return [f"note: {who} attention heads are {dim} wide, outside the head dims {profile.name}'s attention was "
            f"measured at ({low:g}-{high:g}): timed at {low if dim < low else high:g}'s rate. `advisor calibrate "
            "--only attention` measures heads of 64-256 (merge it with python -m calibration.merge)"
            for who, dim in heads.items() if not low <= dim <= high]
