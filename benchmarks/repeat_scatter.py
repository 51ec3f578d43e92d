"""How far one setting's measured step time scatters when it is measured again: the floor under any
model's error on a single run.

    python benchmarks/repeat_scatter.py [--runs 'data/runs/*.jsonl'] [--profile h200] [--keep-chosen] [--json]

Each measurement is set against the profile's prediction on the host its own probes measured
(`MeasuredRun.on_its_host`), so the host speeds the probes see are taken out; what is left is what a
model of the setting cannot know. For every setting measured more than once (`run_identity`), the
log step times' deviations from the setting's mean are pooled into one standard deviation, apart for
GPU-bound and host-bound steps (`models.band.regime_of` at the profile's host), across leases and
within one lease (a closed loop's interleaved rounds). If every run scattered so, a model exact on
average would still miss a single run by about 0.8 times that (the mean absolute deviation of a
normal spread), and the worst of the regime's N runs here by the median of the largest of N such draws
(`worst_of`): the floor under a worst-case target met on single runs. Sweeps that re-measured settings because they fitted worst or to study the host's
noise (`CHOSEN_FOR_NOISE`) are left out unless --keep-chosen: they would bias the figure up. Beside it,
the same runs' raw step times: how much the host probes take out.
"""
from __future__ import annotations

import argparse
import glob
import json
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table
from scipy.stats import norm

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from models.band import regime_of  # noqa: E402
from models.predict import predict  # noqa: E402
from models.profile import load_profile  # noqa: E402
from runs.measured import (gather_records, lease_of, run_identity, timed_on_their_hosts,  # noqa: E402
                           to_measured_run, unique_records)

# Run files whose settings were measured again because they fitted worst, or to study the host's noise.
CHOSEN_FOR_NOISE = ("rebracket", "host-variance", "host-noise", "zero3-lease", "zero3-process", "window-probes-2")
MEAN_ABS_OVER_SD = 0.8  # E|x - mu| / sd of a normal spread


@dataclass(frozen=True)
class Scatter:
    """Pooled scatter of the repeated settings of one regime and scope."""

    regime: str
    scope: str
    settings: int
    measurements: int
    sd_log: float
    sd_log_raw: float  # the same runs' measured step times, no host taken out
    regime_runs: int  # every run of the regime here, measured again or not: the N of `worst_of`


def log_residuals(paths: list[str], profile) -> dict[tuple[str, str], list[tuple[str, float]]]:
    """{(setting, regime): [(lease, log(measured / predicted on its probed host), log measured), ...]}."""
    out = defaultdict(list)
    for record in timed_on_their_hosts(unique_records(gather_records(paths))):
        try:
            run = to_measured_run(record)
        except (ValueError, KeyError, TypeError):  # unusable for the fit as well (runs.measured.to_run_set)
            continue
        regime = regime_of(predict(run.workload, run.strategy, profile).host_share)
        predicted = predict(run.workload, run.strategy, run.on_its_host(profile)).step_time_s
        lease = lease_of(record) or record.date[:13]  # a run that names no lease: the hour it ran
        out[(run_identity(record), regime)].append((lease, float(np.log(run.step_time_s / predicted)),
                                                     float(np.log(run.step_time_s))))
    return out


def pooled(groups: list[list[float]]) -> tuple[int, int, float]:
    """(settings, measurements, pooled standard deviation) of groups of two or more values."""
    groups = [np.asarray(g) for g in groups if len(g) >= 2]
    dof = sum(len(g) - 1 for g in groups)
    if not dof:
        return 0, 0, float("nan")
    ss = sum(float(np.sum((g - g.mean()) ** 2)) for g in groups)
    return len(groups), sum(len(g) for g in groups), float(np.sqrt(ss / dof))


def worst_of(sd_log: float, runs: int) -> float:
    """The median of the largest |measured / true - 1| among `runs` runs whose log scatters normally by
    `sd_log` around the truth: what a model exact on average shows as its worst error on them."""
    if runs < 1:
        return float("nan")
    return float(np.expm1(sd_log * norm.ppf((1.0 + 0.5 ** (1.0 / runs)) / 2.0)))


def scatter(residuals: dict) -> list[Scatter]:
    rows = []
    for regime in ("gpu_bound", "host_bound"):
        mine = [v for (_, r), v in residuals.items() if r == regime]
        within = [[x for x in v if x[0] == lease] for v in mine for lease in {x[0] for x in v}]
        for scope, groups in (("across leases", mine), ("within one lease", within)):
            n, m, sd = pooled([[x[1] for x in g] for g in groups])
            rows.append(Scatter(regime, scope, n, m, sd, pooled([[x[2] for x in g] for g in groups])[2],
                                sum(len(v) for v in mine)))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", default=str(REPO / "data/runs/*.jsonl"), help="glob of run files")
    p.add_argument("--profile", default="h200", help="shipped profile name or JSON path (default h200)")
    p.add_argument("--keep-chosen", action="store_true", help="keep the sweeps chosen for their noise")
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = p.parse_args(argv)
    paths = sorted(x for x in glob.glob(args.runs) if args.keep_chosen or not any(c in x for c in CHOSEN_FOR_NOISE))
    if not paths:
        print(f"repeat_scatter: no run files match {args.runs}", file=sys.stderr)
        return 1
    try:
        profile = load_profile(args.profile)
    except (OSError, ValueError) as exc:
        print(f"repeat_scatter: {exc}", file=sys.stderr)
        return 1
    rows = scatter(log_residuals(paths, profile))
    if args.json:
        print(json.dumps({"run_files": paths, "rows": [{**asdict(r), "sd_log": None if not r.settings else r.sd_log,
                                                       "sd_log_raw": None if not r.settings else r.sd_log_raw,
                                                       "floor_mape": None if not r.settings else MEAN_ABS_OVER_SD * r.sd_log,
                                                       "floor_worst": None if not r.settings else worst_of(r.sd_log, r.regime_runs)}
                                                      for r in rows]}))
        return 0
    table = Table(title=f"one setting measured again, step time at each run's probed host ({len(paths)} run files)")
    for col in ("regime", "scope", "settings", "measurements", "sd of log time", "raw (no host taken out)",
                "floor on one run (MAPE)", "floor on the worst of the regime's runs"):
        table.add_column(col, justify="left" if col in ("regime", "scope") else "right")
    for row in rows:
        table.add_row(row.regime, row.scope, str(row.settings), str(row.measurements),
                      "-" if not row.settings else f"{row.sd_log:.3f}",
                      "-" if not row.settings else f"{row.sd_log_raw:.3f}",
                      "-" if not row.settings else f"{MEAN_ABS_OVER_SD * row.sd_log:.1%}",
                      "-" if not row.settings else f"{worst_of(row.sd_log, row.regime_runs):.0%} of {row.regime_runs}")
    Console(width=160).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
