"""A cap on torch's GPU memory pool, to measure what a step needs rather than what it reserves.

Unconstrained, the caching allocator keeps every segment it ever made: a step's reserved pool ran
1.03-1.73x its peak allocation on one H200 (data/runs/). Under a cap the allocator frees its unused
cached segments and retries instead of failing, so a run can fit in less than its unconstrained
pool, at the cost of those retries. Set ADVISOR_GPU_MEMORY_CAP_GIB for a harness run to cap its pool
(`torch.cuda.set_per_process_memory_fraction`); the run records the cap (machine.gpu_memory_cap_gib)
and how often the allocator had to retry (gpu_alloc_retries).
"""
from __future__ import annotations

import os

ENV = "ADVISOR_GPU_MEMORY_CAP_GIB"
GIB = 2**30
UNCAPPED = 0.0
_NOTE = "memory cap: {factor:g} x predicted allocated"


def cap_note(factor: float) -> str:
    """A run record's note for a run capped at `factor` x its predicted allocated peak (UNCAPPED: none).
    An out-of-memory run records no machine, so the note is what keeps its cap."""
    return _NOTE.format(factor=factor)


def noted_factor(notes: list[str]) -> float | None:
    """The cap factor a record's notes give (`cap_note`); None for a record of no cap sweep."""
    for note in notes:
        if note.startswith("memory cap: "):
            return float(note.split()[2])
    return None


def cap_gib() -> float | None:
    """The cap asked for, in GiB; None when unset or not a positive number."""
    text = os.environ.get(ENV, "").strip()
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value > 0 else None


def fraction_of(cap: float, total_bytes: int) -> float:
    """The share of the device's memory that `cap` GiB is, at most all of it."""
    return min(1.0, cap * GIB / total_bytes)


def apply(device_index: int) -> float | None:
    """Cap this process's pool on `device_index` (call before the model is built); the cap in GiB."""
    import torch

    cap = cap_gib()
    if cap is not None:
        total = torch.cuda.get_device_properties(device_index).total_memory
        torch.cuda.set_per_process_memory_fraction(fraction_of(cap, total), device_index)
    return cap


def alloc_retries() -> int:
    """How often the allocator freed its cache and retried an allocation (memory_stats)."""
    import torch

    return int(torch.cuda.memory_stats().get("num_alloc_retries", 0))
