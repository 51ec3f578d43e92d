import json
import math
import time

import pytest
import torch

from calibration.harness import phase_trace
from calibration.harness.phase_trace import MARKER_KERNEL, PassTime


def _marker(at_us):
    return (MARKER_KERNEL, at_us, at_us + 1.0)


def test_busy_time_is_the_union_of_each_passes_operations_between_markers():
    events = [_marker(0), ("gemm", 10, 50), ("memcpy", 30, 70), ("norm", 100, 110),  # overlap counts once
              _marker(200), ("gemm", 210, 260), _marker(300)]
    assert phase_trace.busy_between_markers_s(events) == pytest.approx([70e-6, 50e-6])


def test_operations_before_the_first_marker_belong_to_no_pass_and_order_is_by_start():
    events = [("gemm", 250, 280), _marker(300), ("late", 320, 330), ("early", 305, 310), _marker(400)]
    assert phase_trace.busy_between_markers_s(events) == pytest.approx([15e-6])


def test_a_chrome_traces_device_operations_are_read_and_host_events_left_out():
    trace = {"traceEvents": [{"cat": "kernel", "name": "k", "ts": 5.0, "dur": 2.0},
                             {"cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 9.0, "dur": 1.0},
                             {"cat": "cpu_op", "name": "aten::mm", "ts": 1.0, "dur": 3.0},
                             {"cat": "kernel", "name": "no time"}]}
    assert phase_trace.device_events_of_trace(trace) == [("k", 5.0, 7.0), ("Memcpy HtoD", 9.0, 10.0)]


def test_passes_take_the_median_over_marked_steps_and_the_idle_time_is_span_less_busy():
    names = phase_trace.pass_names(2)
    assert names[:4] == [("forward", 0), ("backward", 0), ("step", 0), ("forward", 1)] and len(names) == 6
    host = [[1.0] * 6, [3.0] * 6, [2.0] * 6]
    gpu = [[4.0] * 6, [5.0] * 6, [9.0] * 6]
    passes = phase_trace.pass_times(names, host, gpu, [1.5] * 6)
    assert passes[0] == PassTime("forward", 0, 2.0, 5.0, 1.5) and passes[0].gpu_idle_s == pytest.approx(3.5)
    absent = phase_trace.pass_times(names, host, None, None)[0]
    assert absent.gpu_span_s is None and absent.gpu_busy_s is None and absent.gpu_idle_s is None


def test_the_cpu_path_writes_host_times_and_reports_the_device_clock_absent(tmp_path):
    calls = []

    def run_step(mark):
        for _ in range(2):
            mark()
            torch.randn(64, 64) @ torch.randn(64, 64)
            mark()
            mark()
        mark()
        calls.append(1)

    phase_trace.trace_passes(run_step, lambda: None, 2, False, tmp_path / "t.json", cuda=False)
    assert len(calls) == phase_trace.MARKED_STEPS and not (tmp_path / "t.json").exists()
    phase_trace.trace_passes(run_step, lambda: None, 2, True, tmp_path / "t.json", cuda=False)
    out = json.loads((tmp_path / "t.json").read_text())
    assert out["device"] == "cpu" and out["step_s"] > 0 and len(out["passes"]) == 6
    forward = out["passes"][0]
    assert forward["name"] == "forward" and forward["host_s"] > 0
    assert forward["gpu_span_s"] is None and forward["gpu_busy_s"] is None and forward["gpu_idle_s"] is None


def test_the_environment_switch(monkeypatch):
    monkeypatch.setenv(phase_trace.ENV, "0")
    assert not phase_trace.wanted()
    monkeypatch.setenv(phase_trace.ENV, "1")
    assert phase_trace.wanted()


def test_with_a_counter_each_kind_of_pass_gets_a_power_and_without_one_it_is_absent(tmp_path, monkeypatch):
    """The CPU path with a stand-in counter: 100 W throughout, moving every 10 ms."""
    monkeypatch.setattr(phase_trace, "POWER_WINDOW_S", 0.6)
    monkeypatch.setattr(phase_trace, "POWER_STEPS", (4, 40))

    def run_step(mark):
        for _ in range(2):
            for _ in range(3):
                mark()
                time.sleep(0.004)
        mark()

    def counter_j():
        return 100.0 * 0.01 * math.floor(time.perf_counter() / 0.01)

    phase_trace.trace_passes(run_step, lambda: None, 2, True, tmp_path / "t.json", cuda=False, read_gpu_j=counter_j)
    power = json.loads((tmp_path / "t.json").read_text())["pass_power"]
    assert set(power["power_w"]) == {"forward", "backward", "accumulate", "step"}
    assert 20 <= power["steps"] <= 40
    assert len(power["edges"]) == 6 * power["steps"] + power["steps"] and power["step_kinds"][2] == "accumulate"
    assert len(power["counter_changes"]) > power["increments"]  # the raw changes, kept for other readings
    # What the trace keeps is enough to fit again: the same powers from the record alone.
    assert phase_trace.refit_pass_power(power).power_w == pytest.approx(power["power_w"])
    seconds = power["seconds"]
    assert 0.5 * (power["edges"][-1] - power["edges"][0]) < sum(seconds.values()) <= power["edges"][-1] - power["edges"][0]
    # Each kind's accuracy is test_pass_power's (a counter without poll jitter): here the counter is polled
    # on a CPU the scheduler may hold a poll back on for longer than a 4 ms pass (CI, 2026-12-03: one kind
    # at 10 W), so only the energy over the fitted seconds is asserted, which no split between kinds moves.
    mean_w = sum(power["power_w"][k] * seconds[k] for k in seconds) / sum(seconds.values())
    assert mean_w == pytest.approx(100.0, rel=0.05)
    phase_trace.trace_passes(run_step, lambda: None, 2, True, tmp_path / "t.json", cuda=False)
    assert json.loads((tmp_path / "t.json").read_text())["pass_power"] is None


def test_every_rank_runs_the_same_number_of_power_steps_bounded_both_ways():
    assert phase_trace.power_steps(0.1, lambda value, op: value) == 120
    assert phase_trace.power_steps(0.1, lambda value, op: 150.0 if op == "max" else value) == 150
    assert phase_trace.power_steps(10.0, lambda value, op: value) == phase_trace.POWER_STEPS[0]
    assert phase_trace.power_steps(0.001, lambda value, op: value) == phase_trace.POWER_STEPS[1]
