"""The optimizer step's GPU work per parameter, from real runs timed pass by pass, into a profile.

    python -m calibration.optimizer_step --runs RUNS.jsonl --traces DIR --into models/profiles/h200.json [--out PATH]

DIR holds the runs' phase traces (`ADVISOR_PHASE_TRACE`, `calibration/harness/phase_trace.py`), one
`KEY.json` per run record. For each run that keeps its optimizer on the GPU, the GPU's busy seconds in
the step passes times the profile's HBM bandwidth, over the trainable parameters whose state the rank
owns, is the step's work in bytes per parameter; the median over the runs becomes
`gpu.optimizer_step_bytes_per_param`, its source naming the runs and the spread.

Why from real runs: the step is DeepSpeed's whole optimizer path (gradient norm and clipping, the casts
and copies around FusedAdam, some of it tensor by tensor), not FusedAdam's counted bytes alone; on H200
it kept the GPU busy three times as long as those bytes take (machine AW, 2026-12-03).
"""
from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from calibration import profile_destination
from models.profile import load_profile, parse_profile


@dataclass(frozen=True)
class StepBusy:
    """One traced run's step: its GPU busy seconds and the parameters its rank steps on the GPU."""

    label: str
    busy_s: float
    params_per_rank: float

    def bytes_per_param(self, hbm_bytes_per_s: float) -> float:
        return self.busy_s * hbm_bytes_per_s / self.params_per_rank


def step_busy_s(trace: dict) -> float | None:
    """The GPU's busy seconds in a trace's step passes (all micro-steps'); None without a device clock."""
    busy = [p["gpu_busy_s"] for p in trace["passes"] if p["name"] == "step"]
    if not busy or any(b is None for b in busy):
        return None
    return float(sum(busy))


def traced_steps(run_paths: list[str | Path], traces_dir: str | Path) -> list[StepBusy]:
    """The runs of `run_paths` with a trace in `traces_dir` that step on the GPU (no optimizer offload)."""
    from models.layout import Layout
    from models.params import count_params
    from models.strategy import StrategyBatch
    from runs.jsonl import read_records
    from runs.measured import to_measured_run

    out = []
    for path in run_paths:
        for record in read_records(path):
            trace_path = Path(traces_dir) / f"{record.key}.json"
            if record.result.status != "ok" or not trace_path.exists():
                continue
            run = to_measured_run(record)
            busy = step_busy_s(json.loads(trace_path.read_text()))
            if busy is None or run.strategy.offload_optimizer != "none":
                continue
            layout = Layout.of(StrategyBatch.from_strategies([run.strategy]), count_params(run.workload))
            out.append(StepBusy(run.label, busy, float(layout.trainable_per_rank[0])))
    return out


def with_optimizer_step(profile: str | Path, steps: list[StepBusy], runs_note: str) -> dict:
    """The profile at `profile` with `gpu.optimizer_step_bytes_per_param` measured from `steps`."""
    if not steps:
        raise ValueError(f"{runs_note}: no traced run steps on the GPU (phase traces of runs without optimizer offload)")
    base = load_profile(str(profile))
    hbm = base.gpu.hbm_bandwidth.value
    per_param = sorted(s.bytes_per_param(hbm) for s in steps)
    data = base.model_dump()
    data["gpu"]["optimizer_step_bytes_per_param"] = {
        "value": statistics.median(per_param), "unit": "bytes",
        "source": (f"measured: the median over {len(steps)} runs of {runs_note} (phase traces) of the optimizer step's "
                   f"GPU busy seconds x the profile's HBM bandwidth ({hbm:.4g} bytes/s) per parameter the rank steps "
                   f"(spread {per_param[0]:.0f}-{per_param[-1]:.0f})")}
    parse_profile(data, origin=f"{profile} + {runs_note}")
    return data


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", action="append", required=True, help="run records (JSONL); repeatable")
    p.add_argument("--traces", required=True, help="folder of the runs' phase traces, KEY.json each")
    profile_destination.add_arguments(p)
    args = p.parse_args(argv)
    out = profile_destination.out_path(p, args)
    try:
        steps = traced_steps(args.runs, args.traces)
        data = with_optimizer_step(args.into, steps, ", ".join(Path(r).name for r in args.runs))
        profile_destination.write(data, out)
    except (OSError, ValueError) as exc:  # missing files, no usable run
        raise SystemExit(f"error: {' '.join(str(exc).split())}") from None
    value = data["gpu"]["optimizer_step_bytes_per_param"]["value"]
    print(f"wrote {out}: the optimizer step's GPU work {value:.0f} bytes a parameter ({len(steps)} runs)")


if __name__ == "__main__":
    main()
