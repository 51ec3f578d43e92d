"""Ulysses through DeepSpeed's DistributedAttention on gloo: two ranks, each with half the
sequence, compute the same loss and gradients as one rank with all of it. This checks the
harness's wiring (layout, RoPE offsets, GQA head split, vision groups across the shard border),
not DeepSpeed."""
from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp
from harness_helpers import TINY_VL

pytestmark = pytest.mark.slow


def _worker(rank: int, rendezvous: str, config: dict, vision: dict, out):
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    torch.set_num_threads(1)  # two ranks on a shared 2-core machine
    import deepspeed
    from deepspeed import comm as dist
    from deepspeed.runtime.sequence_parallel import parallel_state_sp as mpu
    from deepspeed.sequence.layer import DistributedAttention

    from calibration.harness.data import make_batch
    from calibration.harness.model import Transformer
    from models.architecture import architecture_from_config
    from models.workload import Workload

    # A file rendezvous: no TCP port to lose to another process on a shared machine.
    deepspeed.init_distributed(dist_backend="gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2,
                               auto_mpi_discovery=False)
    mpu.initialize_sequence_parallel(2)
    group = mpu.get_sequence_parallel_group()
    arch = architecture_from_config(config, "tiny")
    workload = Workload(arch, 64, **vision)
    torch.manual_seed(0)
    full = Transformer(arch, image_size=vision.get("image_size"))
    torch.manual_seed(0)
    sharded = Transformer(arch, image_size=vision.get("image_size"),
                          attention_wrapper=lambda core: DistributedAttention(core, group, scatter_idx=2, gather_idx=1))
    cpu = torch.device("cpu")
    whole = make_batch(workload, 2, 1, 0, 0, cpu, torch.float32)
    mine = make_batch(workload, 2, 2, rank, 0, cpu, torch.float32)

    full_loss = full(**whole.as_kwargs())
    full_loss.backward()
    local = sharded(**mine.as_kwargs())
    (local / 2).backward()  # each shard holds half the tokens
    loss = local.detach().clone()
    dist.all_reduce(loss)
    for p in sharded.parameters():
        dist.all_reduce(p.grad)  # what ZeRO's reduction over the sequence-data-parallel group does
    if rank == 0:
        pairs = zip(full.parameters(), sharded.parameters(), strict=True)
        worst = max((a.grad - b.grad).abs().max().item() for a, b in pairs)
        out.put({"full": full_loss.item(), "sharded": loss.item() / 2, "grad_diff": worst,
                 "vision_groups": mine.vision_groups})
    dist.barrier()
    # Leaving with the process group alive aborted a rank about one time in three at exit ("terminate
    # called without an active exception", SIGABRT) after both had finished.
    dist.destroy_process_group()


def test_two_sequence_shards_give_the_loss_and_gradients_of_one(tmp_path):
    # Video: 3 groups of 16 tokens at 0, 21, 42; the one at 21 straddles the shard border at 32.
    # Text attention, RoPE offsets and GQA are exercised on the same run.
    config, vision = TINY_VL, {"frames": 6, "image_size": 32}
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    rendezvous = str(tmp_path / "rendezvous")
    mp.start_processes(_worker, args=(rendezvous, config, vision, out), nprocs=2, join=True, start_method="spawn")
    got = out.get()
    assert abs(got["full"] - got["sharded"]) < 1e-4, got
    assert got["grad_diff"] < 1e-4, got
    assert got["vision_groups"] == 4  # per sample, rank 0 encodes its own group and the straddling one
