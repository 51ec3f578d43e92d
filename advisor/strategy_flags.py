"""`advisor predict`'s strategy from its flags and an optional DeepSpeed config, and back.

Every strategy the search can pick can be written as flags (`flags_for`) and read back here to
the same `Strategy`, so a pick can be predicted again, and explained, without a config file.
Flags name the space's own vocabulary: `--checkpointing none | full | every-K`, each optionally
`+cpu` (CPU checkpointing), as `advisor.space` writes them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from models.ds_config import DsConfigError, DsSettings, batch_sizes, gpus_from_batch, with_defaults
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
        raise InputError(f"bad --checkpointing '{text}': use exactly none, full or every-K (K >= 1), each "
                         "optionally +cpu, e.g. every-4+cpu (+cpu keeps the checkpoints in host memory)") from None


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
    """Flags over the config's settings over DeepSpeed's defaults. Where the config gives train_batch_size,
    it holds: micro-batch and accumulation are set from it as DeepSpeed sets them (a flag for one of them
    leaves the other to follow), and refused where they cannot multiply to it on these GPUs. Otherwise
    they are as given, the accumulation by default from the global batch target."""
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
    grad_accum = fields.pop("grad_accum", None)
    strategy = _refused_or(Strategy(gpus=gpus, gpus_per_node=min(gpus, gpus_per_node), **fields), arch)
    tbs = settings.train_batch_size
    if tbs is not None:
        micro_batch = fields.get("micro_batch")
        if flags.micro_batch is not None and flags.grad_accum is None:
            grad_accum = None  # the config's accumulation follows the micro-batch asked for
        if flags.grad_accum is not None and flags.micro_batch is None:
            micro_batch = None
        try:
            micro_batch, grad_accum = batch_sizes(tbs, micro_batch, grad_accum, strategy.dp)
        except DsConfigError as exc:
            flags_given = [f for f, v in (("--gpus", flags.gpus), ("--sp", flags.sp), ("--micro-batch", flags.micro_batch),
                                          ("--grad-accum", flags.grad_accum)) if v is not None]
            fix = f"change {', '.join(flags_given)} or the config" if flags_given else "change the config"
            raise InputError(f"--ds-config: {exc}: {fix}") from None
        return _refused_or(replace(strategy, micro_batch=micro_batch, grad_accum=grad_accum), arch)
    if grad_accum is None:
        grad_accum = step_global_batch(global_batch_target, strategy.dp, strategy.micro_batch)[1]
    return _refused_or(replace(strategy, grad_accum=grad_accum), arch)


def _refused_or(strategy: Strategy, arch: Architecture) -> Strategy:
    """`strategy`, or the one line that says why DeepSpeed (or the layout) refuses it."""
    reasons = static_reasons(strategy, arch)
    if reasons:
        raise InputError(f"{strategy.label()}: " + "; ".join(reasons))
    return strategy
