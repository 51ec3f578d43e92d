"""Benchmark the advisor: prediction throughput, `recommend` wall time, Optuna vs exhaustive.

    python benchmarks/bench_advisor.py [--seeds 5] [--repeats 3]

Prints one table. Targets: `advisor recommend --model 7B --seq 32k` end to end in <= 3 s
(a fresh process, as a user runs it), and the Optuna pick's energy within 1% of the
exhaustive optimum at the default trial budget.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from advisor.search import DEFAULT_TRIALS, DEFAULT_TRIALS_GPU_RANGE  # noqa: E402
from advisor.inputs import default_global_batch, parse_seq  # noqa: E402
from advisor.recommend import make_problem  # noqa: E402
from advisor.search import exhaustive_search, optuna_search  # noqa: E402
from models.architecture import load_architecture  # noqa: E402
from models.profile import load_profile  # noqa: E402
from models.workload import Workload  # noqa: E402

# (label, model, seq, gpu counts, workload extras)
SCENARIOS = [
    ("7B 32k, 1 node", "7B", "32k", [4], {}),
    ("13B 4k, 1 node", "13B", "4k", [4], {}),
    ("70B 32k, 16 GPUs", "70B", "32k", [16], {}),
    ("7B 32k, 4-64 GPUs", "7B", "32k", [4, 8, 16, 32, 64], {}),
    ("Qwen2.5-VL-7B 32k, 64 frames", "qwen2.5-vl-7b", "32k", [4], {"frames": 64}),
]
TOKENS = 10**9
SLOWDOWN = 0.10


def problem_for(model, seq_text, counts, extras, profile):
    seq = parse_seq(seq_text)
    workload = Workload(load_architecture(model), seq, **extras)
    return make_problem(workload, profile, counts, default_global_batch(seq), TOKENS)


def throughput(profile) -> tuple[int, float]:
    """Strategies predicted per second by the vectorised model, over the whole 4-64 GPU space."""
    problem = problem_for("7B", "32k", [4, 8, 16, 32, 64], {}, profile)
    batch = problem.space.enumerate(problem.arch)
    problem.evaluate(batch)  # warm up
    best = min(_timed(lambda: problem.evaluate(batch)) for _ in range(5))
    return len(batch), len(batch) / best


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def recommend_wall_s(repeats: int, *extra: str) -> list[float]:
    exe = shutil.which("advisor")
    cmd = [exe] if exe else [sys.executable, "-m", "advisor.cli"]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(cmd + ["recommend", "--model", "7B", "--seq", "32k", *extra], check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return times


def optuna_gap(profile, seeds: int):
    rows = []
    for label, model, seq, counts, extras in SCENARIOS:
        problem = problem_for(model, seq, counts, extras, profile)
        t0 = time.perf_counter()
        exact = exhaustive_search(problem, "energy", SLOWDOWN)
        exact_s = time.perf_counter() - t0
        best_j = exact.candidates.run_energy_j[exact.pick]
        fastest = exact.candidates.run_time_s[exact.pareto[0]]
        gaps, within_cap, optuna_s = [], 0, []
        trials = DEFAULT_TRIALS if len(counts) == 1 else DEFAULT_TRIALS_GPU_RANGE
        for seed in range(seeds):
            t0 = time.perf_counter()
            found = optuna_search(problem, trials, "energy", SLOWDOWN, seed=seed)
            optuna_s.append(time.perf_counter() - t0)
            c = found.candidates
            gaps.append(c.run_energy_j[found.pick] / best_j - 1)
            within_cap += c.run_time_s[found.pick] <= fastest * (1 + SLOWDOWN) * (1 + 1e-9)
        rows.append((label, len(exact.candidates), trials, exact_s, statistics.median(optuna_s), gaps, within_cap))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    profile = load_profile("gh200")
    out = Console()
    out = out if out.is_terminal else Console(width=160)

    n, rate = throughput(profile)
    walls = recommend_wall_s(args.repeats)
    range_walls = recommend_wall_s(args.repeats, "--gpus", "4-64")
    optuna_walls = recommend_wall_s(args.repeats, "--search", "optuna")
    table = Table(title=f"advisor benchmark (profile {profile.describe()})", title_justify="left")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("target", justify="right")
    table.add_row(f"predict_batch over {n:,} strategies (7B 32k, 4-64 GPUs)", f"{rate:,.0f} strategies/s", ">= 100,000/s")
    table.add_row(f"`advisor recommend --model 7B --seq 32k` wall, median of {len(walls)}",
                  f"{statistics.median(walls):.2f} s (min {min(walls):.2f})", "<= 3 s")
    table.add_row("  the same with --gpus 4-64 (8,050 strategies, all predicted)", f"{statistics.median(range_walls):.2f} s", "")
    table.add_row("  the same with --search optuna (600 trials)", f"{statistics.median(optuna_walls):.2f} s", "")
    out.print(table)

    gap_table = Table(title=f"Optuna at the default budget ({args.seeds} seeds) vs exhaustive: least energy within "
                            f"{SLOWDOWN:.0%} of the fastest, run of {TOKENS:.0e} tokens (target: gap <= 1%)",
                      title_justify="left")
    for col in ("scenario", "space", "trials", "exhaustive s", "optuna s", "energy gap median", "gap max",
                "pick within cap"):
        gap_table.add_column(col, justify="left" if col == "scenario" else "right")
    for label, size, trials, exact_s, optuna_s, gaps, within in optuna_gap(profile, args.seeds):
        gap_table.add_row(label, f"{size:,}", str(trials), f"{exact_s:.2f}", f"{optuna_s:.2f}",
                          f"{100 * statistics.median(gaps):+.2f}%", f"{100 * max(gaps):+.2f}%", f"{within}/{len(gaps)}")
    out.print(gap_table)


if __name__ == "__main__":
    main()
