"""The optimizer step's GPU work per parameter from phase-traced runs (calibration.optimizer_step)."""
from __future__ import annotations

import dataclasses
import json

import pytest

from calibration.optimizer_step import StepBusy, main, step_busy_s, traced_steps, with_optimizer_step
from models.params import count_params
from models.profile import load_profile, parse_profile
from runs.jsonl import read_records
from runs.measured import SHIPPED_RUNS, to_measured_run

RUNS = SHIPPED_RUNS / "h200-x1-phases-heldout-2026-12-03.jsonl"


def _trace(step_busy: list, forward_busy: float = 0.5) -> dict:
    passes = []
    for i, busy in enumerate(step_busy):
        passes += [{"name": "forward", "micro_step": i, "host_s": 1.0, "gpu_span_s": 1.0, "gpu_busy_s": forward_busy},
                   {"name": "step", "micro_step": i, "host_s": 1.0, "gpu_span_s": 1.0, "gpu_busy_s": busy}]
    return {"device": "cuda", "passes": passes}


def test_a_steps_busy_time_sums_its_micro_steps_and_is_absent_without_a_device_clock():
    assert step_busy_s(_trace([0.001, 0.04])) == pytest.approx(0.041)
    assert step_busy_s(_trace([None])) is None


def _records_with_an_offload_twin(tmp_path):
    """Two of the shipped traced runs, the second turned into an optimizer-offload run."""
    first, second = read_records(RUNS)[:2]
    strategy = dict(second.candidate.strategy, offload_optimizer="cpu")
    second = dataclasses.replace(second, candidate=dataclasses.replace(second.candidate, strategy=strategy))
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in (first, second)))
    for record in (first, second):
        (tmp_path / f"{record.key}.json").write_text(json.dumps(_trace([0.03])))
    return path, first


def test_each_traced_run_that_steps_on_the_gpu_gives_its_busy_time_and_its_parameters(tmp_path):
    path, first = _records_with_an_offload_twin(tmp_path)
    steps = traced_steps([path], tmp_path)
    assert len(steps) == 1  # the offload run steps on the CPU
    trainable = count_params(to_measured_run(first).workload).trainable
    assert steps[0] == StepBusy(to_measured_run(first).label, pytest.approx(0.03), pytest.approx(trainable))


def test_the_profile_takes_the_median_in_bytes_at_its_own_hbm_bandwidth():
    hbm = load_profile("h200").gpu.hbm_bandwidth.value
    steps = [StepBusy("a", 0.01, 1e9), StepBusy("b", 0.03, 1e9), StepBusy("c", 0.02, 1e9)]
    data = with_optimizer_step("h200", steps, "runs.jsonl")
    measured = parse_profile(data, origin="test").gpu.optimizer_step_bytes_per_param
    assert measured.value == pytest.approx(0.02 * hbm / 1e9)
    assert "median over 3 runs of runs.jsonl" in measured.source and f"{0.01 * hbm / 1e9:.0f}-" in measured.source
    with pytest.raises(ValueError, match="no traced run"):
        with_optimizer_step("h200", [], "runs.jsonl")


def test_the_command_writes_the_profile_and_says_what_is_wrong_in_one_line(tmp_path, capsys):
    path, _ = _records_with_an_offload_twin(tmp_path)
    out = tmp_path / "h200.json"
    main(["--runs", str(path), "--traces", str(tmp_path), "--into", "h200", "--out", str(out)])
    assert "bytes a parameter (1 runs)" in capsys.readouterr().out
    assert load_profile(str(out)).gpu.optimizer_step_bytes_per_param.value > 0
    with pytest.raises(SystemExit, match="^error: .*no traced run"):
        main(["--runs", str(path), "--traces", str(tmp_path / "none"), "--into", "h200", "--out", str(out)])
    with pytest.raises(SystemExit, match="^error: run file not found"):
        main(["--runs", str(tmp_path / "missing.jsonl"), "--traces", str(tmp_path), "--into", "h200", "--out", str(out)])


def test_the_shipped_h200_profile_carries_the_measured_step():
    measured = load_profile("h200").gpu.optimizer_step_bytes_per_param
    assert measured is not None and RUNS.name in measured.source
