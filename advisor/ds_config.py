"""DeepSpeed config files: write one for a Strategy, and read an existing one back.

Writing and reading are inverses for every point of the search space (a test proves the
round trip, another that DeepSpeed's own config class accepts what we write). Reading is
lenient about keys we do not model (a real config has many) but strict about the values
we use: a malformed one names its key.

Checkpointing every k-th layer has no DeepSpeed key of its own (checkpointing happens where
the model calls `deepspeed.checkpointing.checkpoint`). We carry it in
`activation_checkpointing.number_checkpoints` = the number of checkpointed layers,
ceil(layers / k); a section without that key means every layer; no section means none.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from models.architecture import Architecture
from models.strategy import Strategy


class DsConfigError(ValueError):
    """A DeepSpeed config that cannot be read or is not supported; names the key."""


# Placeholders for the optimizer: the advisor chooses the layout, not the training recipe.
OPTIMIZER = {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}}
SUPER_OFFLOAD_CPU_CORES_PERC = 0.8  # DeepSpeed's default for cpuadam_cores_perc


def checkpointed_layers(checkpoint_every: int, num_layers: int) -> int:
    return math.ceil(num_layers / checkpoint_every)


def to_ds_config(strategy: Strategy, arch: Architecture) -> dict:
    """The DeepSpeed config (bf16, AdamW) that runs `strategy`."""
    s = strategy
    zero: dict = {
        "stage": s.zero_stage,
        "overlap_comm": s.overlap_comm,
        "contiguous_gradients": True,
        "reduce_bucket_size": s.reduce_bucket_size,
    }
    if s.zero_stage == 3:
        zero["stage3_prefetch_bucket_size"] = s.prefetch_bucket_size
    else:
        zero["allgather_bucket_size"] = s.allgather_bucket_size
    if s.offload_optimizer == "cpu":
        opt = {"device": "cpu", "pin_memory": True}
        if s.offload_ratio < 1:
            opt["ratio"] = s.offload_ratio
        if s.super_offload:
            opt["super_offload"] = True
            opt["cpuadam_cores_perc"] = SUPER_OFFLOAD_CPU_CORES_PERC
        zero["offload_optimizer"] = opt
    if s.offload_param == "cpu":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    config = {
        "train_batch_size": s.global_batch,
        "train_micro_batch_size_per_gpu": s.micro_batch,
        "gradient_accumulation_steps": s.grad_accum,
        "bf16": {"enabled": True},
        "optimizer": json.loads(json.dumps(OPTIMIZER)),
        # DeepSpeed 0.19 overlaps SuperOffload's CPU step with backward only without clipping.
        "gradient_clipping": 0.0 if s.super_offload else 1.0,
        "zero_optimization": zero,
        "sequence_parallel_size": s.sp,
        "steps_per_print": 10,
        "wall_clock_breakdown": False,
    }
    if s.checkpoint_every:
        config["activation_checkpointing"] = {
            "partition_activations": False,
            "cpu_checkpointing": s.cpu_checkpointing,
            "contiguous_memory_optimization": False,
            "number_checkpoints": checkpointed_layers(s.checkpoint_every, arch.num_layers),
            "synchronize_checkpoint_boundary": False,
            "profile": False,
        }
    return config


@dataclass(frozen=True)
class DsSettings:
    """What a DeepSpeed config says about the strategy; None where it says nothing."""

    fields: dict  # Strategy field -> value (only those the config sets)
    train_batch_size: int | None


def _get(section: dict, key: str, kind, where: str, default=None):
    if key not in section or section[key] == "auto":  # Hugging Face's "auto": not set here
        return default
    value = section[key]
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = not isinstance(value, bool) and isinstance(value, (int, float)) and float(value).is_integer()
        value = int(value) if ok else value
    elif kind is float:
        ok = not isinstance(value, bool) and isinstance(value, (int, float))
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise DsConfigError(f"{where}: bad key '{key}': expected {kind.__name__}, got {value!r}")
    return value


def _section(config: dict, key: str, where: str) -> dict:
    value = config.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise DsConfigError(f"{where}: bad key '{key}': expected an object, got {value!r}")
    return value


def _device(section: dict, key: str, where: str) -> str:
    device = _get(section, "device", str, f"{where} {key}", "none")
    if device not in ("none", "cpu"):
        raise DsConfigError(f"{where}: bad key '{key}.device': '{device}' is not modelled (use none or cpu)")
    return device


def parse_ds_config(config: dict, arch: Architecture, origin: str = "<ds_config>") -> DsSettings:
    """Read the strategy a DeepSpeed config describes (for `advisor predict --ds-config`)."""
    if not isinstance(config, dict):
        raise DsConfigError(f"{origin}: expected a JSON object")
    out: dict = {}
    zero = _section(config, "zero_optimization", origin)
    stage = _get(zero, "stage", int, f"{origin} zero_optimization", 0)
    if stage not in (0, 1, 2, 3):
        raise DsConfigError(f"{origin}: bad key 'zero_optimization.stage': must be 0-3, got {stage}")
    if zero.get("zenflow"):
        raise DsConfigError(f"{origin}: bad key 'zero_optimization.zenflow': ZenFlow changes the update rule and is not modelled")
    out["zero_stage"] = stage
    opt = _section(zero, "offload_optimizer", f"{origin} zero_optimization")
    out["offload_optimizer"] = _device(opt, "zero_optimization.offload_optimizer", origin)
    if out["offload_optimizer"] == "cpu":
        out["offload_ratio"] = float(_get(opt, "ratio", float, f"{origin} offload_optimizer", 1.0))
        out["super_offload"] = _get(opt, "super_offload", bool, f"{origin} offload_optimizer", False)
    param = _section(zero, "offload_param", f"{origin} zero_optimization")
    out["offload_param"] = _device(param, "zero_optimization.offload_param", origin)
    overlap = _get(zero, "overlap_comm", bool, f"{origin} zero_optimization")
    if overlap is not None:  # absent: DeepSpeed's default for the final stage (see with_defaults)
        out["overlap_comm"] = overlap
    for key, name in (("reduce_bucket_size", "reduce_bucket_size"), ("allgather_bucket_size", "allgather_bucket_size"),
                      ("stage3_prefetch_bucket_size", "prefetch_bucket_size")):
        value = _get(zero, key, int, f"{origin} zero_optimization")
        if value is not None:
            out[name] = value
    ckpt = config.get("activation_checkpointing")
    if ckpt is None:
        out["checkpoint_every"], out["cpu_checkpointing"] = 0, False
    else:
        ckpt = _section(config, "activation_checkpointing", origin)
        n = _get(ckpt, "number_checkpoints", int, f"{origin} activation_checkpointing")
        if n is not None and not 1 <= n <= arch.num_layers:
            raise DsConfigError(
                f"{origin}: bad key 'activation_checkpointing.number_checkpoints': must be 1..{arch.num_layers}, got {n}"
            )
        every = 1 if n is None else min(k for k in range(1, arch.num_layers + 1)
                                        if checkpointed_layers(k, arch.num_layers) <= n)
        out["checkpoint_every"] = every
        out["cpu_checkpointing"] = _get(ckpt, "cpu_checkpointing", bool, f"{origin} activation_checkpointing", False)
    for key, name in (("train_micro_batch_size_per_gpu", "micro_batch"), ("gradient_accumulation_steps", "grad_accum"),
                      ("sequence_parallel_size", "sp")):
        value = _get(config, key, int, origin)
        if value is not None:
            if value < 1:
                raise DsConfigError(f"{origin}: bad key '{key}': must be positive, got {value}")
            out[name] = value
    tbs = _get(config, "train_batch_size", int, origin)
    if tbs is not None and tbs < 1:
        raise DsConfigError(f"{origin}: bad key 'train_batch_size': must be positive, got {tbs}")
    return DsSettings(fields=out, train_batch_size=tbs)


def load_ds_config(path: str | Path, arch: Architecture) -> DsSettings:
    """Read a ds_config.json (JSON or HJSON, as DeepSpeed itself accepts)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise DsConfigError(f"cannot read DeepSpeed config {path}: {exc.strerror}") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError:
        import hjson

        try:
            config = hjson.loads(text)
        except hjson.HjsonDecodeError as exc:
            raise DsConfigError(f"{path}: not valid JSON ({exc})") from None
    return parse_ds_config(config, arch, origin=str(path))


def gpus_from_batch(settings: DsSettings, sp: int) -> int | None:
    """The GPU count a config implies when it gives train_batch_size, micro-batch and
    gradient accumulation (train_batch_size = micro * accumulation * dp, gpus = dp * sp)."""
    mb, ga, tbs = settings.fields.get("micro_batch"), settings.fields.get("grad_accum"), settings.train_batch_size
    if tbs is None or mb is None or ga is None:
        return None
    if tbs % (mb * ga):
        raise DsConfigError(
            f"train_batch_size {tbs} is not a multiple of micro-batch {mb} x gradient accumulation {ga}"
        )
    return tbs // (mb * ga) * sp


def with_defaults(fields: dict) -> dict:
    """DeepSpeed's defaults for what a config leaves out: overlap_comm is on only for ZeRO-3."""
    return {"overlap_comm": fields.get("zero_stage", 0) == 3, **fields}


def strategy_from_ds_config(settings: DsSettings, gpus: int, gpus_per_node: int, base: Strategy | None = None) -> Strategy:
    """The strategy a config describes on `gpus` GPUs; fields it omits come from `base`,
    then from DeepSpeed's defaults."""
    return replace(base or Strategy(), gpus=gpus, gpus_per_node=gpus_per_node, **with_defaults(settings.fields))
