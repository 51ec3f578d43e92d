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


def launch(strategy: Strategy, config_path: str = "ds_config.json", script: str = "train.py") -> Launch:
    s = strategy
    per_node = min(s.gpus, s.gpus_per_node)
    args = f"{script} --deepspeed --deepspeed_config {config_path}"
    if s.nodes == 1:
        ds = f"deepspeed --num_gpus {per_node} {args}"
        tr = f"torchrun --standalone --nproc_per_node {per_node} {args}"
        hostfile = None
    else:
        ds = f"deepspeed --hostfile hostfile --num_nodes {s.nodes} --num_gpus {per_node} {args}"
        tr = (f"torchrun --nnodes {s.nodes} --nproc_per_node {per_node} --rdzv_backend c10d "
              f"--rdzv_endpoint $MASTER_ADDR:29500 {args}")
        hostfile = "\n".join(f"node{i + 1} slots={per_node}" for i in range(s.nodes))
    notes = []
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
