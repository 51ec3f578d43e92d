"""Two ranks on the CPU (torch.multiprocessing spawn + gloo): collectives and overlap agree across ranks."""
import os
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from calibration.microbench import collectives, overlap
from calibration.microbench.common import BenchContext, sizes_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _worker(rank, world, store_path, out_dir):
    sys.path.insert(0, ROOT)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    ctx = BenchContext(device=torch.device("cpu"), sizes=sizes_for(True, True), rank=rank, world_size=world,
                       local_rank=rank, local_world_size=world, backend="gloo")
    results = {}
    for item in collectives.items(ctx):
        if item.key.endswith(f"/{2**16}B"):
            results[item.key] = item.run(ctx)
    results["overlap"] = overlap.bench_overlap(ctx, "all_gather")
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory):
    d = tmp_path_factory.mktemp("dist")
    mp.spawn(_worker, args=(2, str(d / "store"), str(d)), nprocs=2, join=True)
    return [torch.load(d / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_every_collective_ran_on_a_group_of_two(two_rank_results):
    r0 = two_rank_results[0]
    ops = {v["op"] for k, v in r0.items() if k.startswith("collective/")}
    assert ops == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}
    for k, v in r0.items():
        if k.startswith("collective/"):
            assert v["group_size"] == 2 and v["time_s"] > 0
            factor = 1.0 if v["op"] == "all_reduce" else 0.5  # nccl-tests: 2(n-1)/n and (n-1)/n at n=2
            assert v["busbw_bytes_per_s"] == pytest.approx(factor * v["algbw_bytes_per_s"], rel=1e-9)


def test_ranks_report_the_slowest_rank_time(two_rank_results):
    r0, r1 = two_rank_results
    for k in r0:
        if k.startswith("collective/"):
            assert r0[k]["time_s"] == r1[k]["time_s"]


def test_overlap_on_two_ranks_has_both_streams_and_same_summary(two_rank_results):
    r0, r1 = two_rank_results
    o0, o1 = r0["overlap"], r1["overlap"]
    assert o0["world_size"] == 2 and len(o0["per_rank"]) == 2
    assert o0["compute_slowdown"] == o1["compute_slowdown"]  # the mean over ranks, on every rank
    assert o0["compute_alone_s"] > 0 and o0["other_alone_s"] > 0
    assert o0["gemm_calls"] >= 2 and o0["partner_calls"] >= 2
