"""lab/memory_cap.py: which caps it still runs, and a whole sweep on the CPU path (no GPU: the
cap is asked for, not applied, and the record says so)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "lab" / "memory_cap.py"
sys.path.insert(0, str(REPO / "lab"))

from memory_cap import parse_caps, settled  # noqa: E402


def test_a_cap_is_skipped_when_its_outcome_follows_from_those_tried():
    tried = [(0.0, "ok"), (1.2, "ok"), (1.1, "oom")]
    assert settled(1.3, tried)  # above a cap the step ran in
    assert settled(1.06, tried)  # below a cap it ran out of memory in
    assert not settled(1.15, tried)  # between: not known yet
    assert not settled(1.1, [(0.0, "ok")])  # the uncapped run says nothing about a cap


def test_caps_are_multiples_of_at_least_one_largest_first():
    assert parse_caps("1.03, 1.1") == [1.1, 1.03]
    for bad in ("0.9", "x", ""):
        with pytest.raises(Exception):
            parse_caps(bad)


def test_a_sweep_runs_each_setting_uncapped_then_capped_and_resumes(tmp_path):
    sweep = tmp_path / "sweep.jsonl"
    sweep.write_text(json.dumps({"label": "tiny", "model": str(REPO / "data" / "sweeps" / "tiny-h256-l6.json"),
                                 "seq": 128, "strategy": {"gpus": 1, "gpus_per_node": 1, "zero_stage": 0,
                                                          "cpu_threads_per_rank": 1}}) + "\n")
    out = tmp_path / "runs.jsonl"
    args = [sys.executable, str(SCRIPT), str(sweep), "--out", str(out), "--caps", "1.1", "--workdir",
            str(tmp_path / "wd"), "--steps", "1", "--min-window-s", "0"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["notes"][0] for r in records] == ["memory cap: 0 x predicted allocated",
                                               "memory cap: 1.1 x predicted allocated"]
    assert all(r["result"]["status"] == "ok" and r["prediction"] for r in records)
    assert records[1]["result"]["machine"]["gpu_memory_cap_gib"] is None  # no GPU: nothing was capped
    again = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert again.returncode == 0 and len(out.read_text().splitlines()) == 2  # nothing run twice


def test_each_capped_run_is_set_beside_its_settings_uncapped_run():
    from calibration.harness.memory_cap import cap_note
    from memory_cap import cap_runs
    from runs.record import Candidate, RunRecord, RunResult

    c = Candidate(model="m", seq_len=1, ds_config={}, label="x")
    records = [RunRecord.now(c, RunResult(status="ok", step_time_s=1.0), notes=[cap_note(0.0)]),
               RunRecord.now(c, RunResult(status="ok", step_time_s=1.04, gpu_alloc_retries=7), notes=[cap_note(1.1)]),
               RunRecord.now(c, RunResult(status="oom", reason="CUDA out of memory"), notes=[cap_note(1.03)]),
               RunRecord.now(c, RunResult(status="ok", step_time_s=9.0))]  # no cap sweep's: left out
    rows = cap_runs(records)
    assert [(r.factor, r.status) for r in rows] == [(0.0, "ok"), (1.1, "ok"), (1.03, "oom")]
    assert rows[1].slowdown == pytest.approx(0.04) and rows[1].retries == 7 and rows[2].slowdown is None
