"""benchmarks/window_probes.py: the runs probed within their window, predicted at the probes around
it and at those within it (the four host-bound runs of machine BY, 2026-12-04)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from models.predict import predict
from models.profile import load_profile
from runs.jsonl import read_records
from runs.measured import to_measured_run
from runs.record import window_issue_us

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "window_probes.py"
RUNS = REPO / "data" / "runs" / "h200-x1-window-probes-2026-12-04.jsonl"


def test_the_window_s_own_probes_are_read_at_their_median_where_two_read_it():
    assert window_issue_us({"issue_us_per_layer_in_window": [100.0, None, 300.0, 140.0]}) == 140.0
    assert window_issue_us({"issue_us_per_layer_in_window": [100.0, None]}) is None  # one reading: not enough
    assert window_issue_us({"issue_us_per_layer": 120.0}) is None  # a run probed only around its window
    assert window_issue_us(None) is None


def test_each_run_is_predicted_at_the_probes_around_and_within_its_window():
    done = subprocess.run([sys.executable, str(SCRIPT), "--runs", str(RUNS), "--json"], capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert len(out["runs"]) == 4
    by_label = {r["label"]: r for r in out["runs"]}
    z3 = by_label["qwen2.5-1.5b 1024 z3 ckpt 1gpu 16thr window-probes"]
    assert z3["bracketing_us"] == pytest.approx((174.0 * 151.6) ** 0.5, rel=0.001)  # the geometric mean around it
    record = next(r for r in read_records(RUNS) if r.candidate.label == z3["label"])
    assert z3["window_us"] == window_issue_us(record.result.host_probe)
    run, profile = to_measured_run(record), load_profile("h200")
    at_window = predict(run.workload, run.strategy, profile.on_host(z3["window_us"] * 1e-6)).step_time_s
    assert z3["errors_pct"]["window_probes"] == pytest.approx(100.0 * (at_window / run.step_time_s - 1.0))
    assert z3["errors_pct"]["window_probes"] != pytest.approx(z3["errors_pct"]["bracketing_probes"], abs=0.5)
    for reading in ("profile_host", "bracketing_probes", "window_probes"):
        mean_abs = sum(abs(r["errors_pct"][reading]) for r in out["runs"]) / 4
        assert out["mape_pct"][reading] == pytest.approx(mean_abs)
    none = subprocess.run([sys.executable, str(SCRIPT), "--runs", str(REPO / "data/runs/h200-x4node.jsonl")],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert none.returncode == 1 and "no run was probed" in none.stderr


def test_an_unknown_profile_is_one_line_not_a_traceback():
    done = subprocess.run([sys.executable, str(SCRIPT), "--profile", "nosuch"], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "unknown profile 'nosuch'" in done.stderr and "Traceback" not in done.stderr
