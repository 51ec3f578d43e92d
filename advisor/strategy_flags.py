"""`advisor predict`'s strategy from its flags and an optional DeepSpeed config, and back.

Every strategy the search can pick can be written as flags (`flags_for`) and read back here to
the same `Strategy`, so a pick can be predicted again, and explained, without a config file.
Flags name the space's own vocabulary: `--checkpointing none | full | every-K`, each optionally
`+cpu` (CPU checkpointing), as `advisor.space` writes them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from models.ds_config import DsSettings, gpus_from_batch, with_defaults
from advisor.inputs import InputError, check_whole_nodes, step_global_batch
from advisor.space import checkpoint_fields
from models.architecture import Architecture
from models.strategy import Strategy, static_reasons


@dataclass(frozen=True)
class StrategyFlags:
    """What the user typed; None where a flag was not given."""

    gpus: int | None = None
    zero_stage: int | None = None
    offload_optimizer: str | None = None
    offload_ratio: float | None = None
    super_offload: bool | None = None
    offload_param: str | None = None
    checkpointing: str | None = None
    sp: int | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    overlap_comm: bool | None = None
    cpu_threads_per_rank: int | None = None


def checkpointing_name(strategy: Strategy) -> str:
    """The `--checkpointing` value (and the space's choice) for a strategy."""
    base = {0: "none", 1: "full"}.get(strategy.checkpoint_every, f"every-{strategy.checkpoint_every}")
    return base + ("+cpu" if strategy.cpu_checkpointing else "")


def parse_checkpointing(text: str) -> dict:
    try:
        return checkpoint_fields(text)
    except ValueError:
        raise InputError(f"bad --checkpointing '{text}': use none, full or every-K, each optionally +cpu "
                         "(full+cpu keeps the checkpoints in host memory)") from None


def flags_for(strategy: Strategy) -> list[str]:
    """`advisor predict` flags that give back exactly `strategy` (on a profile with its GPUs per node)."""
    s = strategy
    out = ["--gpus", str(s.gpus), "--zero", str(s.zero_stage), "--offload-optimizer", s.offload_optimizer]
    if s.offload_ratio < 1:
        out += ["--offload-ratio", f"{s.offload_ratio:g}"]
    if s.super_offload:
        out += ["--super-offload"]
    out += ["--offload-param", s.offload_param, "--checkpointing", checkpointing_name(s), "--sp", str(s.sp),
            "--micro-batch", str(s.micro_batch), "--grad-accum", str(s.grad_accum),
            "--overlap-comm" if s.overlap_comm else "--no-overlap-comm"]
    if s.cpu_threads_per_rank:
        out += ["--cpu-threads-per-rank", str(s.cpu_threads_per_rank)]
    return out


def strategy_from_inputs(flags: StrategyFlags, settings: DsSettings, arch: Architecture, gpus_per_node: int,
                         global_batch_target: int) -> Strategy:
    """Flags over the config's settings over DeepSpeed's defaults; gradient accumulation from the
    flag, else the config (when consistent), else the global batch target."""
    fields = dict(settings.fields)
    explicit = {k: v for k, v in asdict(flags).items() if v is not None and k not in ("gpus", "checkpointing")}
    fields.update(explicit)
    if flags.checkpointing is not None:
        fields.update(parse_checkpointing(flags.checkpointing))
    if flags.offload_optimizer == "none":  # an explicit "none" also drops the config's ratio / SuperOffload
        fields.update(offload_ratio=1.0, super_offload=False)
    fields = with_defaults(fields)
    gpus = flags.gpus or gpus_from_batch(settings, settings.fields.get("sp", 1)) or gpus_per_node
    check_whole_nodes(gpus, gpus_per_node)
    ga_config = fields.pop("grad_accum", None)
    strategy = Strategy(gpus=gpus, gpus_per_node=min(gpus, gpus_per_node), **fields)
    reasons = static_reasons(strategy, arch)
    if reasons:
        raise InputError(f"{strategy.label()}: " + "; ".join(reasons))
    tbs = settings.train_batch_size
    if flags.grad_accum is not None:
        grad_accum = flags.grad_accum
    elif ga_config and (tbs is None or tbs == strategy.micro_batch * ga_config * strategy.dp):
        grad_accum = ga_config
    else:
        grad_accum = step_global_batch(tbs or global_batch_target, strategy.dp, strategy.micro_batch)[1]
    return Strategy(**{**asdict(strategy), "grad_accum": grad_accum})
