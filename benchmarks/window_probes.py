"""Does a run's host, probed within its measured window, read its step better than the two probes
around the window? One row a run that has both, its step time predicted by the profile three ways.

    python benchmarks/window_probes.py [--runs 'data/runs/*.jsonl' ...] [--profile h200] [--json]

Why: a host-bound step's mean followed probes taken within its window (correlation 0.76-0.90) and
hardly those around it (lab/probe_drift.py, 2026-12-04), and the harness now probes within the
window (`WindowSettings.probe_every_s`). The 16 runs of 2026-12-04 (machines BY and BZ) said the window's
own probes (`runs.record.window_issue_us`) read the host better than the bracketing ones
(`runs.record.bracketing_issue_us`), 3.9% against 8.2%, and the fit and `validate` now take them where a run
has them (`runs.record.probed_issue_us`). Errors are 100 (predicted - measured) / measured,
at the profile's host, at the bracketing probes and at the median of the probes within the window.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from models.predict import predict  # noqa: E402
from models.profile import ProfileError, load_profile  # noqa: E402
from runs.jsonl import read_records  # noqa: E402
from runs.measured import add_runs_option, run_files, to_measured_run  # noqa: E402
from runs.record import bracketing_issue_us, window_issue_us  # noqa: E402

READINGS = ("profile_host", "bracketing_probes", "window_probes")


@dataclass(frozen=True)
class Row:
    label: str
    step_time_s: float
    bracketing_us: float
    window_us: float
    errors_pct: dict[str, float]  # READINGS -> error


def rows(paths, profile) -> list[Row]:
    """Each finished run whose host was probed both around and within its window."""
    out = []
    for path in paths:
        for record in read_records(path):
            probe, stage = record.result.host_probe, record.candidate.zero_stage
            bracketing, window = bracketing_issue_us(probe, stage), window_issue_us(probe)
            if record.result.status != "ok" or not bracketing or not window:
                continue
            run = to_measured_run(record)

            def error(host_profile) -> float:
                return 100.0 * (predict(run.workload, run.strategy, host_profile).step_time_s / run.step_time_s - 1.0)

            errors = {"profile_host": error(profile), "bracketing_probes": error(profile.on_host(bracketing * 1e-6)),
                      "window_probes": error(profile.on_host(window * 1e-6))}
            out.append(Row(run.label, run.step_time_s, bracketing, window, errors))
    return out


def mape(found: list[Row], reading: str) -> float:
    return sum(abs(r.errors_pct[reading]) for r in found) / len(found)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_runs_option(p)
    p.add_argument("--profile", default="h200")
    p.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    args = p.parse_args(argv)
    paths = run_files(args.runs)
    try:
        profile = load_profile(args.profile)
    except ProfileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    found = rows(paths, profile)
    if args.json:
        print(json.dumps({"runs": [asdict(r) for r in found],
                          "mape_pct": {k: mape(found, k) for k in READINGS} if found else None}, indent=1))
        return 0
    if not found:
        print("no run was probed both around and within its window", file=sys.stderr)
        return 1
    width = max(len(r.label) for r in found)
    print(f"{'run':<{width}}  {'step s':>7}  {'around us':>9}  {'within us':>9}  {'profile':>8}  {'around':>8}  {'within':>8}")
    for r in found:
        e = r.errors_pct
        print(f"{r.label:<{width}}  {r.step_time_s:7.3f}  {r.bracketing_us:9.0f}  {r.window_us:9.0f}  "
              f"{e['profile_host']:+8.1f}  {e['bracketing_probes']:+8.1f}  {e['window_probes']:+8.1f}")
    print(f"\n{len(found)} runs, step time MAPE: at the profile's host {mape(found, 'profile_host'):.1f}%, "
          f"at the probes around the window {mape(found, 'bracketing_probes'):.1f}%, "
          f"at the probes within it {mape(found, 'window_probes'):.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
