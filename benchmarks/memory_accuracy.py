"""Predicted GPU memory against the real runs: how far `allocated_gpu_mem_gib` is from
torch.cuda.max_memory_allocated (max over ranks) of each shipped run.

    python benchmarks/memory_accuracy.py [--runs 'data/runs/*.jsonl' ...] [--profile h200] [--reserved]

By default it reads every shipped run file, those kept out of the time fit (data/runs/excluded/)
too: their memory is valid.

Allocated is compared with allocated (like with like). `phase` is the moment of the step at
which the model puts the peak (models.memory.MOMENTS). `--reserved` adds the measured
max_memory_reserved against the predicted reserved pool (allocated x (1 + fragmentation), like with
like), and the predicted peak (that pool + the framework's reserve outside it), which is what decides
feasibility. Runs that did not finish are listed, not compared.

`--by-gpus` splits what each run's pool held beyond its kind's fragmentation share (reserved -
allocated x (1 + share), GiB, measured allocated) by the machine the run file names (h200-x1, -x2, ...)
and the run's GPU count: whether steps on more than one GPU hold more than the share, and whether the
same machines' one-GPU steps do (`memory.collective_pool`).

`--held-out` predicts each model's runs' reserved pool with the shares and the collective pool taken
(as `advisor fit` takes them, `models.fit.ProfileFit`) from the other models' runs only: how the
pool's figures do on a model they were not taken from.

`--need FILE` reads a sweep of `lab/memory_cap.py` (each setting uncapped, then its pool capped) and
sets the model's pool beside what each step needed: more than the largest cap it ran out of memory
in, at most the pool it reached under the smallest cap it ran in.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from calibration.harness.memory_cap import UNCAPPED, noted_factor  # noqa: E402
from runs.jsonl import read_records  # noqa: E402
from runs.measured import add_runs_option, gather_records, run_files, to_measured_run  # noqa: E402
from models import flops, memory  # noqa: E402
from models.pool_fit import pool_beyond_share_gib, runs_with_pool as pooled, with_pool_of  # noqa: E402
from models.params import count_params  # noqa: E402
from models.predict import predict  # noqa: E402
from models.profile import ProfileError, load_profile  # noqa: E402
from models.strategy import StrategyBatch  # noqa: E402


def peak_moment(run, profile) -> str:
    """The moment of the step at which the memory model puts this run's peak."""
    b = StrategyBatch.from_strategies([run.strategy])
    w = run.workload
    work = flops.micro_step_work(w, b.micro_batch, b.sp, b.checkpoint_every)
    return memory.estimate(w, count_params(w), work, b, profile).peak_moment(0)


@dataclass(frozen=True)
class Need:
    """What one step needed of its pool (GiB), against the model's pool for it."""

    label: str
    allocated_gib: float  # measured, uncapped
    unconstrained_gib: float  # the reserved pool, uncapped
    more_than_gib: float | None  # the largest cap it ran out of memory in
    at_most_gib: float | None  # the pool it reached under the smallest cap it ran in
    model_pool_gib: float

    @property
    def verdict(self) -> str:
        if self.more_than_gib is not None and self.model_pool_gib <= self.more_than_gib:
            return "short"  # a pool the step was seen not to fit in
        if self.at_most_gib is not None and self.model_pool_gib >= self.at_most_gib:
            return "covers"
        return "open"  # between the two, or no bound on that side


def needs(records, profile) -> list[Need]:
    """Each setting of a cap sweep with an uncapped run: its need bracket and the model's pool."""
    by_key: dict[str, list] = {}
    for r in records:
        if noted_factor(r.notes) is not None:
            by_key.setdefault(r.key, []).append(r)
    out = []
    for runs in by_key.values():
        base = next((r for r in runs if noted_factor(r.notes) == UNCAPPED and r.result.status == "ok"), None)
        if base is None:
            continue
        run = to_measured_run(base)
        capped = [r for r in runs if noted_factor(r.notes) != UNCAPPED]
        ran_out = [noted_factor(r.notes) * r.prediction["allocated_gpu_mem_gib"] for r in capped
                   if r.result.status == "oom" and r.prediction]
        ran = [r.result.peak_gpu_reserved_gib for r in capped if r.result.status == "ok"]
        out.append(Need(run.label, run.peak_gpu_mem_gib, run.peak_gpu_reserved_gib, max(ran_out, default=None),
                        min(ran, default=None), predict(run.workload, run.strategy, profile).reserved_gpu_mem_gib))
    return out


def print_needs(rows: list[Need]) -> None:
    def gib(x):
        return f"{x:8.2f}" if x is not None else f"{'-':>8}"

    width = max(len(r.label) for r in rows)
    print(f"{'setting':<{width}}  {'alloc':>8}  {'pool':>8}  {'needs >':>8}  {'needs <=':>8}  {'model':>8}  verdict")
    for r in rows:
        print(f"{r.label:<{width}}  {gib(r.allocated_gib)}  {gib(r.unconstrained_gib)}  {gib(r.more_than_gib)}  "
              f"{gib(r.at_most_gib)}  {gib(r.model_pool_gib)}  {r.verdict}")
    counts = {v: sum(r.verdict == v for r in rows) for v in ("covers", "open", "short")}
    print(f"{len(rows)} settings: the model's pool covers what {counts['covers']} needed, is short for "
          f"{counts['short']}, open for {counts['open']} (GiB; pool: the reserved pool uncapped)")


def machine_of(path: str | Path) -> str:
    """The machine kind a run file's name gives (h200-x2-...: x2), or the file's stem."""
    found = re.search(r"-(x\d+)", Path(path).name)
    return found.group(1) if found else Path(path).stem


def runs_with_pool(records) -> list:
    """The records that convert to measured runs (`to_measured_run`) and measured a pool beside their
    allocated peak (`models.pool_fit.runs_with_pool`)."""
    runs = []
    for record in records:
        try:
            runs.append(to_measured_run(record))
        except ValueError:
            continue
    return pooled(runs)


def pool_beyond_share(paths, profile) -> dict[tuple[str, int], list[float]]:
    """{(machine kind, GPUs): GiB each run's pool held beyond allocated x (1 + its kind's share) and its
    start-up's blocks}."""
    shares, start_ratio = memory.fragmentation_shares(profile.memory), memory.start_pool_ratio(profile.memory)
    out: dict[tuple[str, int], list[float]] = {}
    for path in paths:
        for run in runs_with_pool(read_records(path)):
            beyond = pool_beyond_share_gib(run, shares, start_ratio)
            out.setdefault((machine_of(path), run.strategy.gpus), []).append(beyond)
    return out


def held_out_by_model(paths, profile) -> list[tuple[float, str]]:
    """(relative error of the predicted reserved pool, label) of every run with a pool, its figures
    taken from the runs of the other models."""
    runs = runs_with_pool(gather_records(paths))
    out = []
    for name in sorted({r.workload.arch.name for r in runs}):
        fold = with_pool_of(profile, [r for r in runs if r.workload.arch.name != name])
        for r in runs:
            if r.workload.arch.name == name:
                predicted = predict(r.workload, r.strategy, fold).reserved_gpu_mem_gib
                out.append((predicted / r.peak_gpu_reserved_gib - 1.0, r.label))
    return out


def print_by_gpus(groups: dict[tuple[str, int], list[float]]) -> None:
    print(f"{'machine':<28}{'GPUs':>5}{'runs':>6}{'median GiB':>12}{'quartiles':>16}")
    for (machine, gpus), extra in sorted(groups.items()):
        q1, q2, q3 = np.quantile(extra, [0.25, 0.5, 0.75])
        print(f"{machine:<28}{gpus:>5}{len(extra):>6}{q2:>+12.2f}{f'{q1:+.2f} {q3:+.2f}':>16}")
    multi = [x for (_, gpus), extra in groups.items() if gpus > 1 for x in extra]
    if multi:
        print(f"\nruns on more than one GPU: {len(multi)}, median {np.median(multi):+.2f} GiB beyond their share "
              "(memory.collective_pool is the fit's median over its own runs)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_runs_option(p)
    p.add_argument("--profile", default="h200")
    p.add_argument("--reserved", action="store_true", help="also show reserved memory and the predicted peak")
    p.add_argument("--by-gpus", action="store_true",
                   help="the pool beyond each run's share, by the machine its file names and its GPU count")
    p.add_argument("--held-out", action="store_true",
                   help="the reserved pool of each model's runs, its figures taken from the other models' runs")
    p.add_argument("--need", type=Path, help="a lab/memory_cap.py sweep: what each step needed against the model")
    args = p.parse_args(argv)

    try:
        profile = load_profile(args.profile)
    except ProfileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.need:
        try:
            rows = needs(read_records(args.need), profile)
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if not rows:
            print(f"error: {args.need} holds no uncapped run of a cap sweep", file=sys.stderr)
            return 2
        print_needs(rows)
        return 0
    rows, skipped = [], []
    paths = run_files(args.runs)
    if args.by_gpus:
        print_by_gpus(pool_beyond_share(paths, profile))
        return 0
    if args.held_out:
        r = np.array([e for e, _ in held_out_by_model(paths, profile)])
        if not len(r):
            print(f"no run with a reserved pool in {', '.join(map(str, paths)) or 'no file'}", file=sys.stderr)
            return 1
        print(f"{len(r)} runs with a pool, each model held out: reserved MAPE {100 * np.abs(r).mean():.1f}%, "
              f"within 10%: {int((np.abs(r) <= 0.10).sum())}, under by more than 10%: {int((r < -0.10).sum())}, "
              f"over by more than 10%: {int((r > 0.10).sum())}")
        return 0
    for record in gather_records(paths):
        try:
            run = to_measured_run(record)
        except ValueError as exc:
            skipped.append(f"{record.candidate.label}: {exc}")
            continue
        if run.peak_gpu_mem_gib is None:
            skipped.append(f"{run.label}: no measured GPU memory")
            continue
        pred = predict(run.workload, run.strategy, profile)
        rows.append((run.label, run.peak_gpu_mem_gib, pred.allocated_gpu_mem_gib, run.peak_gpu_reserved_gib,
                     pred.reserved_gpu_mem_gib, pred.peak_gpu_mem_gib, peak_moment(run, profile)))

    width = max(len(r[0]) for r in rows) if rows else 10
    head = f"{'run':<{width}}  {'meas GiB':>8}  {'pred GiB':>8}  {'err %':>7}  {'phase':<6}"
    if args.reserved:
        head += f"  {'resv GiB':>8}  {'pred GiB':>8}  {'err %':>7}  {'peak GiB':>8}"
    print(head)
    errors, pools = [], []
    for label, meas, pred, resv, pred_resv, peak, phase in rows:
        err = (pred - meas) / meas
        errors.append(err)
        line = f"{label:<{width}}  {meas:8.2f}  {pred:8.2f}  {100 * err:+7.1f}  {phase:<6}"
        if args.reserved and resv:
            pools.append(((pred_resv - resv) / resv, label))
            line += f"  {resv:8.2f}  {pred_resv:8.2f}  {100 * pools[-1][0]:+7.1f}  {peak:8.2f}"
        print(line)
    if errors:
        e = np.abs(np.array(errors))
        worst = int(np.argmax(e))
        print(f"\n{len(errors)} runs: allocated MAPE {100 * e.mean():.1f}%, worst {100 * errors[worst]:+.1f}% "
              f"({rows[worst][0]}), within 10%: {int((e <= 0.10).sum())}/{len(errors)}")
    if pools:
        r = np.array([x for x, _ in pools])
        low = int(np.argmin(r))
        print(f"{len(pools)} runs with reserved memory: predicted reserved against it, MAPE {100 * np.abs(r).mean():.1f}%, "
              f"most under {100 * r[low]:+.1f}% ({pools[low][1]}), within 10%: {int((np.abs(r) <= 0.10).sum())}/{len(r)}")
    for s in skipped:
        print(f"not compared: {s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
