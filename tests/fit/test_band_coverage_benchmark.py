"""benchmarks/band_coverage.py: the shipped band against runs outside the profile's fit."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from models.band import Band

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "band_coverage.py"


def _module():
    spec = importlib.util.spec_from_file_location("band_coverage", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_each_run_is_counted_inside_below_or_above_the_band_of_its_metric(all_runs, base):
    """Runs measured at exactly the prediction x e^r: r inside the band's [low, high] counts inside,
    under it below, over it above; a run without energy counts for time only; the pool has one band."""
    from models.predict import predict

    coverage = _module()
    ratios = [-0.3, -0.05, 0.0, 0.05, 0.3]
    runs = []
    for run, r in zip(all_runs, ratios):
        p = predict(run.workload, run.strategy, run.on_its_host(base))
        pool = predict(run.workload, run.strategy, base).reserved_gpu_mem_gib
        runs.append(dataclasses.replace(run, step_time_s=p.step_time_s * math.exp(r), gpu_energy_j=None,
                                        peak_gpu_reserved_gib=pool * math.exp(r)))
    band = Band.from_residuals({"step_time_s": [-0.1, 0.1] * 20, "gpu_energy_j": [-0.1, 0.1] * 20,
                                "reserved_gpu_mem_gib": [-0.1, 0.1] * 20}, "{}", source="test")
    rows = {(r.metric, r.regime): r for r in coverage.coverage_rows(runs, runs[:4], base, band)}
    assert set(rows) == {("step_time_s", "all"), ("reserved_gpu_mem_gib", "all")}  # no energy; no regimes in this band
    time, pool = rows["step_time_s", "all"], rows["reserved_gpu_mem_gib", "all"]
    assert (time.runs, time.inside, time.below, time.above) == (5, 3, 1, 1)
    assert (pool.runs, pool.inside, pool.below, pool.above) == (4, 3, 1, 0)
    assert pool.share == pytest.approx(0.75)


def test_the_shipped_band_is_checked_on_the_shipped_runs_outside_its_fit():
    done = subprocess.run([sys.executable, str(SCRIPT), "--json"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    rows = {(r["metric"], r["regime"]): r for r in out["rows"]}
    assert rows["reserved_gpu_mem_gib", "all"]["runs"] >= 78  # the shipped runs outside h200's fit, 2026-12-04
    assert all(r["inside"] + r["below"] + r["above"] == r["runs"] for r in out["rows"])


def test_an_unknown_profile_is_one_line_not_a_traceback():
    done = subprocess.run([sys.executable, str(SCRIPT), "--profile", "nosuch"], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "Traceback" not in done.stderr
