"""The measured window's stopping rule, on a fake clock: no torch, no GPU."""
from __future__ import annotations

import statistics

import pytest

from calibration.harness import window as window_module
from calibration.harness.window import MeasuredWindow, WindowSettings
from runs.record import relative_sem


class FakeMonitor:
    def begin_window(self, name):
        pass

    def end_window(self, name):
        return object()


def measure(step_times_s, settings: WindowSettings, monkeypatch) -> MeasuredWindow:
    """Run steps of these durations (cycled) until the window says it is done."""
    clock = {"now": 0.0}
    monkeypatch.setattr(window_module.time, "perf_counter", lambda: clock["now"])
    w = MeasuredWindow(settings, FakeMonitor(), sync=lambda: None, agree=lambda value, op: value,
                       cpu_seconds=lambda: 0.0)
    for i in range(10_000):
        clock["now"] += step_times_s[i % len(step_times_s)]
        if w.step_done():
            return w
    raise AssertionError("the window never ended")


def test_steady_steps_stop_at_the_minimum(monkeypatch):
    w = measure([0.5], WindowSettings(warmup=1, steps=3, min_window_s=5.0), monkeypatch)
    assert len(w.step_times_s) == 10


def test_a_window_shorter_than_two_host_spells_cannot_claim_a_precision(monkeypatch):
    w = measure([0.5], WindowSettings(warmup=1, steps=3, min_window_s=1.0), monkeypatch)
    assert len(w.step_times_s) == 8  # two spells of 2 s: steady steps within one say nothing of the next
    assert relative_sem(w.step_times_s) == 0.0
    assert relative_sem([0.5] * 3) is None


def test_noisy_steps_run_until_the_mean_is_known_to_the_precision(monkeypatch):
    noisy = [0.10, 0.14, 0.12, 0.20, 0.11, 0.17]  # a shared host's host-bound steps
    w = measure(noisy, WindowSettings(warmup=1, steps=3, min_window_s=0.3, precision=0.03, max_steps=200,
                                      max_window_s=1000), monkeypatch)
    assert relative_sem(w.step_times_s) <= 0.03
    assert len(w.step_times_s) > 6  # three steps were not enough
    loose = measure(noisy, WindowSettings(warmup=1, steps=3, min_window_s=0.3, precision=0.0), monkeypatch)
    assert len(loose.step_times_s) == 3  # precision 0: the old rule


def test_precision_stops_at_the_caps(monkeypatch):
    noisy = [0.1, 0.3]
    capped = measure(noisy, WindowSettings(warmup=0, steps=2, min_window_s=0.0, precision=1e-6, max_steps=9,
                                           max_window_s=1000), monkeypatch)
    assert len(capped.step_times_s) == 9
    timed = measure(noisy, WindowSettings(warmup=0, steps=2, min_window_s=0.0, precision=1e-6, max_steps=1000,
                                          max_window_s=2.0), monkeypatch)
    assert 2.0 <= timed.window_s <= 2.0 + 0.3


def test_the_probe_before_the_window_runs_once_after_the_warmup_on_no_steps_clock(monkeypatch):
    clock, calls = {"now": 0.0}, []
    monkeypatch.setattr(window_module.time, "perf_counter", lambda: clock["now"])

    def probe():
        calls.append(clock["now"])
        clock["now"] += 5.0  # a slow probe

    w = MeasuredWindow(WindowSettings(warmup=2, steps=3, min_window_s=0.0, precision=0.0), FakeMonitor(), sync=lambda: None,
                       agree=lambda value, op: value, cpu_seconds=lambda: 0.0, before_window=probe)
    for steps in range(1, 100):
        clock["now"] += 0.5
        if w.step_done():
            break
        assert len(calls) == (1 if steps >= 2 else 0)
    assert calls == [1.0]  # after the two warm-up steps
    assert w.step_times_s == [0.5, 0.5, 0.5] and w.window_s == pytest.approx(1.5)


def test_probes_within_the_window_are_on_no_steps_clock_and_in_no_energy(monkeypatch):
    """Every `probe_every_s` at the first measured step's pace, the window closes its stretch of steps,
    probes and opens the next: the steps' time, the window's and its energy leave the probes out."""
    from calibration.meters import Measurement

    clock, watts = {"now": 0.0, "joules": 0.0}, {"step": 500.0, "probe": 100.0}
    monkeypatch.setattr(window_module.time, "perf_counter", lambda: clock["now"])

    def advance(seconds, kind):
        clock["now"] += seconds
        clock["joules"] += seconds * watts[kind]

    class Meter:
        def begin_window(self, name):
            self.start = (clock["now"], clock["joules"])

        def end_window(self, name):
            t0, j0 = self.start
            return Measurement(name, clock["now"] - t0, {0: clock["joules"] - j0}, None, False, None)

    probes = []

    def probe():
        advance(0.3, "probe")
        probes.append(clock["now"])
        return 150.0

    w = MeasuredWindow(WindowSettings(warmup=1, steps=3, min_window_s=4.0, precision=0.0, probe_every_s=1.0), Meter(),
                       sync=lambda: None, agree=lambda value, op: value, cpu_seconds=lambda: 0.0, between_steps=probe)
    for i in range(100):
        advance(3.0 if i == 0 else 0.5, "step")  # a slow warm-up step sets no pace
        if w.step_done():
            break
    assert w.probe_every_steps == 2 and w.step_times_s == pytest.approx([0.5] * 8)  # 4 s of 0.5-s steps
    assert w.issue_in_window_us == [150.0] * 4 and len(probes) == 4  # after every second step
    assert w.window_s == pytest.approx(4.0) and w.measurement.time_s == pytest.approx(4.0)
    assert w.measurement.gpu_energy_j[0] == pytest.approx(4.0 * 500.0)  # the probes' 120 J are nobody's
    unprobed = MeasuredWindow(WindowSettings(warmup=1, probe_every_s=0.0), Meter(), sync=lambda: None,
                              agree=lambda value, op: value, cpu_seconds=lambda: 0.0, between_steps=probe)
    assert unprobed.between_steps is None  # 0: no probe within the window


def test_settings_travel_through_the_environment_and_the_harness_options():
    s = WindowSettings(warmup=1, steps=4, min_window_s=2.5, max_steps=7, precision=0.05, max_window_s=9.0)
    assert WindowSettings.from_env(s.env()) == s
    assert WindowSettings.from_env({}) == WindowSettings()
    args = s.harness_args()
    assert args[args.index("--precision") + 1] == "0.05" and args[args.index("--max-window-s") + 1] == "9.0"


def test_precision_zero_asks_for_no_more_steps():
    assert WindowSettings(precision=0.0).precise_enough(0.5)
    assert WindowSettings(precision=0.02).precise_enough(0.02)
    assert not WindowSettings(precision=0.02).precise_enough(0.021)


def test_relative_sem_counts_host_spells_not_steps():
    assert relative_sem([1.0]) is None  # one step: nothing to tell
    assert relative_sem([3.0, 3.0, 3.0]) == 0.0  # each step as long as a spell is its own batch
    assert relative_sem([2.7, 3.3]) == pytest.approx(0.4243 / 3.0 / 2**0.5, rel=1e-3)
    # Steps that agree within each 2-s spell and differ between spells: the batches' means decide.
    spells = [0.5] * 4 + [1.0] * 2 + [0.5] * 4 + [1.0] * 2
    iid = statistics.stdev(spells) / statistics.fmean(spells) / len(spells) ** 0.5
    assert relative_sem(spells) == pytest.approx(statistics.stdev([0.5, 1.0, 0.5, 1.0]) / statistics.fmean(spells) / 2,
                                                 rel=1e-3)
    assert relative_sem(spells) > 1.5 * iid
    assert relative_sem([0.5] * 5) is None  # one spell and a short tail
