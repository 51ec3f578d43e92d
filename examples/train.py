"""A training script measured by the advisor from inside: the two lines marked (*) are all it takes.

    advisor recommend --model tiny-cpu --seq 256 --global-batch 4 --validate 2 \\
        --script "python examples/train.py --model {model} --seq {seq} --deepspeed_config {ds_config}"

The advisor fills in {model}, {seq} and {ds_config} for each candidate, sets OMP_NUM_THREADS, and
starts the script under torchrun when the candidate has several GPUs. Your own script needs only
the meter; this one trains the advisor's reference decoder (any preset or config.json) on random
tokens, with DeepSpeed, so that it runs anywhere, the CPU included.
"""
from __future__ import annotations

import argparse
import json

import deepspeed
import torch

from advisor.monitor import StepMeter  # (*)
from calibration.harness.model import Checkpointing, Transformer
from models.architecture import load_architecture
from models.ds_config import parse_ds_config


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="preset name or config.json")
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--deepspeed_config", required=True)
    p.add_argument("--steps", type=int, default=1000, help="stop here if nobody stops us sooner")
    p.add_argument("--local_rank", "--local-rank", type=int, default=0)
    args = p.parse_args()

    config = json.loads(open(args.deepspeed_config).read())
    cuda = torch.cuda.is_available()
    if not cuda:  # FusedAdam and bf16 need a GPU: the CPU path trains in fp32 with torch's AdamW
        config["optimizer"].setdefault("params", {})["torch_adam"] = True
        config.get("bf16", {})["enabled"] = False
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    arch = load_architecture(args.model)
    fields = parse_ds_config(config, arch).fields
    sp, every = fields.get("sp", 1), fields["checkpoint_every"]
    mpu, wrapper, shard = None, None, slice(0, args.seq + 1)
    if sp > 1:  # Ulysses: each rank of a group holds seq / sp positions
        from deepspeed.runtime.sequence_parallel import parallel_state_sp as mpu
        from deepspeed.sequence.layer import DistributedAttention

        mpu.initialize_sequence_parallel(sp)
        group, rank = mpu.get_sequence_parallel_group(), mpu.get_sequence_parallel_rank()
        wrapper = lambda core: DistributedAttention(core, group, scatter_idx=2, gather_idx=1)  # noqa: E731
        shard = slice(rank * args.seq // sp, (rank + 1) * args.seq // sp + 1)
    checkpointing = Checkpointing(every, deepspeed.checkpointing.checkpoint) if every else Checkpointing()
    if every:
        deepspeed.checkpointing.configure(mpu, deepspeed_config=config)
    model = Transformer(arch, checkpointing=checkpointing, attention_wrapper=wrapper)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config, mpu=mpu)

    generator = torch.Generator().manual_seed(0)  # ranks of a sequence-parallel group share the sample
    sample = torch.randint(0, arch.vocab_size, (engine.train_micro_batch_size_per_gpu(), args.seq + 1),
                           generator=generator)
    tokens = sample[:, shard].to(engine.device)
    offset = shard.start
    meter = StepMeter.from_env()  # (*)
    for _ in range(args.steps):
        for _ in range(engine.gradient_accumulation_steps()):
            loss = engine(tokens[:, :-1], tokens[:, 1:], position_offset=offset)
            engine.backward(loss)
            engine.step()
        meter.step()  # (*) after each optimizer step: under the advisor it ends the script once measured


if __name__ == "__main__":
    main()
