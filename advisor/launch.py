"""The launch line for a recommended strategy: DeepSpeed's launcher, or torchrun.

Also the notes a training script needs for the strategy to happen at all: DeepSpeed turns
on Ulysses and checkpointing only where the model's code asks for them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from models.strategy import Strategy


@dataclass(frozen=True)
class Launch:
    deepspeed: str  # the `deepspeed` launcher line (run once, on the first node)
    torchrun: str  # the torchrun line (run on every node)
    hostfile: str | None  # hostfile for the deepspeed launcher; None on one node
    notes: list[str] = field(default_factory=list)


def launch(strategy: Strategy, threads_per_rank: int, config_path: str = "ds_config.json",
           script: str = "train.py") -> Launch:
    """Lines that run `strategy` as predicted: with `threads_per_rank` CPU threads in every rank.
    torchrun sets OMP_NUM_THREADS=1 when it starts several processes, and the DeepSpeed launcher sets
    nothing (every rank then takes every core): either way CPU offload runs several times slower
    than predicted, so the lines set the count."""
    s = strategy
    per_node = s.ranks_per_node
    args = f"{script} --deepspeed --deepspeed_config {config_path}"
    omp = f"OMP_NUM_THREADS={threads_per_rank}"
    if s.nodes == 1:
        ds = f"{omp} deepspeed --num_gpus {per_node} {args}"
        tr = f"{omp} torchrun --standalone --nproc_per_node {per_node} {args}"
        hostfile = None
    else:
        ds = f"deepspeed --hostfile hostfile --num_nodes {s.nodes} --num_gpus {per_node} {args}"
        tr = (f"{omp} torchrun --nnodes {s.nodes} --nproc_per_node {per_node} --rdzv_backend c10d "
              f"--rdzv_endpoint $MASTER_ADDR:29500 {args}")
        hostfile = "\n".join(f"node{i + 1} slots={per_node}" for i in range(s.nodes))
    notes = []
    if s.nodes > 1:
        notes.append(f"the deepspeed launcher passes no OMP_NUM_THREADS to other nodes: run "
                     f"`echo {omp} >> .deepspeed_env` first (read on every node)")
    if s.sp > 1:
        notes.append(
            f"Ulysses sp={s.sp}: wrap the core attention in deepspeed.sequence.layer.DistributedAttention and pass "
            f"parallel_state_sp.initialize_sequence_parallel({s.sp}) as mpu= to deepspeed.initialize"
        )
    if s.checkpoint_every:
        which = "every layer" if s.checkpoint_every == 1 else f"one layer in every {s.checkpoint_every}"
        notes.append(f"activation checkpointing: call deepspeed.checkpointing.checkpoint on {which}")
    if s.super_offload:
        notes.append("SuperOffload spawns CPU-optimizer workers: guard the script with if __name__ == '__main__':")
    return Launch(ds, tr, hostfile, notes)
