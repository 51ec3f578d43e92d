"""How many strategy evaluations per second `predict_batch` sustains on this machine.

    python benchmarks/bench_predict.py [--n 100000] [--repeats 5] [--model 7B] [--seq 32768] [--frames 0]

Strategies are drawn at random from the space the advisor searches (ZeRO stage, offload,
checkpointing, sp, micro-batch, accumulation, GPUs), invalid ones included: the model
evaluates those too and marks them infeasible, so they cost the same.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from models.architecture import load_architecture  # noqa: E402
from models.predict import predict, predict_batch  # noqa: E402
from models.profile import load_profile  # noqa: E402
from models.strategy import StrategyBatch  # noqa: E402
from models.workload import Workload  # noqa: E402


def random_batch(n: int, seed: int = 0) -> StrategyBatch:
    rng = np.random.default_rng(seed)
    gpus = rng.choice([1, 2, 4, 8, 16], n)
    stage = rng.integers(0, 4, n)
    opt = rng.integers(0, 2, n)
    return StrategyBatch(
        gpus=gpus,
        gpus_per_node=np.full(n, 4),
        zero_stage=stage,
        offload_optimizer=opt,
        offload_ratio=rng.choice([0.25, 0.5, 1.0], n),
        super_offload=rng.random(n) < 0.3,
        offload_param=(rng.random(n) < 0.2).astype(int),
        checkpoint_every=rng.choice([0, 1, 2, 4], n),
        cpu_checkpointing=rng.random(n) < 0.2,
        sp=rng.choice([1, 2, 4], n),
        micro_batch=rng.choice([1, 2, 4], n),
        grad_accum=rng.choice([1, 2, 4, 8], n),
        overlap_comm=rng.random(n) < 0.8,
        reduce_bucket_size=np.full(n, 500_000_000),
        allgather_bucket_size=np.full(n, 500_000_000),
        prefetch_bucket_size=np.full(n, 50_000_000),
        cpu_threads_per_rank=np.zeros(n, dtype=int),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--model", default="7B")
    ap.add_argument("--seq", type=int, default=32768)
    ap.add_argument("--profile", default="gh200")
    ap.add_argument("--frames", type=int, default=0, help="video frames per sample (vision models)")
    args = ap.parse_args()

    profile = load_profile(args.profile)
    workload = Workload(load_architecture(args.model), args.seq, frames=args.frames)
    batch = random_batch(args.n)
    predict_batch(workload, random_batch(100, seed=1), profile)  # warm up imports and caches

    walls = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        out = predict_batch(workload, batch, profile)
        walls.append(time.perf_counter() - t0)
    one = batch.strategy(0)
    t0 = time.perf_counter()
    for _ in range(200):
        predict(workload, one, profile)
    single = (time.perf_counter() - t0) / 200

    best, median = min(walls), float(np.median(walls))
    print(f"model {workload.arch.name}, seq {args.seq}, {workload.describe_vision()}, profile {args.profile}; "
          f"{int(out.feasible.sum())} of {args.n} feasible")
    print(f"{'call':<28}{'strategies':>12}{'wall s (median)':>18}{'wall s (best)':>16}{'evals/s (median)':>18}")
    print(f"{'predict_batch':<28}{args.n:>12,}{median:>18.3f}{best:>16.3f}{args.n / median:>18,.0f}")
    print(f"{'predict (one strategy)':<28}{1:>12}{single:>18.5f}{single:>16.5f}{1 / single:>18,.0f}")


if __name__ == "__main__":
    main()
