"""Predicted host memory against the real runs that keep model states or checkpoints on the CPU:
`peak_host_mem_gib` (per node) against the peak resident memory (VmHWM) of the ranks' processes, or,
where a rank has child processes that share its pages (SuperOffload's worker) and the run sampled
it, against their peak proportional set size, which counts a shared page once (column "by": pss).

    python benchmarks/host_memory_accuracy.py [--runs 'data/runs/*.jsonl' ...] [--profile h200]

Host memory decides whether an offload strategy fits the node, so an under-prediction is a host
OOM the advisor would recommend. Runs are grouped by the DeepSpeed path that allocates the memory
(models.host_memory): ZeRO-1/2 offload, ZeRO-3 offload, SuperOffload, CPU checkpointing alone. Runs
whose GPU allocations were recorded are left out: the recording holds host memory of its own.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runs.measured import add_runs_option, gather_records, run_files, to_measured_run  # noqa: E402
from models.predict import predict  # noqa: E402
from models.profile import load_profile  # noqa: E402


def path_of(strategy) -> str | None:
    """The DeepSpeed path that holds this run's host memory; None when it keeps nothing on the CPU."""
    if strategy.offload_optimizer != "none":
        if strategy.super_offload:
            return "SuperOffload"
        return "ZeRO-3 offload" if strategy.zero_stage == 3 else "ZeRO-1/2 offload"
    return "CPU checkpointing" if strategy.cpu_checkpointing else None


def host_memory_groups(paths, profile) -> dict[str, list[tuple[str, float, float, str]]]:
    """(label, measured GiB, predicted GiB, measured by: pss or hwm) of each untraced ok run that keeps
    states on the CPU, by the DeepSpeed path that holds them."""
    groups: dict[str, list[tuple[str, float, float, str]]] = {}
    seen = set()
    for record in gather_records(paths):
        if ((record.key, record.date) in seen or record.result.status != "ok" or not record.result.peak_host_mem_gib
                or record.result.memory_traced):
            continue
        seen.add((record.key, record.date))
        try:
            run = to_measured_run(record)
        except ValueError:
            continue
        path = path_of(run.strategy)
        if path is None:
            continue
        pred = predict(run.workload, run.strategy, profile).peak_host_mem_gib
        pss = record.result.peak_host_mem_pss_gib
        groups.setdefault(path, []).append((run.label, pss or record.result.peak_host_mem_gib, pred,
                                            "pss" if pss else "hwm"))
    return groups


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_runs_option(p)
    p.add_argument("--profile", default="h200")
    args = p.parse_args(argv)
    groups = host_memory_groups(run_files(args.runs), load_profile(args.profile))
    width = max((len(label) for rows in groups.values() for label, *_ in rows), default=10)
    print(f"{'run':<{width}}  {'meas GiB':>8}  {'by':>3}  {'pred GiB':>8}  {'err %':>7}")
    summary = []
    for path, rows in sorted(groups.items()):
        print(f"-- {path}")
        errors = []
        for label, meas, pred, by in sorted(rows):
            errors.append((pred - meas) / meas)
            print(f"{label:<{width}}  {meas:8.2f}  {by:>3}  {pred:8.2f}  {100 * errors[-1]:+7.1f}")
        e = np.array(errors)
        summary.append(f"{path}: {len(e)} runs, MAPE {100 * np.abs(e).mean():.1f}%, "
                       f"from {100 * e.min():+.1f}% to {100 * e.max():+.1f}%")
    print()
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
