"""A DeepSpeed training strategy: how one step of a workload is laid out on the GPUs.

`Strategy` is one configuration; `StrategyBatch` holds many as columns of numpy arrays so
the cost model evaluates them all at once. Combinations DeepSpeed refuses are not
silently dropped: `static_reasons` says why each one is infeasible.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields

import numpy as np

from models.architecture import Architecture
from models.input_file import shown
from models.limits import (MAX_BUCKET_ELEMENTS, MAX_COUNT, MAX_GPUS, MAX_GPUS_PER_NODE, MAX_LAYERS, MAX_PER_SAMPLE,
                           MAX_SEQUENCES)

OFFLOAD_NONE, OFFLOAD_CPU = 0, 1
OFFLOAD_NAMES = {"none": OFFLOAD_NONE, "cpu": OFFLOAD_CPU}


@dataclass(frozen=True)
class Strategy:
    """One configuration. `checkpoint_every`: 0 none, 1 every layer (full), k every k-th layer."""

    gpus: int = 1
    gpus_per_node: int = 1
    zero_stage: int = 0
    offload_optimizer: str = "none"  # none | cpu
    offload_ratio: float = 1.0  # ZeRO-3 partial optimizer offload (DeepSpeedCPUAdam on that share)
    super_offload: bool = False  # asynchronous CPU optimizer (SuperOffload), ZeRO-3 + cpu only
    offload_param: str = "none"  # none | cpu, ZeRO-3 only
    checkpoint_every: int = 0
    cpu_checkpointing: bool = False
    sp: int = 1  # DeepSpeed-Ulysses degree
    micro_batch: int = 1
    grad_accum: int = 1
    overlap_comm: bool = True
    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000
    prefetch_bucket_size: int = 50_000_000
    # CPU threads each rank's process uses (OMP_NUM_THREADS): the CPU optimizer and DeepSpeed's host
    # work run on them. 0 is what the advisor's launch lines set: the host's cores / ranks on a node.
    cpu_threads_per_rank: int = 0

    @property
    def dp(self) -> int:
        return self.gpus // self.sp

    @property
    def nodes(self) -> int:
        return -(-self.gpus // self.gpus_per_node)

    @property
    def ranks_per_node(self) -> int:
        """The ranks that share one node's host (its cores, memory bandwidth, CPU power)."""
        return min(self.gpus, self.gpus_per_node)

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step."""
        return self.micro_batch * self.dp * self.grad_accum

    @property
    def checkpointing(self) -> str:
        return {0: "none", 1: "full"}.get(self.checkpoint_every, f"every-{self.checkpoint_every}")

    def label(self) -> str:
        parts = [f"z{self.zero_stage}"]
        if self.offload_optimizer == "cpu":
            kind = "super" if self.super_offload else "opt"
            ratio = f"{self.offload_ratio:g}" if self.offload_ratio < 1 else ""
            parts.append(f"off-{kind}{ratio}")
        if self.offload_param == "cpu":
            parts.append("off-param")
        if self.checkpoint_every:
            parts.append("ckpt" if self.checkpoint_every == 1 else f"ckpt/{self.checkpoint_every}")
            if self.cpu_checkpointing:
                parts.append("cpu-ckpt")
        parts.append(f"sp{self.sp}")
        parts.append(f"mb{self.micro_batch}")
        parts.append(f"ga{self.grad_accum}")
        parts.append(f"{self.gpus}gpu")
        if not self.overlap_comm and self.zero_stage > 0:  # ZeRO-0 has nothing to overlap
            parts.append("no-overlap")
        defaults = Strategy()
        for name, short in (("reduce_bucket_size", "rb"), ("allgather_bucket_size", "agb"),
                            ("prefetch_bucket_size", "pfb")):
            if getattr(self, name) != getattr(defaults, name):
                parts.append(f"{short}{getattr(self, name):.0e}".replace("e+0", "e"))
        if self.nodes > 1:
            parts.append(f"{self.gpus_per_node}/node")
        if self.cpu_threads_per_rank:
            parts.append(f"{self.cpu_threads_per_rank}thr")
        return " ".join(parts)


# The largest value of each count (models.limits): past them numpy's int64 columns overflow. Their
# smallest values are rules of their own (static_reasons).
_MOST = {"gpus": MAX_GPUS, "gpus_per_node": MAX_GPUS_PER_NODE, "sp": MAX_COUNT, "micro_batch": MAX_COUNT,
         "grad_accum": MAX_COUNT, "checkpoint_every": MAX_LAYERS, "reduce_bucket_size": MAX_BUCKET_ELEMENTS,
         "allgather_bucket_size": MAX_BUCKET_ELEMENTS, "prefetch_bucket_size": MAX_BUCKET_ELEMENTS,
         "cpu_threads_per_rank": MAX_PER_SAMPLE}


def _type_reasons(s: Strategy) -> list[str]:
    """Fields whose values are not of their declared type or past their largest value (a sweep file's or
    a run record's JSON can hold anything): a bool is not a count, a string not a stage, NaN not a
    ratio. numpy's scalars count as theirs."""
    wrong = []
    for f in fields(Strategy):
        value, kind = getattr(s, f.name), f.type
        flag = isinstance(value, (bool, np.bool_))
        if kind == "int":
            ok = isinstance(value, numbers.Integral) and not flag
        elif kind == "float":  # an int of any size is finite; math.isfinite would overflow on it
            ok = (isinstance(value, numbers.Real) and not flag
                  and (isinstance(value, numbers.Integral) or math.isfinite(value)))
        else:
            ok = flag if kind == "bool" else isinstance(value, str)
        if not ok:
            wrong.append(f"{f.name} must be {'a whole number' if kind == 'int' else 'a number' if kind == 'float' else kind}"
                         f", got {shown(value)}")
        elif f.name in _MOST and value > _MOST[f.name]:
            wrong.append(f"{f.name} must be at most {_MOST[f.name]:,}, got {shown(value)}")
    if not wrong and s.sp > 0 and s.global_batch > MAX_SEQUENCES:
        wrong.append(f"a step of {s.global_batch:.3g} sequences (micro-batch x accumulation x data-parallel GPUs) is "
                     f"more than {MAX_SEQUENCES:.0e}")
    return wrong


def strategy_from_dict(data: dict) -> Strategy:
    """A stored strategy (a run record's), every field checked against its type and range; ValueError
    naming the field. The rules that need the model (heads, layers) are static_reasons'."""
    if not isinstance(data, dict):
        raise ValueError(f"a strategy is a JSON object, got {shown(data)}")
    unknown = sorted(set(data) - {f.name for f in fields(Strategy)})
    if unknown:
        raise ValueError(f"unknown strategy fields {unknown}")
    strategy = Strategy(**data)
    wrong = _type_reasons(strategy) or _value_reasons(strategy)
    if wrong:
        raise ValueError("; ".join(wrong))
    return strategy


def _value_reasons(s: Strategy) -> list[str]:
    """Fields whose values no strategy has, whatever the model and the other fields."""
    reasons = []
    if s.zero_stage not in (0, 1, 2, 3):
        reasons.append(f"ZeRO stage must be 0-3, got {shown(s.zero_stage)}")
    if s.offload_optimizer not in OFFLOAD_NAMES or s.offload_param not in OFFLOAD_NAMES:
        reasons.append("offload devices must be 'none' or 'cpu'")
    if s.gpus < 1 or s.gpus_per_node < 1 or s.sp < 1 or s.micro_batch < 1 or s.grad_accum < 1:
        reasons.append("gpus, GPUs per node, sp, micro-batch and gradient accumulation must be positive")
    if min(s.reduce_bucket_size, s.allgather_bucket_size, s.prefetch_bucket_size) < 1:
        reasons.append("bucket sizes must be positive")
    if not 0 < s.offload_ratio <= 1:
        reasons.append(f"offload ratio must be in (0, 1], got {shown(s.offload_ratio)}")
    if s.cpu_threads_per_rank < 0:
        reasons.append(f"CPU threads per rank must be positive (0: the launch default), got {shown(s.cpu_threads_per_rank)}")
    if s.checkpoint_every < 0:
        reasons.append(f"checkpoint_every must be 0 or more, got {shown(s.checkpoint_every)}")
    return reasons


def static_reasons(strategy: Strategy, arch: Architecture) -> list[str]:
    """Why DeepSpeed (or the layout) refuses this strategy, before any cost is computed."""
    s = strategy
    reasons = _type_reasons(s)
    if reasons:
        return reasons
    reasons = _value_reasons(s)
    if s.gpus < 1 or s.gpus_per_node < 1 or s.sp < 1:
        return reasons
    if s.gpus % s.sp:
        reasons.append(f"sequence-parallel degree {s.sp} does not divide {s.gpus} GPUs")
    if arch.num_heads % s.sp or arch.num_kv_heads % s.sp:
        reasons.append(
            f"Ulysses sp={s.sp} must divide the heads ({arch.num_heads}) and KV heads ({arch.num_kv_heads})"
        )
    if s.sp > 1 and s.nodes > 1 and s.sp > s.gpus_per_node:
        reasons.append(f"sp={s.sp} spans nodes; keep it within {s.gpus_per_node} GPUs per node")
    if s.offload_optimizer == "cpu" and s.zero_stage == 0:
        reasons.append("optimizer offload needs ZeRO stage 1, 2 or 3")
    if s.offload_param == "cpu" and s.zero_stage != 3:
        reasons.append("parameter offload needs ZeRO stage 3")
    if s.offload_param == "cpu" and s.offload_optimizer != "cpu":
        reasons.append("parameter offload needs optimizer offload to the CPU as well")
    if s.offload_ratio < 1 and (s.zero_stage != 3 or s.offload_optimizer != "cpu"):
        reasons.append("a partial offload ratio needs ZeRO-3 with optimizer offload to the CPU")
    if s.super_offload and (s.zero_stage != 3 or s.offload_optimizer != "cpu"):
        reasons.append("SuperOffload needs ZeRO-3 with optimizer offload to the CPU")
    if s.cpu_checkpointing and s.checkpoint_every == 0:
        reasons.append("CPU checkpointing needs activation checkpointing")
    if s.checkpoint_every > arch.num_layers:
        reasons.append(f"checkpoint_every must be 0..{arch.num_layers}, got {s.checkpoint_every}")
    return reasons


@dataclass
class StrategyBatch:
    """Many strategies as columns; field names and meanings match `Strategy`.

    String fields become integer codes (offload: 0 none, 1 cpu); booleans stay booleans.
    """

    gpus: np.ndarray
    gpus_per_node: np.ndarray
    zero_stage: np.ndarray
    offload_optimizer: np.ndarray
    offload_ratio: np.ndarray
    super_offload: np.ndarray
    offload_param: np.ndarray
    checkpoint_every: np.ndarray
    cpu_checkpointing: np.ndarray
    sp: np.ndarray
    micro_batch: np.ndarray
    grad_accum: np.ndarray
    overlap_comm: np.ndarray
    reduce_bucket_size: np.ndarray
    allgather_bucket_size: np.ndarray
    prefetch_bucket_size: np.ndarray
    cpu_threads_per_rank: np.ndarray

    @classmethod
    def from_strategies(cls, strategies: list[Strategy]) -> "StrategyBatch":
        columns = {}
        for f in fields(Strategy):
            values = [getattr(s, f.name) for s in strategies]
            if f.name in ("offload_optimizer", "offload_param"):
                values = [OFFLOAD_NAMES.get(v, -1) for v in values]
            columns[f.name] = np.asarray(values)
        return cls(**columns)

    def __len__(self) -> int:
        return len(self.gpus)

    @property
    def dp(self) -> np.ndarray:
        """Data-parallel ranks; refused strategies (sp or GPUs per node below 1) still get a number."""
        return self.gpus // np.maximum(self.sp, 1)

    @property
    def nodes(self) -> np.ndarray:
        return -(-self.gpus // np.maximum(self.gpus_per_node, 1))

    @property
    def ranks_per_node(self) -> np.ndarray:
        return np.minimum(self.gpus, self.gpus_per_node)

    def strategy(self, i: int) -> Strategy:
        names = {v: k for k, v in OFFLOAD_NAMES.items()}
        values = {}
        for f in fields(Strategy):
            v = getattr(self, f.name)[i].item()
            if f.name in ("offload_optimizer", "offload_param"):
                v = names[v]
            values[f.name] = v
        return Strategy(**values)
