"""The strategy space both searches walk: Optuna samples it, `--search exhaustive` lists it.

One `Space` serves both, so the two searches cover exactly the same points. Optuna sees a
flat space of categorical parameters with fixed choices (its samplers need fixed choices
per name); combinations DeepSpeed refuses are reported by `reasons` and become
constraints, while `enumerate` lists only the valid points.
"""
from __future__ import annotations

import hashlib
import itertools
import re
from dataclasses import dataclass, fields

import numpy as np

from advisor.inputs import step_global_batch
from models.architecture import Architecture
from models.strategy import OFFLOAD_NAMES, Strategy, StrategyBatch, static_reasons

# Optimizer/parameter offload families. `cpu-rX` is ZeRO-3 partial offload (that share of the
# optimizer runs in DeepSpeedCPUAdam); `super` is SuperOffload (asynchronous, ZeRO-3).
OFFLOAD_CHOICES = ("none", "cpu", "cpu-r0.25", "cpu-r0.5", "cpu-r0.75", "super", "cpu+param", "super+param")
# Activation checkpointing: every k-th layer (`full` is k=1), optionally kept in host memory.
CHECKPOINT_EVERY_CHOICES = (1, 2, 4)
MAX_MICRO_BATCH = 64


def offload_fields(choice: str) -> dict:
    """Strategy fields for one offload family name."""
    if choice not in OFFLOAD_CHOICES:
        raise ValueError(f"unknown offload choice {choice!r}")
    opt, _, param = choice.partition("+")
    ratio = float(opt.split("-r")[1]) if "-r" in opt else 1.0
    return {
        "offload_optimizer": "none" if opt == "none" else "cpu",
        "offload_ratio": ratio,
        "super_offload": opt == "super",
        "offload_param": "cpu" if param == "param" else "none",
    }


# Exactly none, full or every-K (K >= 1, no leading zero), each optionally +cpu; in any case. Anything
# else (`every-0`, `full+gpu`, `every-4+cpu+cpu`, a trailing space) is refused: read in part, it
# silently meant another strategy.
_CHECKPOINTING = re.compile(r"(none|full|every-([1-9][0-9]{0,5}))(\+cpu)?", re.IGNORECASE)


def checkpoint_fields(choice: str) -> dict:
    """`none`, `full`, `every-K`, each optionally `+cpu` (CPU checkpointing), case-insensitive."""
    match = _CHECKPOINTING.fullmatch(choice)
    if not match:
        raise ValueError(f"unknown checkpointing choice {choice!r}")
    base = match.group(1).lower()
    every = {"none": 0, "full": 1}[base] if match.group(2) is None else int(match.group(2))
    return {"checkpoint_every": every, "cpu_checkpointing": match.group(3) is not None}


def family_name(zero_stage: int, offload: str) -> str:
    return f"z{zero_stage}" + ("" if offload == "none" else f"+{offload}")


def parse_family(name: str) -> tuple[int, str]:
    stage, _, offload = name.partition("+")
    return int(stage[1:]), offload or "none"


# Family validity does not depend on the model: any architecture serves static_reasons there.
_ANY_ARCH = Architecture(name="any", hidden_size=1, num_layers=1, num_heads=1, num_kv_heads=1,
                         intermediate_size=1, vocab_size=1)


@dataclass(frozen=True)
class Space:
    """The choices of each searched parameter. `global_batch` is the target sequences per step;
    `run_sequences` the sequences of the whole run, which one step may not exceed (None: no limit)."""

    gpu_counts: tuple[int, ...]
    gpus_per_node: int
    global_batch: int
    zero_stages: tuple[int, ...]
    offload: tuple[str, ...]
    checkpointing: tuple[str, ...]
    sp: tuple[int, ...]
    micro_batch: tuple[int, ...]
    overlap_comm: tuple[bool, ...]
    run_sequences: int | None = None
    cpu_threads_per_rank: int = 0  # every strategy's (not searched: the launch line sets it)

    def choices(self) -> dict[str, tuple]:
        """Optuna parameter name -> choices; `gpus` only when the count is searched."""
        out = {"gpus": self.gpu_counts} if len(self.gpu_counts) > 1 else {}
        out.update(
            zero_offload=self.families,
            checkpointing=self.checkpointing,
            sp=self.sp,
            micro_batch=self.micro_batch,
            overlap_comm=self.overlap_comm,
        )
        return out

    @property
    def families(self) -> tuple[str, ...]:
        """ZeRO stage and offload as one choice ("z3+super+param"), valid pairs only: DeepSpeed
        refuses the others whatever the rest of the point, so no trial is spent on them."""
        return tuple(family_name(z, o) for z, o in itertools.product(self.zero_stages, self.offload)
                     if not static_reasons(Strategy(zero_stage=z, **offload_fields(o)), _ANY_ARCH))

    def strategy(self, params: dict) -> Strategy:
        """The Strategy for one point; gradient accumulation follows from the global batch."""
        gpus = params.get("gpus", self.gpu_counts[0])
        zero_stage, offload = parse_family(params["zero_offload"])
        dp = max(1, gpus // params["sp"])
        _, grad_accum = step_global_batch(self.global_batch, dp, params["micro_batch"])
        return Strategy(
            gpus=gpus,
            gpus_per_node=min(gpus, self.gpus_per_node),
            zero_stage=zero_stage,
            sp=params["sp"],
            micro_batch=params["micro_batch"],
            grad_accum=grad_accum,
            overlap_comm=params["overlap_comm"] and zero_stage > 0,  # ZeRO-0 overlaps nothing: DeepSpeed's off
            cpu_threads_per_rank=self.cpu_threads_per_rank,
            **offload_fields(offload),
            **checkpoint_fields(params["checkpointing"]),
        )

    def micro_batch_ok(self, dp: int, micro_batch: int) -> bool:
        """A micro-batch may not push one step's batch past the target (beyond one per rank), and
        no step may hold more sequences than the whole run."""
        within_target = dp * micro_batch <= max(self.global_batch, dp)
        return within_target and self.step_within_run(dp, micro_batch)

    def step_within_run(self, dp: int, micro_batch: int) -> bool:
        if self.run_sequences is None or dp < 1:
            return True  # dp < 1: sp beyond the GPUs, which static_reasons refuses
        return step_global_batch(self.global_batch, dp, micro_batch)[0] <= self.run_sequences

    def reasons(self, strategy: Strategy, arch: Architecture) -> list[str]:
        """DeepSpeed's refusals plus this space's own rules on the batch."""
        reasons = static_reasons(strategy, arch)
        if strategy.sp < 1:
            return reasons
        if strategy.dp * strategy.micro_batch > max(self.global_batch, strategy.dp):
            reasons.append(
                f"micro-batch {strategy.micro_batch} x {strategy.dp} data-parallel ranks exceeds"
                f" the global batch of {self.global_batch} sequences"
            )
        if not self.step_within_run(strategy.dp, strategy.micro_batch):
            reasons.append(f"one step of {strategy.global_batch} sequences is more than the run's "
                           f"{self.run_sequences} sequences")
        return reasons

    def enumerate(self, arch: Architecture) -> StrategyBatch:
        """Every statically valid point, as columns (no per-point Python objects)."""
        families = [parse_family(f) for f in self.families]
        ckpts = [checkpoint_fields(c) for c in self.checkpointing]
        rows = []
        for gpus in self.gpu_counts:
            gpn = min(gpus, self.gpus_per_node)
            for sp in self.sp:
                if static_reasons(Strategy(gpus=gpus, gpus_per_node=gpn, sp=sp), arch):
                    continue
                dp = gpus // sp
                for mb in self.micro_batch:
                    if not self.micro_batch_ok(dp, mb):
                        continue
                    ga = step_global_batch(self.global_batch, dp, mb)[1]
                    for (z, o), ck, ov in itertools.product(families, ckpts, self.overlap_comm):
                        if z == 0:  # ZeRO-0 overlaps nothing: one point, overlap_comm off as DeepSpeed has it
                            if ov != self.overlap_comm[0]:
                                continue
                            ov = False
                        off = offload_fields(o)
                        rows.append((gpus, gpn, z, OFFLOAD_NAMES[off["offload_optimizer"]], off["offload_ratio"],
                                     off["super_offload"], OFFLOAD_NAMES[off["offload_param"]], ck["checkpoint_every"],
                                     ck["cpu_checkpointing"], sp, mb, ga, ov))
        names = ["gpus", "gpus_per_node", "zero_stage", "offload_optimizer", "offload_ratio", "super_offload",
                 "offload_param", "checkpoint_every", "cpu_checkpointing", "sp", "micro_batch", "grad_accum",
                 "overlap_comm"]
        table = list(zip(*rows)) if rows else [()] * len(names)
        dtypes = {"offload_ratio": float, "super_offload": bool, "cpu_checkpointing": bool, "overlap_comm": bool}
        columns = {n: np.asarray(col, dtype=dtypes.get(n, np.int64)) for n, col in zip(names, table)}
        columns["cpu_threads_per_rank"] = np.full(len(rows), self.cpu_threads_per_rank, dtype=np.int64)
        for f in fields(Strategy):  # bucket sizes: DeepSpeed's defaults, not searched
            if f.name not in columns:
                columns[f.name] = np.full(len(rows), f.default, dtype=np.int64)
        return StrategyBatch(**columns)

    def fingerprint(self) -> str:
        return hashlib.sha1(repr(self).encode()).hexdigest()[:10]


def ulysses_degrees(arch: Architecture, gpus: int, gpus_per_node: int) -> list[int]:
    """Ulysses degrees for `gpus`: dividing the heads, the KV heads and the GPUs, within one node."""
    return [d for d in range(1, min(gpus, gpus_per_node) + 1)
            if arch.num_heads % d == 0 and arch.num_kv_heads % d == 0 and gpus % d == 0]


def widest_sp(arch: Architecture, gpus: int, gpus_per_node: int) -> int:
    return max(ulysses_degrees(arch, gpus, gpus_per_node))


def build_space(
    arch: Architecture,
    gpu_counts: list[int],
    gpus_per_node: int,
    global_batch: int,
    *,
    zero_stages: tuple[int, ...] = (0, 1, 2, 3),
    offload: tuple[str, ...] = OFFLOAD_CHOICES,
    checkpoint_every: tuple[int, ...] = CHECKPOINT_EVERY_CHOICES,
    overlap_comm: tuple[bool, ...] = (True, False),
    max_micro_batch: int = MAX_MICRO_BATCH,
    run_sequences: int | None = None,
    cpu_threads_per_rank: int = 0,
) -> Space:
    """The default space for a model on a machine: sp divides heads, KV heads and some GPU
    count (within a node); micro-batches are powers of two up to the global batch."""
    counts = tuple(sorted(set(gpu_counts)))
    sp = tuple(sorted({d for g in counts for d in ulysses_degrees(arch, g, gpus_per_node)}))
    micro = []
    mb = 1
    while mb <= min(max(global_batch, 1), max_micro_batch):
        micro.append(mb)
        mb *= 2
    ckpt = ["none"]
    for k in checkpoint_every:
        if k <= arch.num_layers:
            base = "full" if k == 1 else f"every-{k}"
            ckpt += [base, base + "+cpu"]
    return Space(
        gpu_counts=counts,
        gpus_per_node=gpus_per_node,
        global_batch=global_batch,
        zero_stages=tuple(zero_stages),
        offload=tuple(offload),
        checkpointing=tuple(ckpt),
        sp=sp,
        micro_batch=tuple(micro),
        overlap_comm=tuple(overlap_comm),
        run_sequences=run_sequences,
        cpu_threads_per_rank=cpu_threads_per_rank,
    )
