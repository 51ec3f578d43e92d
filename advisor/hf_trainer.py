"""The recommendation for the Hugging Face Trainer (`recommend --for hf`): the DeepSpeed config
with "auto" where TrainingArguments owns the value, and the TrainingArguments that realise the layout.

The Trainer fills every "auto" from its TrainingArguments and refuses a config whose values differ
from them (`HfTrainerDeepSpeedConfig.trainer_config_process`): a plain DeepSpeed config failed it on
batch size, learning rate, betas, weight decay and bf16. So the training recipe (learning rate, betas,
clipping, schedule) stays with TrainingArguments, and the layout's batch sizes, precision and
checkpointing are said as TrainingArguments. The Trainer checkpoints every layer or none
(`gradient_checkpointing`, torch's own checkpoint, never in host memory) and runs no Ulysses without
accelerate's ParallelismConfig, so `trainer_space` searches only what it runs.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass, replace

AUTO = "auto"
# What TrainingArguments sets (transformers' trainer_config_process and trainer_config_finalize).
TRAINER_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                "gradient_clipping")
TRAINER_OPTIMIZER_PARAMS = ("lr", "betas", "eps", "weight_decay")
TRAINER_SCHEDULER_PARAMS = ("warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "total_num_steps")
HF_DEFAULT_MAX_GRAD_NORM = 1.0
PLACEHOLDER = "{training_args}"  # in --script: the candidate's TrainingArguments as command-line flags
TRAINER_CHECKPOINTING = ("none", "full")
TRAINER_SPACE_NOTE = ("--for hf: searched what the Trainer runs: gradient checkpointing of every layer or none (no "
                      "CPU checkpointing, no every-K), and sp 1 (the Trainer runs Ulysses only through accelerate's "
                      "ParallelismConfig, not offered here)")


class TrainerScriptError(ValueError):
    """A --script that names {training_args} where nothing fills it."""


@dataclass(frozen=True)
class TrainingArgs:
    """The TrainingArguments the layout needs; everything else (learning rate, epochs, output_dir) is the
    user's, and the config takes it from them."""

    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    bf16: bool
    gradient_checkpointing: bool
    deepspeed: str  # the config's path
    max_grad_norm: float | None = None  # only where the layout needs other than HF's 1.0 (SuperOffload: 0)

    def kwargs(self) -> dict:
        out = {"per_device_train_batch_size": self.per_device_train_batch_size,
               "gradient_accumulation_steps": self.gradient_accumulation_steps, "bf16": self.bf16,
               "gradient_checkpointing": self.gradient_checkpointing}
        if self.max_grad_norm is not None:
            out["max_grad_norm"] = self.max_grad_norm
        return {**out, "deepspeed": self.deepspeed}

    def python(self) -> str:
        """`TrainingArguments(...)` as code to paste."""
        body = "".join(f"    {k}={v!r},\n" for k, v in self.kwargs().items())
        return f"TrainingArguments(\n{body}    # and your own: output_dir, learning_rate, num_train_epochs, ...\n)"

    def layout_flags(self) -> list[str]:
        """The layout as flags of a script that reads TrainingArguments from its command line
        (HfArgumentParser), the config's path left out: booleans as bare flags when on."""
        out = []
        for key, value in self.kwargs().items():
            if key == "deepspeed" or value is False:
                continue
            out += [f"--{key}"] if value is True else [f"--{key}", str(value)]
        return out


def trainer_space(space):
    """The search space cut to what the Trainer runs (see the module docstring)."""
    return replace(space, sp=(1,), checkpointing=tuple(c for c in space.checkpointing if c in TRAINER_CHECKPOINTING))


def for_trainer(config: dict, strategy, config_path: str) -> tuple[dict, TrainingArgs]:
    """`config` (models.ds_config.to_ds_config of `strategy`) with "auto" where TrainingArguments
    owns the value, and those TrainingArguments, read from `config` itself."""
    assert strategy.sp == 1 and strategy.checkpoint_every in (0, 1) and not strategy.cpu_checkpointing, \
        f"{strategy.label()} is outside trainer_space"
    clip = config.get("gradient_clipping", HF_DEFAULT_MAX_GRAD_NORM)
    args = TrainingArgs(
        per_device_train_batch_size=config["train_micro_batch_size_per_gpu"],
        gradient_accumulation_steps=config["gradient_accumulation_steps"],
        bf16=bool(config.get("bf16", {}).get("enabled")), gradient_checkpointing=strategy.checkpoint_every == 1,
        deepspeed=config_path, max_grad_norm=None if clip == HF_DEFAULT_MAX_GRAD_NORM else clip)
    out = copy.deepcopy(config)
    for key in TRAINER_KEYS:
        out[key] = AUTO
    for section in ("bf16", "fp16"):
        if section in out:
            out[section]["enabled"] = AUTO
    for section, keys in (("optimizer", TRAINER_OPTIMIZER_PARAMS), ("scheduler", TRAINER_SCHEDULER_PARAMS)):
        params = out.get(section, {}).get("params", {})
        for key in keys:
            if key in params:
                params[key] = AUTO
    # The Trainer checkpoints through torch (gradient_checkpointing); DeepSpeed's section acts only where
    # the model calls deepspeed.checkpointing.checkpoint, which a transformers model does not.
    out.pop("activation_checkpointing", None)
    return out, args


_PLACEHOLDER_RE = re.compile(r"(?<!\{)\{training_args\}(?!\})")


def fill_training_args(template: str, flags: list[str] | None) -> str:
    """`template` with {training_args} replaced by `flags`; None: not for the Trainer, where the
    placeholder is a mistake."""
    if not _PLACEHOLDER_RE.search(template):
        return template
    if flags is None:
        raise TrainerScriptError("--script names {training_args}, the Trainer's flags: add --for hf")
    return _PLACEHOLDER_RE.sub(" ".join(flags), template)
