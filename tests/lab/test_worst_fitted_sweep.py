"""lab/worst_fitted_sweep.py: the settings leave-one-out predicts worst, as a sweep whose runs
keep their old runs' keys."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from advisor.validate import candidates_from_sweep

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "lab" / "worst_fitted_sweep.py"
sys.path.insert(0, str(REPO / "lab"))

from worst_fitted_sweep import shipped_by_key, worst_keys  # noqa: E402


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=REPO)


def loo_run(run_id, label, time_pct, energy_pct, step_s=0.5):
    return {"run_id": run_id, "label": label,
            "measured": {"step_time_s": step_s, "gpu_energy_j": 100.0},
            "predicted": {"step_time_s": step_s * (1 + time_pct / 100), "gpu_energy_j": 100.0 + energy_pct}}


def test_the_worst_of_a_gpu_count_come_first_by_the_larger_of_their_two_errors():
    """The GPU count is the record's, whatever the label says; a run without a record is left out."""
    report = {"leave_one_out": {"runs": [
        loo_run("a", "m 512 z2", 10, -3), loo_run("b", "m 512 z3 2gpu", 2, -30),
        loo_run("c", "m 512 z3", 50, 50), loo_run("d", "m 512 z1", 90, 0, step_s=4.0),
        loo_run("e", "m 512 z0", 99, 99)]}}
    records = {key: SimpleNamespace(candidate=SimpleNamespace(gpus=gpus))
               for key, gpus in (("a", 1), ("b", 1), ("c", 2), ("d", 1))}
    assert [key for _, key in worst_keys(report, records, gpus=1, max_step_s=1.5)] == ["b", "a"]
    assert [key for _, key in worst_keys(report, records, gpus=2, max_step_s=1.5)] == ["c"]
    k_fold_report = {"held_out": report["leave_one_out"]}  # `advisor fit --folds`'s report reads the same
    assert [key for _, key in worst_keys(k_fold_report, records, gpus=1, max_step_s=1.5)] == ["b", "a"]


def test_the_sweep_runs_each_settings_own_config_under_its_old_key(tmp_path):
    out = tmp_path / "worst.jsonl"
    done = run(out, "--count", 3, "--skip", 1)
    assert done.returncode == 0, done.stderr
    report = json.loads((REPO / "data" / "profiles" / "h200.fit-report.json").read_text())
    ranked = [key for _, key in worst_keys(report, shipped_by_key(), 1, 1.5)]
    assert [c.key() for c in candidates_from_sweep(out)] == ranked[1:4]


def test_bad_arguments_end_in_one_line_and_a_non_zero_exit(tmp_path):
    for args in ([tmp_path / "x.jsonl", "--skip", -1], [tmp_path / "x.jsonl", "--report", tmp_path / "none.json"],
                 [tmp_path / "no" / "such" / "x.jsonl"]):
        done = run(*args)
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
