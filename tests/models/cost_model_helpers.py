"""Helpers for the cost-model tests: shipped profiles with chosen constants replaced."""
from __future__ import annotations

import numpy as np

from models.profile import HardwareProfile, load_profile, parse_profile
from models.strategy import StrategyBatch


def profile_with(values: dict[str, object], base: str = "gh200") -> HardwareProfile:
    """The shipped profile with dotted paths replaced: a Quantity's value, or any other field (None: the
    field itself, an optional one left unset)."""
    data = load_profile(base).model_dump()
    for path, value in values.items():
        node = data
        keys = path.split(".")
        for k in keys[:-1]:
            node = node[k]
        last = keys[-1]
        if isinstance(node[last], dict) and "value" in node[last] and value is not None:
            node[last]["value"] = value
        else:
            node[last] = value
    return parse_profile(data, origin="test")


def random_batch(n: int, seed: int = 0) -> StrategyBatch:
    """Strategies drawn from the searched space, refused combinations included."""
    rng = np.random.default_rng(seed)
    return StrategyBatch(
        gpus=rng.choice([1, 2, 4, 8], n), gpus_per_node=rng.choice([2, 4], n), zero_stage=rng.integers(0, 4, n),
        offload_optimizer=rng.integers(0, 2, n), offload_ratio=rng.choice([0.5, 1.0], n),
        super_offload=rng.random(n) < 0.3, offload_param=(rng.random(n) < 0.2).astype(int),
        checkpoint_every=rng.choice([0, 1, 3], n), cpu_checkpointing=rng.random(n) < 0.2,
        sp=rng.choice([1, 2, 4], n), micro_batch=rng.choice([1, 2], n), grad_accum=rng.choice([1, 3], n),
        overlap_comm=rng.random(n) < 0.7, reduce_bucket_size=np.full(n, 500_000_000),
        allgather_bucket_size=np.full(n, 500_000_000), prefetch_bucket_size=np.full(n, 50_000_000),
        cpu_threads_per_rank=np.zeros(n, dtype=int),
    )
