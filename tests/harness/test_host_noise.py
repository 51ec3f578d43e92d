"""The host's readings per measured step: steal from /proc/stat, the garbage collector's pauses, the
main thread's CPU time; absent where the host does not say. No torch, no GPU."""
from __future__ import annotations

import gc
import os
import time
from pathlib import Path

import pytest

from calibration.harness.host_noise import HostNoise, steal_cpu_s
from calibration.harness.window import MeasuredWindow, WindowSettings
from runs.record import RunResult

HZ = os.sysconf("SC_CLK_TCK")


def write_stat(path: Path, steal_ticks: int) -> None:
    path.write_text(f"cpu  100 0 50 9000 3 0 1 {steal_ticks} 0 0\ncpu0 50 0 25 4500 1 0 0 {steal_ticks} 0 0\n")


def test_steal_is_read_from_the_all_cpu_line_in_seconds(tmp_path):
    stat = tmp_path / "stat"
    write_stat(stat, 3 * HZ)
    assert steal_cpu_s(stat) == pytest.approx(3.0)
    assert steal_cpu_s(tmp_path / "absent") is None
    (tmp_path / "short").write_text("cpu 1 2 3\n")  # a kernel too old to count steal
    assert steal_cpu_s(tmp_path / "short") is None


def test_each_lap_records_the_step_s_steal_gc_and_thread_cpu(tmp_path):
    stat = tmp_path / "stat"
    write_stat(stat, 0)
    noise = HostNoise(proc_stat=stat)
    noise.start()
    try:
        write_stat(stat, HZ // 2)  # half a CPU-second stolen during the first step
        gc.collect()
        noise.lap()
        busy_until = time.thread_time() + 0.05
        while time.thread_time() < busy_until:  # the second step is the thread's own work
            pass
        noise.lap()
    finally:
        noise.close()
    assert noise.steal_cpu_s == pytest.approx([(HZ // 2) / HZ, 0.0])
    assert noise.gc_s[0] > 0.0 and noise.gc_s[1] == 0.0
    assert noise.thread_cpu_s[1] >= 0.05
    assert noise._on_gc not in gc.callbacks  # closed: the collector no longer calls it


def test_a_host_without_proc_stat_reports_steal_as_absent_not_zero(tmp_path):
    noise = HostNoise(proc_stat=tmp_path / "absent")
    noise.start()
    noise.lap()
    noise.close()
    fields = noise.result_fields()
    assert fields["step_steal_cpu_s"] is None
    assert len(fields["step_gc_s"]) == len(fields["step_thread_cpu_s"]) == 1


class FakeMonitor:
    def begin_window(self, name):
        pass

    def end_window(self, name):
        return object()


def test_the_window_records_one_reading_a_measured_step_and_the_record_keeps_them():
    w = MeasuredWindow(WindowSettings(warmup=2, steps=3, min_window_s=0.0, precision=0.0), FakeMonitor(),
                       sync=lambda: None, agree=lambda value, op: value, cpu_seconds=lambda: 0.0)
    while not w.step_done():
        pass
    fields = w.host_noise.result_fields()
    assert len(fields["step_gc_s"]) == len(fields["step_thread_cpu_s"]) == len(w.step_times_s) == 3
    if fields["step_steal_cpu_s"] is not None:  # a Linux host
        assert len(fields["step_steal_cpu_s"]) == 3
    result = RunResult.from_dict({"status": "ok", **fields})
    assert RunResult.from_dict(result.to_dict()) == result
