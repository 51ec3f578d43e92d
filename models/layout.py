"""How each strategy of a batch lays one step out on the GPUs, worked out once.

The memory and the time model need the same facts: over how many ranks ZeRO partitions the
optimizer state, how many parameters a rank owns, whether the collectives stay inside a node,
and what share of a rank's optimizer state and parameters sits on the host. Both read them
here. Tensor or pipeline parallelism would add their degrees (and the ranks they divide) here.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.params import ParamCounts
from models.strategy import OFFLOAD_CPU, StrategyBatch

SUB_GROUP_SIZE = 1_000_000_000  # DeepSpeed's default sub_group_size (elements)


def offload_fraction(stage, offload_optimizer, ratio, params_per_rank, sub_group_size=SUB_GROUP_SIZE) -> np.ndarray:
    """Share of a rank's optimizer state DeepSpeed puts on the CPU.

    ZeRO-1/2 offload everything. ZeRO-3 assigns whole sub-groups: with n of them,
    those with index >= int((1 - ratio) * n) go to the CPU (stage3.py, `subgroup_to_device`).
    """
    stage = np.asarray(stage)
    on = np.asarray(offload_optimizer) == OFFLOAD_CPU
    n_sub = np.maximum(1.0, np.ceil(np.asarray(params_per_rank, dtype=float) / sub_group_size))
    on_gpu = np.floor((1.0 - np.asarray(ratio, dtype=float)) * n_sub)  # int() in DeepSpeed, same float rounding
    z3 = (n_sub - np.minimum(on_gpu, n_sub)) / n_sub
    return np.where(on, np.where(stage == 3, z3, 1.0), 0.0)


@dataclass(frozen=True)
class Layout:
    """Columns, one entry per strategy."""

    gpus: np.ndarray  # float
    ranks_per_node: np.ndarray
    one_node: np.ndarray  # the job fits one node: ZeRO's collectives run on the intra-node network
    zero_stage: np.ndarray
    shard: np.ndarray  # ranks the optimizer state is partitioned over (every GPU from ZeRO-1 on)
    trainable_per_rank: np.ndarray  # trainable parameters whose optimizer state a rank owns
    optimizer_offload: np.ndarray  # bool
    param_offload: np.ndarray  # bool: ZeRO-3 keeps the bf16 partition on the host
    offload_fraction: np.ndarray  # share of a rank's optimizer state on the CPU (whole sub-groups)

    @property
    def z12(self) -> np.ndarray:
        return (self.zero_stage == 1) | (self.zero_stage == 2)

    @property
    def z3(self) -> np.ndarray:
        return self.zero_stage == 3

    @classmethod
    def of(cls, b: StrategyBatch, counts: ParamCounts) -> "Layout":
        gpus = np.asarray(b.gpus, dtype=float)
        stage = np.asarray(b.zero_stage)
        shard = np.where(stage >= 1, gpus, 1.0)
        per_rank = float(counts.trainable) / shard
        return cls(
            gpus=gpus, ranks_per_node=b.ranks_per_node,
            one_node=b.gpus <= b.gpus_per_node, zero_stage=stage, shard=shard, trainable_per_rank=per_rank,
            optimizer_offload=np.asarray(b.offload_optimizer) == OFFLOAD_CPU,
            param_offload=(np.asarray(b.offload_param) == OFFLOAD_CPU) & (stage == 3),
            offload_fraction=offload_fraction(stage, b.offload_optimizer, b.offload_ratio, per_rank),
        )
