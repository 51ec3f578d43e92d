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
from models.flops import checkpointed_layers
from models.input_file import parse_json, read_text, shown
from models.limits import MAX_BUCKET_ELEMENTS, MAX_COUNT, MAX_SEQUENCES
from models.strategy import Strategy


class DsConfigError(ValueError):
    """A DeepSpeed config that cannot be read or is not supported; names the key."""


# Top-level keys DeepSpeed 0.19 reads (docs/_pages/config-json.md and runtime/config.py): another key is
# most likely a typo, which DeepSpeed ignores silently at the top level.
DEEPSPEED_KEYS = frozenset("""
train_batch_size train_micro_batch_size_per_gpu gradient_accumulation_steps optimizer scheduler
communication_data_type seq_parallel_communication_data_type prescale_gradients gradient_predivide_factor
sparse_gradients fp16 bf16 amp torch_autocast gradient_clipping zero_optimization zero_allow_untested_optimizer
zero_force_ds_cpu_optimizer aio activation_checkpointing sparse_attention data_efficiency curriculum_learning
flops_profiler tensorboard wandb csv_monitor comet comms_logger elasticity compression_training checkpoint
data_types autotuning pipeline nebula sequence_parallel_size tensor_parallel steps_per_print wall_clock_breakdown
dump_state memory_breakdown timers compile eigenvalue progressive_layer_drop quantize_training weight_quantization
hybrid_engine dataloader_drop_last disable_allgather gradient_allreduce_op use_data_before_expert_parallelism
expert_parallel managed_gradient_accumulation graph_harvesting log_level disable_python_gc zenflow
mics_shard_size mics_hierarchical_params_gather
""".split())
# zero_optimization keys (DeepSpeedZeroConfig's fields and aliases in 0.19.8): DeepSpeed refuses any other.
ZERO_KEYS = frozenset("""
stage contiguous_gradients reduce_scatter reduce_bucket_size use_multi_rank_bucket_allreduce allgather_partitions
allgather_bucket_size overlap_comm load_from_fp32_weights elastic_checkpoint offload_param offload_optimizer
sub_group_size cpu_offload_param cpu_offload_use_pin_memory cpu_offload prefetch_bucket_size
stage3_prefetch_bucket_size param_persistence_threshold stage3_param_persistence_threshold
model_persistence_threshold stage3_model_persistence_threshold max_live_parameters stage3_max_live_parameters
max_reuse_distance stage3_max_reuse_distance gather_16bit_weights_on_model_save
stage3_gather_16bit_weights_on_model_save stage3_gather_fp16_weights_on_model_save module_granularity_threshold
stage3_module_granularity_threshold use_all_reduce_for_fetch_params stage3_use_all_reduce_for_fetch_params
stage3_allgather_sequential allgather_sequential ignore_unused_parameters legacy_stage1 round_robin_gradients
zero_hpz_partition_size zero_quantized_weights zero_quantized_nontrainable_weights zero_quantized_gradients
memory_efficient_linear pipeline_loading_checkpoint override_module_apply log_trace_cache_warnings
enable_sanity_checks compute_grad_norm leaf_module parameter_alignment save_muon_momentum_buffer_in_memory zenflow
""".split())

# Placeholders for the optimizer: the advisor chooses the layout, not the training recipe.
OPTIMIZER = {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}}
SUPER_OFFLOAD_CPU_CORES_PERC = 0.8  # DeepSpeed's default for cpuadam_cores_perc


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
            "number_checkpoints": int(checkpointed_layers(arch.num_layers, s.checkpoint_every)),
            "synchronize_checkpoint_boundary": False,
            "profile": False,
        }
    return config


@dataclass(frozen=True)
class DsSettings:
    """What a DeepSpeed config says about the strategy; None where it says nothing."""

    fields: dict  # Strategy field -> value (only those the config sets)
    train_batch_size: int | None
    warnings: tuple[str, ...] = ()  # keys DeepSpeed would ignore or refuse


def _get(section: dict, key: str, kind, where: str, default=None):
    if key not in section or section[key] == "auto":  # Hugging Face's "auto": not set here
        return default
    value = section[key]
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:  # 4.0 is 4, as DeepSpeed reads it; an int of any size stays exact
        ok = not isinstance(value, bool) and (
            isinstance(value, int) or (isinstance(value, float) and math.isfinite(value) and value.is_integer()))
        value = int(value) if ok else value
    elif kind is float:
        ok = not isinstance(value, bool) and (
            isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)))
    else:
        ok = isinstance(value, kind)
    if not ok:
        expected = {int: "a whole number", float: "a finite number", bool: "true or false"}.get(kind, kind.__name__)
        raise DsConfigError(f"{where}: bad key '{key}': expected {expected}, got {shown(value)}")
    return value


def _count(section: dict, key: str, where: str, most: int, name: str | None = None):
    """A whole number in 1..most, or None where the section does not set it."""
    value = _get(section, key, int, where)
    if value is not None and not 1 <= value <= most:
        raise DsConfigError(f"{where}: bad key '{name or key}': must be 1..{most:,}, got {shown(value)}")
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
        ratio = _get(opt, "ratio", float, f"{origin} offload_optimizer", 1.0)
        if not 0 < ratio <= 1:
            raise DsConfigError(f"{origin}: bad key 'zero_optimization.offload_optimizer.ratio': must be in (0, 1], "
                                f"got {shown(ratio)}")
        out["offload_ratio"] = float(ratio)
        out["super_offload"] = _get(opt, "super_offload", bool, f"{origin} offload_optimizer", False)
    param = _section(zero, "offload_param", f"{origin} zero_optimization")
    out["offload_param"] = _device(param, "zero_optimization.offload_param", origin)
    overlap = _get(zero, "overlap_comm", bool, f"{origin} zero_optimization")
    if overlap is not None:  # absent: DeepSpeed's default for the final stage (see with_defaults)
        out["overlap_comm"] = overlap
    for key, name in (("reduce_bucket_size", "reduce_bucket_size"), ("allgather_bucket_size", "allgather_bucket_size"),
                      ("stage3_prefetch_bucket_size", "prefetch_bucket_size")):
        value = _count(zero, key, origin, MAX_BUCKET_ELEMENTS, f"zero_optimization.{key}")
        if value is not None:
            out[name] = value
    ckpt = config.get("activation_checkpointing")
    if ckpt is None:
        out["checkpoint_every"], out["cpu_checkpointing"] = 0, False
    else:
        ckpt = _section(config, "activation_checkpointing", origin)
        n = _get(ckpt, "number_checkpoints", int, f"{origin} activation_checkpointing")
        if n is not None and not 1 <= n <= arch.num_layers:
            raise DsConfigError(f"{origin}: bad key 'activation_checkpointing.number_checkpoints': must be "
                                f"1..{arch.num_layers}, got {shown(n)}")
        every = 1 if n is None else min(k for k in range(1, arch.num_layers + 1)
                                        if checkpointed_layers(arch.num_layers, k) <= n)
        out["checkpoint_every"] = every
        out["cpu_checkpointing"] = _get(ckpt, "cpu_checkpointing", bool, f"{origin} activation_checkpointing", False)
    for key, name in (("train_micro_batch_size_per_gpu", "micro_batch"), ("gradient_accumulation_steps", "grad_accum"),
                      ("sequence_parallel_size", "sp")):
        value = _count(config, key, origin, MAX_COUNT)
        if value is not None:
            out[name] = value
    tbs = _count(config, "train_batch_size", origin, MAX_SEQUENCES)
    _refuse_two_precisions(config, origin)
    return DsSettings(fields=out, train_batch_size=tbs, warnings=unknown_keys(config, origin))


def _refuse_two_precisions(config: dict, origin: str) -> None:
    """DeepSpeed refuses fp16 and bf16 enabled together; the model would have counted one of them."""
    enabled = [key for key in ("fp16", "bf16")
               if _get(_section(config, key, origin), "enabled", bool, f"{origin} {key}", False)]
    if len(enabled) == 2:
        raise DsConfigError(f"{origin}: bad keys 'fp16.enabled' and 'bf16.enabled': both true; DeepSpeed trains in "
                            "one of them, enable only one")


def unknown_keys(config: dict, origin: str) -> tuple[str, ...]:
    """One warning per key DeepSpeed 0.19 does not know: ignored at the top level, refused in zero_optimization."""
    out = [f"{origin}: unknown key '{key}': DeepSpeed ignores it (a typo?)"
           for key in sorted(set(config) - DEEPSPEED_KEYS)]
    zero = config.get("zero_optimization")
    if isinstance(zero, dict):
        out += [f"{origin}: unknown key 'zero_optimization.{key}': DeepSpeed refuses the config"
                for key in sorted(set(zero) - ZERO_KEYS)]
    return tuple(out)


def read_ds_config(path: str | Path) -> dict:
    """A ds_config.json's object (JSON or HJSON, as DeepSpeed itself accepts); DsConfigError, naming
    the file, where it cannot be read or holds no object."""
    path = Path(path)
    config = parse_json(read_text(path, DsConfigError), str(path), DsConfigError, hjson_too=True)
    if not isinstance(config, dict):
        raise DsConfigError(f"{path}: a DeepSpeed config is a JSON object, this holds a {type(config).__name__}")
    return dict(config)


def load_ds_config(path: str | Path, arch: Architecture) -> DsSettings:
    """Read a ds_config.json and what it sets."""
    return parse_ds_config(read_ds_config(path), arch, origin=str(path))


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


def batch_sizes(train_batch_size: int, micro_batch: int | None, grad_accum: int | None, dp: int) -> tuple[int, int]:
    """(micro-batch, gradient accumulation) as DeepSpeed sets them from a train_batch_size and what else is
    given (runtime/config.py, _set_batch_related_parameters): train_batch_size = micro-batch x accumulation
    x data-parallel ranks must hold exactly, and DeepSpeed refuses the run where it does not. The advisor
    once rounded instead: 8 sequences became 9 on 3 GPUs, or 16 with --grad-accum 2."""
    given = [(name, value) for name, value in (("micro-batch", micro_batch), ("gradient accumulation", grad_accum))
             if value is not None]
    per_step = dp
    for _, value in given:
        per_step *= value
    if train_batch_size % per_step or (len(given) == 2 and train_batch_size != per_step):
        factors = " x ".join([f"{name} {value}" for name, value in given] + [f"{dp} data-parallel GPUs"])
        verb = "is not" if len(given) == 2 else "does not divide by"
        raise DsConfigError(f"train_batch_size {train_batch_size} {verb} {factors}; DeepSpeed refuses such a config")
    rest = train_batch_size // per_step
    if micro_batch is None:
        return rest, grad_accum or 1
    return micro_batch, grad_accum or rest


def with_defaults(fields: dict) -> dict:
    """DeepSpeed's defaults for what a config leaves out: overlap_comm is on only for ZeRO-3."""
    return {"overlap_comm": fields.get("zero_stage", 0) == 3, **fields}


def strategy_from_ds_config(settings: DsSettings, gpus: int, gpus_per_node: int, base: Strategy | None = None) -> Strategy:
    """The strategy a config describes on `gpus` GPUs; fields it omits come from `base`,
    then from DeepSpeed's defaults; micro-batch and accumulation as DeepSpeed sets them from a
    train_batch_size (`batch_sizes`)."""
    fields = with_defaults(settings.fields)
    if settings.train_batch_size is not None:
        dp = gpus // fields.get("sp", 1)
        fields["micro_batch"], fields["grad_accum"] = batch_sizes(
            settings.train_batch_size, fields.get("micro_batch"), fields.get("grad_accum"), max(dp, 1))
    return replace(base or Strategy(), gpus=gpus, gpus_per_node=gpus_per_node, **fields)
