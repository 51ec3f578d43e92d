"""Does the shipped band hold the runs its fit never saw? One row a metric and regime.

    python benchmarks/band_coverage.py [--runs 'data/runs/*.jsonl' ...] [--profile h200] [--json]

The band (`PROFILE.band.json`) claims that 90% of new runs fall inside it; `advisor fit` checks that
claim on its own runs, each held out by fold. Here it is checked on the shipped runs that are not
among the profile's fitted runs (`models.fit.fitted_run_ids`): runs made after the fit, with their
predictions committed first, and runs kept out of it. Each run's log(measured / predicted) against
the band a user's prediction would take:
- step time and GPU energy, predicted at the host its probes measured (as the fit predicts a run),
  in the band of its regime (the share of its step on the host at the profile's own host); runs of
  the files kept out of the time fit (data/runs/excluded/) are left out of these two;
- torch's pool (max_memory_reserved, where torch's allocator ran as by default) in the pool's band,
  from every file: the excluded runs' memory is valid.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from advisor.accuracy import user_host_share  # noqa: E402
from models.band import POOL_METRIC, Band, BandError, MetricBand, load_band  # noqa: E402
from models.fit import fitted_run_ids  # noqa: E402
from models.measured_run import MeasuredRun  # noqa: E402
from models.predict import predict  # noqa: E402
from models.profile import HardwareProfile, ProfileError, load_profile, profile_path  # noqa: E402
from runs.jsonl import RunFileError  # noqa: E402
from runs.measured import EXCLUDED_RUNS, add_runs_option, gather_records, run_files, to_run_set  # noqa: E402


@dataclass(frozen=True)
class Row:
    metric: str  # step_time_s, gpu_energy_j or reserved_gpu_mem_gib
    regime: str  # gpu_bound, host_bound, or "all" (the pool's one band)
    runs: int
    inside: int
    below: int  # measured under the band's low end
    above: int  # over its high end

    @property
    def share(self) -> float:
        return self.inside / self.runs if self.runs else math.nan


def _tally(metric: str, regime: str, band: MetricBand, log_ratios: list[float]) -> Row:
    below = sum(r < band.low_log for r in log_ratios)
    above = sum(r > band.high_log for r in log_ratios)
    return Row(metric, regime, len(log_ratios), len(log_ratios) - below - above, below, above)


def coverage_rows(timed: list[MeasuredRun], pooled: list[MeasuredRun], profile: HardwareProfile, band: Band) -> list[Row]:
    """`timed`: runs whose step time and energy count; `pooled`: runs whose pool counts (those that
    measured one). One row a metric and regime that has runs."""
    ratios: dict[tuple[str, str], list[float]] = {}
    bands: dict[tuple[str, str], MetricBand] = {}  # the band each (metric, regime) is held against
    for run in timed:
        share = user_host_share(run, profile)
        regime, regime_bands = band.regime_for(share) or "all", band.for_share(share)
        p = predict(run.workload, run.strategy, run.on_its_host(profile))
        measured = {"step_time_s": (run.step_time_s, p.step_time_s), "gpu_energy_j": (run.gpu_energy_j, p.gpu_energy_j)}
        for metric, (value, predicted) in measured.items():
            if value:
                bands[metric, regime] = getattr(regime_bands, metric)
                ratios.setdefault((metric, regime), []).append(math.log(value / predicted))
    if band.reserved_gpu_mem_gib is not None:
        for run in pooled:
            p = predict(run.workload, run.strategy, profile)
            bands[POOL_METRIC, "all"] = band.reserved_gpu_mem_gib
            ratios.setdefault((POOL_METRIC, "all"), []).append(math.log(run.peak_gpu_reserved_gib / p.reserved_gpu_mem_gib))
    return [_tally(metric, regime, bands[metric, regime], values) for (metric, regime), values in sorted(ratios.items())]


def unfitted_runs(paths: list[Path], profile: HardwareProfile) -> tuple[list[MeasuredRun], list[MeasuredRun]]:
    """(runs whose time and energy count, runs whose pool counts) among `paths` that the profile was not
    fitted to: the first leave out the files kept out of the time fit."""
    fitted = fitted_run_ids(profile)
    timed_paths = [p for p in paths if Path(p).resolve().parent != EXCLUDED_RUNS.resolve()]
    timed = [r for r in to_run_set(gather_records(timed_paths)).runs if r.run_id not in fitted]
    pooled = [r for r in to_run_set(gather_records(paths)).runs if r.run_id not in fitted and r.peak_gpu_reserved_gib]
    return timed, pooled


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_runs_option(p)
    p.add_argument("--profile", default="h200")
    p.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    args = p.parse_args(argv)
    paths = run_files(args.runs)
    try:
        profile = load_profile(args.profile)
        band, why_not = load_band(profile_path(args.profile), profile.to_json())
        if band is None:
            raise ProfileError(why_not)
        timed, pooled = unfitted_runs(paths, profile)
    except (ProfileError, BandError, RunFileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = coverage_rows(timed, pooled, profile, band)
    if args.json:
        print(json.dumps({"level": band.level, "rows": [{**asdict(r), "share": r.share} for r in rows]}, indent=1))
        return 0
    if not rows:
        print("no shipped run outside the profile's fit to check the band on", file=sys.stderr)
        return 1
    print(f"{band.level:.0%} band of {args.profile} ({band.source}) on runs outside its fit")
    print(f"{'metric':<22} {'regime':<11} {'runs':>5} {'inside':>7} {'share':>6} {'below':>6} {'above':>6}")
    for r in rows:
        print(f"{r.metric:<22} {r.regime:<11} {r.runs:>5} {r.inside:>7} {r.share:>6.0%} {r.below:>6} {r.above:>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
