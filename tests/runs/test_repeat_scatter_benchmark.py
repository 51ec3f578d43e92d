"""benchmarks/repeat_scatter.py: the pooled scatter of settings measured again, within and across
leases, on the shipped runs; one line for bad input."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "repeat_scatter.py"
sys.path.insert(0, str(REPO / "benchmarks"))

from repeat_scatter import log_residuals, pooled, scatter, worst_of  # noqa: E402

from models.profile import load_profile  # noqa: E402


def test_pooling_weighs_each_setting_by_its_degrees_of_freedom_and_skips_single_measurements():
    settings, measurements, sd = pooled([[0.0, 0.2], [1.0, 1.0, 1.3], [5.0]])
    assert (settings, measurements) == (2, 5)
    ss = 0.02 + (0.01 + 0.01 + 0.04)  # squared deviations from each setting's own mean
    assert sd == pytest.approx(np.sqrt(ss / 3))
    assert np.isnan(pooled([[1.0]])[2])


def test_within_one_lease_compares_only_measurements_of_the_same_lease():
    residuals = {("a", "host_bound"): [("L1", 0.0, -1.0), ("L1", 0.1, -0.7), ("L2", 0.5, 0.0)],
                 ("b", "gpu_bound"): [("L1", 0.0, 1.0), ("L2", 0.02, 1.0)]}
    rows = {(r.regime, r.scope): r for r in scatter(residuals)}
    within = rows[("host_bound", "within one lease")]
    assert (within.settings, within.measurements) == (1, 2) and within.sd_log == pytest.approx(np.sqrt(0.005))
    assert within.sd_log_raw == pytest.approx(np.sqrt(0.045))  # the raw times, no host taken out
    assert rows[("host_bound", "across leases")].measurements == 3
    assert rows[("gpu_bound", "within one lease")].settings == 0  # its two measurements ran on two leases
    assert rows[("host_bound", "within one lease")].regime_runs == 3  # every run of the regime: worst_of's N


def test_the_worst_of_n_runs_is_the_median_of_their_largest_deviation():
    """One run: its median |error| is 0.674 sd; the worst of 222 runs (the shipped fit's host-bound ones)
    at sd 0.1 comes to about 3 sd; a sample of that many normal draws agrees."""
    assert worst_of(0.1, 1) == pytest.approx(np.expm1(0.1 * 0.6745), rel=1e-3)
    assert worst_of(0.1, 222) == pytest.approx(np.expm1(0.1 * 2.955), rel=2e-3)
    assert worst_of(0.1, 222) > worst_of(0.1, 94) > worst_of(0.1, 1) and np.isnan(worst_of(0.1, 0))
    rng = np.random.default_rng(0)
    largest = np.abs(rng.normal(0.0, 0.1, size=(4001, 222))).max(axis=1)
    assert np.expm1(np.median(largest)) == pytest.approx(worst_of(0.1, 222), rel=0.02)


def test_the_shipped_loop_rounds_give_each_repeated_setting_its_lease():
    rounds = str(REPO / "data" / "runs" / "h200-x1-loop-rounds-2026-12-02.jsonl")
    residuals = log_residuals([rounds], load_profile("h200"))
    repeated = [v for v in residuals.values() if len(v) >= 2]
    assert repeated and all(len({lease for lease, _, _ in v}) == 1 for v in repeated)  # one machine, AI
    assert all(abs(x) < 1.0 for v in residuals.values() for _, x, _ in v)  # within a factor e of the model


def test_two_machines_in_one_hour_are_two_leases(tmp_path):
    """Runs made before the harness recorded a boot id name their lease in their notes
    (`runs.measured.lease_of`): two machines lent within one hour are two leases, not one."""
    import dataclasses

    from runs.jsonl import append_record, read_records

    rounds = REPO / "data" / "runs" / "h200-x1-loop-rounds-2026-12-02.jsonl"
    record = read_records(rounds)[0]
    machine = {k: v for k, v in record.result.machine.items() if k != "boot_id"}
    result = dataclasses.replace(record.result, machine=machine)
    out = tmp_path / "two-machines.jsonl"
    for minute, name in (("05", "D"), ("25", "E")):
        append_record(out, dataclasses.replace(record, result=result, date=f"2026-12-01T07:{minute}:00+00:00",
                                               notes=[f"lent 1x H200 machine {name} of 2026-12-01"]))
    (measurements,) = log_residuals([str(out)], load_profile("h200")).values()
    assert sorted(lease for lease, _, _ in measurements) == ["machine D of 2026-12-01", "machine E of 2026-12-01"]


def test_bad_input_is_one_line_and_a_non_zero_exit(tmp_path):
    for args in (["--runs", str(tmp_path / "none-*.jsonl")], ["--profile", str(tmp_path / "missing.json")]):
        done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300,
                              cwd=REPO)
        assert done.returncode != 0
        assert done.stderr.strip().startswith("repeat_scatter:") and len(done.stderr.strip().splitlines()) == 1


def test_json_gives_each_row_and_its_floor():
    rounds = str(REPO / "data" / "runs" / "h200-x1-loop-rounds-2026-12-02.jsonl")
    done = subprocess.run([sys.executable, str(SCRIPT), "--runs", rounds, "--json"], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["rows"]
    assert {(r["regime"], r["scope"]) for r in rows} == {(g, s) for g in ("gpu_bound", "host_bound")
                                                         for s in ("across leases", "within one lease")}
    for r in rows:
        assert (r["floor_mape"] is None) == (r["settings"] == 0) == (r["floor_worst"] is None)
        if r["settings"]:
            assert r["floor_mape"] == pytest.approx(0.8 * r["sd_log"])
            assert r["floor_worst"] == pytest.approx(worst_of(r["sd_log"], r["regime_runs"]))
