"""The launch line for a recommended strategy: DeepSpeed's launcher, or torchrun, starting the
user's script (`--script`, filled in for the pick) or `train.py`.

Also the notes a training script needs for the strategy to happen at all: DeepSpeed turns
on Ulysses and checkpointing only where the model's code asks for them.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from models.strategy import Strategy

DEFAULT_SCRIPT = "train.py"


@dataclass(frozen=True)
class Launch:
    deepspeed: str  # the `deepspeed` launcher line (run once, on the first node), or the script's own line
    torchrun: str | None  # the torchrun line (run on every node); None where the script brings its own launcher
    hostfile: str | None  # hostfile for the deepspeed launcher; None on one node
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Program:
    """What the launcher starts: a Python script and its arguments, or (`own_launcher`) a whole
    command that starts its ranks itself (`deepspeed --num_gpus 2 train.py ...`, a shell script)."""

    line: str
    own_launcher: bool = False


def default_program(config_path: str, trainer_flags: list[str] | None = None) -> Program:
    """`train.py` taking the config as DeepSpeed's own flags do, or, for the Trainer (`trainer_flags`:
    advisor.hf_trainer.TrainingArgs.layout_flags), as TrainingArguments' --deepspeed and its flags."""
    args = ["--deepspeed", "--deepspeed_config", config_path] if trainer_flags is None else [
        "--deepspeed", config_path, *trainer_flags]
    return Program(shlex.join([DEFAULT_SCRIPT, *args]))


def script_program(template: str, config_path: str, strategy: Strategy, model: str, seq_len: int,
                   trainer_flags: list[str] | None = None) -> Program:
    """The user's --script filled in for `strategy`, as the validation runs fill it
    (calibration.harness.runner.script_command): one that starts with python runs under the launcher."""
    from advisor.hf_trainer import fill_training_args
    from calibration.harness.runner import script_words

    words = script_words(fill_training_args(template, trainer_flags), config_path, strategy.gpus, model, seq_len)
    if Path(words[0]).name.startswith("python"):
        return Program(shlex.join(words[1:]))
    return Program(shlex.join(words), own_launcher=True)


def launch(strategy: Strategy, threads_per_rank: int, program: Program, trainer: bool = False) -> Launch:
    """Lines that run `strategy` as predicted: with `threads_per_rank` CPU threads in every rank.
    torchrun sets OMP_NUM_THREADS=1 when it starts several processes, and the DeepSpeed launcher sets
    nothing (every rank then takes every core): either way CPU offload runs several times slower
    than predicted, so the lines set the count. `trainer`: the Trainer's TrainingArguments realise
    checkpointing, so no note asks the model's code for it."""
    s = strategy
    per_node = s.ranks_per_node
    args = program.line
    omp = f"OMP_NUM_THREADS={threads_per_rank}"
    notes = []
    if program.own_launcher:
        ds, tr, hostfile = f"{omp} {args}", None, None
        notes.append(f"your --script starts its own ranks: it must start {s.gpus} ({per_node} a node)")
    elif s.nodes == 1:
        ds = f"{omp} deepspeed --num_gpus {per_node} {args}"
        tr = f"{omp} torchrun --standalone --nproc_per_node {per_node} {args}"
        hostfile = None
    else:
        ds = f"deepspeed --hostfile hostfile --num_nodes {s.nodes} --num_gpus {per_node} {args}"
        tr = (f"{omp} torchrun --nnodes {s.nodes} --nproc_per_node {per_node} --rdzv_backend c10d "
              f"--rdzv_endpoint $MASTER_ADDR:29500 {args}")
        hostfile = "\n".join(f"node{i + 1} slots={per_node}" for i in range(s.nodes))
    if s.nodes > 1 and not program.own_launcher:
        notes.append(f"the deepspeed launcher passes no OMP_NUM_THREADS to other nodes: run "
                     f"`echo {omp} >> .deepspeed_env` first (read on every node)")
    if s.sp > 1:
        notes.append(
            f"Ulysses sp={s.sp}: wrap the core attention in deepspeed.sequence.layer.DistributedAttention and pass "
            f"parallel_state_sp.initialize_sequence_parallel({s.sp}) as mpu= to deepspeed.initialize"
        )
    if trainer and not program.own_launcher:
        notes.append("the flags after the config are TrainingArguments for a script that reads them from its command "
                     "line (HfArgumentParser); one that builds TrainingArguments in code sets them as above")
    if s.checkpoint_every and not trainer:
        which = "every layer" if s.checkpoint_every == 1 else f"one layer in every {s.checkpoint_every}"
        notes.append(f"activation checkpointing: call deepspeed.checkpointing.checkpoint on {which}")
    if s.super_offload:
        notes.append("SuperOffload spawns CPU-optimizer workers: guard the script with if __name__ == '__main__':")
    return Launch(ds, tr, hostfile, notes)
