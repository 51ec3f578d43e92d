"""`advisor fit` and `advisor report` end to end on synthetic run files."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from synthetic import synthetic_records, write_jsonl

from advisor.cli import main
from models.fit import fitted_run_ids
from models.held_out import PRIOR_GRID_BY_GROUP
from models.profile import load_profile


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


RUNS = 20  # a 90% band needs at least 19 runs held out (models.band.conformal_bounds)


@pytest.fixture(scope="module")
def files(tmp_path_factory, specs, base):
    folder = tmp_path_factory.mktemp("fit")
    records = synthetic_records(specs[:RUNS], noise=0.01, seed=7, failed=("oom", "crash", "timeout"))
    write_jsonl(records, folder / "runs.jsonl")
    write_jsonl([r for r in records if r.result.status != "ok"], folder / "failed.jsonl")
    (folder / "base.json").write_text(base.to_json())
    return folder, records


@pytest.fixture(scope="module")
def fitted(files):
    folder, _ = files
    result = run("fit", "--runs", folder / "runs.jsonl", "--profile", folder / "base.json",
                 "--out", folder / "fitted.json", "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_fit_writes_a_fitted_profile_and_reports_leave_one_out(files, fitted):
    folder, records = files
    assert fitted["runs"]["used"] == RUNS
    # 20 runs of several models: each model's runs held out whole, at every strength up to no fit at all
    # (the leverage path of larger run sets, from the weakest up, is tested in test_held_out)
    tried = list(fitted["cross_validation"])
    assert tried == [str(g) for g in PRIOR_GRID_BY_GROUP]
    best = min(fitted["cross_validation"], key=fitted["cross_validation"].get)
    assert fitted["prior_strength"] == float(best)
    assert fitted["runs"]["failed"] == {"oom": 1, "crash": 1, "timeout": 1}
    profile = load_profile(folder / "fitted.json")
    assert profile.provenance.kind == "fitted"
    assert fitted_run_ids(profile) == {r.key for r in records if r.result.status == "ok"}
    assert "runs.jsonl" in profile.provenance.notes
    names = {p["name"]: p for p in fitted["parameters"]}
    eff = names["overheads.compute_efficiency"]
    assert eff["informed"] and profile.overheads.compute_efficiency.value == pytest.approx(eff["value"])
    loo = fitted["leave_one_out"]
    assert loo["mode"] == "leave-one-out, leverage-corrected"  # from the one fit; --exact refits
    families = {f["family"]: f for f in loo["families"]}
    assert families["all"]["n"] == RUNS and families["all"]["step_time"]["mape"] is not None
    assert sum(f["n"] for name, f in families.items() if name != "all") == RUNS
    assert {t["verdict"] for t in loo["targets"]} <= {"PASS", "MISS", "n/a"}
    # the band the held-out errors give, beside the profile, for that very profile
    from models.band import load_band

    band, why = load_band(folder / "fitted.json", profile.to_json())
    assert band is not None, why
    assert band.step_time_s.runs == RUNS and 0.0 <= band.step_time_s.loo_coverage <= 1.0
    assert band.step_time_s.low_log <= band.step_time_s.high_log
    assert fitted["band"]["level"] == 0.9


def test_fit_prints_tables(files):
    folder, _ = files
    result = run("fit", "--runs", folder / "runs.jsonl", "--profile", folder / "base.json",
                 "--out", folder / "again.json", "--no-loo", "--prior-strength", "0.001")
    assert result.exit_code == 0, result.output
    assert not (folder / "again.band.json").exists()  # no held-out errors, no band
    assert f"{RUNS} runs used; failed, not used: 1 crash, 1 oom, 1 timeout" in result.output
    assert "overheads.compute_efficiency" in result.output and "Accuracy" not in result.output


def test_fit_without_successful_runs_is_a_one_line_error(files):
    folder, _ = files
    result = run("fit", "--runs", folder / "failed.jsonl", "--profile", folder / "base.json",
                 "--out", folder / "never.json")
    assert result.exit_code == 1
    assert result.output.strip().startswith("Error: no successful runs")
    assert "1 oom" in result.output
    assert not (folder / "never.json").exists()


def test_bad_prior_strength_is_a_usage_error(files):
    folder, _ = files
    result = run("fit", "--runs", folder / "runs.jsonl", "--profile", folder / "base.json", "--out",
                 folder / "never.json", "--prior-strength", "strong")
    assert result.exit_code == 2 and "--prior-strength" in result.output


def test_fit_without_runs_is_a_usage_error(files):
    folder, _ = files
    result = run("fit", "--profile", folder / "base.json", "--out", folder / "never.json")
    assert result.exit_code == 2 and "--runs" in result.output


def test_report_table_plot_and_in_sample_warning(files, fitted):
    folder, _ = files
    plot = folder / "accuracy.png"
    result = run("report", "--runs", folder / "runs.jsonl", "--profile", folder / "fitted.json", "--plot", plot)
    assert result.exit_code == 0, result.output
    assert f"in-sample: the profile was fitted to {RUNS} of these runs" in result.output
    assert "Targets:" in result.output and "step time MAPE" in result.output
    data = plot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_report_json_against_an_unfitted_profile(files):
    folder, _ = files
    result = run("report", "--runs", folder / "runs.jsonl", "--profile", folder / "base.json", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["mode"] == "as-is"
    assert len(out["runs"]) == RUNS
    overall = out["families"][0]
    # The datasheet start (efficiency 1, no overheads) is optimistic against this machine.
    assert overall["step_time"]["mape"] > 0.05
    assert all(r["predicted"]["step_time_s"] < r["measured"]["step_time_s"] for r in out["runs"])


def test_report_rejects_a_plot_that_is_not_png(files):
    folder, _ = files
    result = run("report", "--runs", folder / "runs.jsonl", "--profile", folder / "base.json", "--plot", "x.svg")
    assert result.exit_code == 2 and "PNG" in result.output


def test_commands_are_listed():
    result = run("--help")
    assert "fit" in result.output and "report" in result.output


@pytest.mark.slow
def test_a_stopped_refit_takes_its_worker_processes_with_it(tmp_path):
    """SIGTERM (kill, a scheduler's stop) ends `advisor fit` as Ctrl-C does, and its joblib workers go
    with it: before, they ran on after the command had gone (two of them, 2026-12-02)."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import psutil

    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "advisor.cli", "fit", "--runs", str(repo / "data/runs/h200-x1-2026-12-01.jsonl"),
         "--profile", "h200", "--out", str(tmp_path / "fitted.json"), "--prior-strength", "0.001", "--jobs", "2",
         "--exact"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=repo)
    try:
        for line in proc.stderr:
            if line.startswith("fitted in"):
                break
        deadline, workers = time.monotonic() + 60, []
        while time.monotonic() < deadline and len(workers) < 2:  # the refits' processes start
            workers = [p for p in psutil.Process(proc.pid).children(recursive=True) if "loky" in " ".join(p.cmdline())]
            time.sleep(0.2)
        assert workers, "the refits never started"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) != 0
        _, alive = psutil.wait_procs(workers, timeout=30)
        assert not alive
    finally:
        if proc.poll() is None:
            proc.kill()


def test_fit_by_folds_reports_and_bands_them_under_their_own_name(files, tmp_path):
    folder, _ = files
    out = tmp_path / "folds.json"
    result = run("fit", "--runs", folder / "runs.jsonl", "--profile", folder / "base.json", "--out", out,
                 "--folds", 3, "--prior-strength", "0.001", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert "leave_one_out" not in report and report["held_out"]["mode"] == "3-fold cross-validation"
    assert len(report["held_out"]["runs"]) == RUNS
    from models.band import band_path, load_band
    band, why = load_band(out, load_profile(out).to_json())
    assert band is not None, why
    assert json.loads(band_path(out).read_text())["source"] == f"3-fold cross-validation of advisor fit over {RUNS} runs"
    refused = run("fit", "--runs", folder / "runs.jsonl", "--profile", folder / "base.json", "--out", out,
                  "--folds", 3, "--no-loo")
    assert refused.exit_code == 2 and "--folds" in refused.output and "Traceback" not in refused.output


def test_the_fits_band_table_has_the_pool_where_enough_runs_measured_it():
    from advisor.cmd_fit import _format_band
    from models.band import Band

    ratios = [-0.1, 0.0, 0.1] * 10
    with_pool = Band.from_residuals({"step_time_s": ratios, "gpu_energy_j": ratios,
                                     "reserved_gpu_mem_gib": [-0.1, 0.0, 0.2] * 10}, "{}", source="test")
    lines = _format_band(with_pool, "p.band.json").splitlines()
    assert [line.split(":")[0].strip() for line in lines[1:]] == ["step_time_s", "gpu_energy_j", "reserved_gpu_mem_gib"]
    assert "[0.905, 1.221]" in lines[3]
    without = Band.from_residuals({"step_time_s": ratios, "gpu_energy_j": ratios}, "{}", source="test")
    assert len(_format_band(without, "p.band.json").splitlines()) == 3
