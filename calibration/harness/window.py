"""The measured window of a training run, shared by the built-in harness and a user's own script
(`advisor.monitor.StepMeter`): warm-up steps, then at least `steps` optimizer steps and at least
`min_window_s` seconds (NVML's energy counter ticks every ~100 ms), then more steps until the mean
step time is known to `precision` (its relative standard error), at most `max_steps` steps or
`max_window_s` seconds.

Why a precision: a host-bound step on a shared host varies by 10-20% from step to step (one lent
H200 slice, 2026-12-01: 0.12-0.21 s within one 4 s window), so three steps can miss the mean by
more than the model's error, and a measured pick between two close candidates would be a coin toss.
Why 20 s at least: the host holds a fast or slow spell for a second or two, so a short window's
steps agree with each other and still miss; on lent H200 slices a host-bound window's mean scattered
by 9-15% (sd in log) at 2 s, 5-9% at 10 s and 3-7% at 20 s (lab/probe_drift.py, 2026-12-04), and
`runs.record.relative_sem` counts host spells, not steps.

Why probes within the window: a host-bound step's mean over a window followed the host probes taken
within it (correlation 0.76-0.90 on lent H200 slices) and hardly those right before and after it
(0.17-0.53), which were all a run took. With `between_steps` (the harness's host probe) the window
stops its clocks every `probe_every_s`, probes, and goes on: each probe sits between two segments of
steps, on no step's clock and in no segment's energy, and `issue_in_window_us` keeps what each read.
NVML's energy counter moves every 100 ms, so a stretch's edges are read up to a tick late: each probe
leaves about 50 ms of its own energy in the window and takes as much of the steps' out: at a probe
every 2 s, 2.5% of the window's energy times the relative difference between the steps' power and the
probe's (not measured; the probe's kernels are tiny, so it draws less than the steps).

Every rank calls `step_done()` after each optimizer step. The ranks agree on when the window ends
(one all-reduce per decision, only at the step count where it may end), since every step holds
collectives and a rank that stopped alone would hang the others. Then `rank_summary()` is one
rank's measurements, and `result_fields()` combines every rank's into `runs.record.RunResult` fields.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, fields
from typing import Callable

from calibration.harness.host_noise import HostNoise
from calibration.harness.shared_host_memory import SharedPeak
from calibration.meters import Measurement
from runs.record import HOST_SPELL_S, relative_sem

GIB = 2**30
# Where a run tells a user script's `advisor.monitor.StepMeter` to write its result.
RESULT_ENV = "ADVISOR_RESULT"


@dataclass(frozen=True)
class WindowSettings:
    """What one run measures; `precision` 0 stops at `steps` and `min_window_s`."""

    warmup: int = 2  # steps run before the window
    steps: int = 3  # measured steps, at least
    min_window_s: float = 20.0  # longer than a host's spells (above); NVML's energy counter ticks every 100 ms
    max_steps: int = 1000  # a 20 ms step fills the minimum
    precision: float = 0.02  # the mean step time's relative standard error to reach
    max_window_s: float = 30.0  # no more steps for precision after this long
    probe_every_s: float = HOST_SPELL_S  # a host probe between steps this often, where the run gives one; 0: none

    def precise_enough(self, rel_sem: float) -> bool:
        """Whether a mean step time known to `rel_sem` (runs.record.relative_sem) needs no more steps."""
        return self.precision <= 0 or rel_sem <= self.precision

    def env(self) -> dict[str, str]:
        """How a run tells a user script's StepMeter the window: ADVISOR_WARMUP, ADVISOR_STEPS, ..."""
        return {f"ADVISOR_{f.name.upper()}": str(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_env(cls, environ=None) -> "WindowSettings":
        environ = os.environ if environ is None else environ
        default = cls()
        return cls(**{f.name: type(getattr(default, f.name))(environ.get(f"ADVISOR_{f.name.upper()}", getattr(default, f.name)))
                      for f in fields(cls)})

    def harness_args(self) -> list[str]:
        """The same settings as `calibration.harness.train` options: --warmup 2 --steps 3 ..."""
        return [arg for f in fields(self) for arg in (f"--{f.name.replace('_', '-')}", str(getattr(self, f.name)))]


class MeasuredWindow:
    """Create it right before the first step; call `step_done()` after each step until it says True.

    `agree(value, "max" | "min")` reduces a number over the ranks (identity on one rank); `sync`
    waits for the GPU; `monitor` is a `calibration.meters.EnergyMonitor` (or stands in for one);
    `before_window`, where given, runs once between the warm-up and the window (the host probe), on
    no step's clock; `between_steps`, where given, probes the host within the window every
    `probe_every_s` (as many steps as that takes at the slowest rank's first measured step: every rank
    probes after the same step) and returns what it read, on no step's clock and outside the window's energy."""

    def __init__(self, settings: WindowSettings, monitor, sync: Callable[[], None],
                 agree: Callable[[float, str], float], cpu_seconds: Callable[[], float],
                 before_window: Callable[[], None] | None = None,
                 between_steps: Callable[[], float | None] | None = None):
        self.settings = settings
        self.before_window = before_window
        self.between_steps = between_steps if settings.probe_every_s > 0 else None
        self.issue_in_window_us: list[float | None] = []
        self.probe_every_steps: int | None = None  # set at the first measured step
        self._segments = []  # the window's energy, one Measurement a stretch of steps between probes
        self._probes_s = self._probes_cpu_s = 0.0
        self.warmup = settings.warmup
        self.monitor, self.sync, self.agree, self.cpu_seconds = monitor, sync, agree, cpu_seconds
        self.warmup_done = 0
        self.step_times_s: list[float] = []
        self.host_noise = HostNoise()
        self.target = settings.steps
        self.measurement = None
        self.window_s = self.cpu_s = None
        if settings.warmup == 0:
            self._begin(None)
        self._last = time.perf_counter()

    @property
    def done(self) -> bool:
        return self.measurement is not None

    def step_done(self) -> bool:
        """After each optimizer step; True once the window is measured (call no more)."""
        self.sync()
        now = time.perf_counter()
        took, self._last = now - self._last, now
        if self.warmup_done < self.warmup:
            self.warmup_done += 1
            if self.warmup_done == self.warmup:
                self._begin(took)
            return False
        self.step_times_s.append(took)
        self.host_noise.lap()
        if self.between_steps is not None:
            if self.probe_every_steps is None:
                self._set_probe_pace(took)
            if len(self.step_times_s) % self.probe_every_steps == 0:
                self._probe()
                now = self._last
        if len(self.step_times_s) < self.target:
            return False
        s, n = self.settings, len(self.step_times_s)
        elapsed = self.agree(now - self._start - self._probes_s, "min")
        pace = elapsed / n
        if n < s.max_steps and elapsed < s.min_window_s:  # the warm-up step was slower than these: top up
            self.target = min(s.max_steps, n + math.ceil((s.min_window_s - elapsed) / pace))
            return False
        known = relative_sem(self.step_times_s) if s.precision > 0 else 0.0
        spread = self.agree(math.inf if known is None else known, "max")
        if n >= s.max_steps or s.precise_enough(spread) or elapsed >= s.max_window_s:
            self._end(now)
            return True
        # The standard error falls as 1/sqrt(steps): enough steps for the precision, within the caps.
        # Too short to tell (under two host spells): enough steps for two.
        wanted = math.ceil(n * (spread / s.precision) ** 2) if math.isfinite(spread) else math.ceil(2 * HOST_SPELL_S / pace)
        affordable = n + max(1, math.floor((s.max_window_s - elapsed) / pace))
        self.target = max(n + 1, min(s.max_steps, wanted, affordable))
        return False

    def _begin(self, last_warmup_s: float | None) -> None:
        if self.before_window is not None:
            self.before_window()
        if last_warmup_s:
            slowest = self.agree(last_warmup_s, "max")
            s = self.settings
            self.target = max(s.steps, min(s.max_steps, math.ceil(s.min_window_s / slowest)))
        self._cpu_before = self.cpu_seconds()
        self.monitor.begin_window("measured")
        self.host_noise.start()
        self._start = self._last = time.perf_counter()

    def _set_probe_pace(self, step_s: float) -> None:
        """Probe every this many steps: `probe_every_s` at the slowest rank's first measured step (every
        rank agrees). Not the warm-up's: a ZeRO-3 warm-up step ran several times a measured one on H200,
        and the window probed after every step."""
        self.probe_every_steps = max(1, round(self.settings.probe_every_s / self.agree(step_s, "max")))

    def _probe(self) -> None:
        """Close the stretch of steps, probe the host, open the next: the probe's time, CPU and energy
        are nobody's."""
        self._segments.append(self.monitor.end_window("measured"))
        started, cpu_started = time.perf_counter(), self.cpu_seconds()
        self.issue_in_window_us.append(self.between_steps())
        self.sync()
        self._probes_cpu_s += self.cpu_seconds() - cpu_started
        self.monitor.begin_window("measured")
        self.host_noise.start()
        self._last = time.perf_counter()
        self._probes_s += self._last - started

    def _end(self, now: float) -> None:
        self.host_noise.close()
        self.measurement = Measurement.summed([*self._segments, self.monitor.end_window("measured")])
        self.window_s = now - self._start - self._probes_s
        self.cpu_s = self.cpu_seconds() - self._cpu_before - self._probes_cpu_s

    def rank_summary(self, rank: int, local_rank: int, peak_alloc: int | None, peak_reserved: int | None,
                     host_peak: int, host_baseline: int | None, host_shared: SharedPeak | None = None,
                     alloc_retries: int | None = None) -> dict:
        """This rank's measurements, to be gathered on rank 0. Host CPU energy is taken on local
        rank 0 only: its sensor (or estimate) covers the whole host."""
        m = self.measurement
        return {"rank": rank, "local_rank": local_rank, "gpu_energy_j": m.gpu_energy_j,
                "gpu_power_avg_w": m.gpu_power_avg_w, "cpu_energy_j": m.cpu_energy_j if local_rank == 0 else None,
                "cpu_energy_estimated": bool(m.cpu_energy_estimated), "cpu_s": self.cpu_s,
                "peak_alloc": peak_alloc, "peak_reserved": peak_reserved, "host_peak": host_peak,
                "host_baseline": host_baseline, "alloc_retries": alloc_retries,
                "host_shared": None if host_shared is None else (host_shared.pss_bytes, host_shared.rss_bytes)}

    def result_fields(self, everyone: list[dict]) -> dict:
        """`RunResult` fields from every rank's `rank_summary`: per-step averages over the window,
        energies summed over ranks, memory peaks the largest over ranks."""
        steps = len(self.step_times_s)

        def each(key):
            values = [r[key] for r in everyone]
            return None if any(v is None for v in values) else values

        gpu = each("gpu_energy_j")
        node_cpu = [r["cpu_energy_j"] for r in everyone if r["local_rank"] == 0]
        estimated = any(r["cpu_energy_estimated"] for r in everyone)
        kind = getattr(self.monitor, "cpu_meter_kind", "absent")
        basis = getattr(self.monitor, "cpu_estimate_basis", None)
        power = None if any(not r["gpu_power_avg_w"] for r in everyone) else {
            str(r["rank"]): sum(r["gpu_power_avg_w"].values()) for r in everyone}
        baselines = each("host_baseline")
        shared = each("host_shared")
        return {
            "step_time_s": self.window_s / steps,
            "gpu_energy_j": sum(sum(d.values()) for d in gpu) / steps if gpu else None,
            "cpu_energy_j": sum(node_cpu) / steps if node_cpu and None not in node_cpu else None,
            "cpu_energy_estimated": estimated,
            "peak_gpu_mem_gib": max(each("peak_alloc")) / GIB if each("peak_alloc") else None,
            "peak_gpu_reserved_gib": max(each("peak_reserved")) / GIB if each("peak_reserved") else None,
            "gpu_alloc_retries": max(each("alloc_retries")) if each("alloc_retries") else None,
            "peak_host_mem_gib": sum(r["host_peak"] for r in everyone) / GIB,
            "host_mem_baseline_gib": sum(baselines) / GIB if baselines else None,
            "peak_host_mem_pss_gib": sum(pss for pss, _ in shared) / GIB if shared else None,
            "peak_host_mem_sampled_gib": sum(rss for _, rss in shared) / GIB if shared else None,
            "warmup_steps": self.warmup,
            "measured_steps": steps,
            "window_s": self.window_s,
            "step_times_s": list(self.step_times_s),
            **self.host_noise.result_fields(),
            "gpu_energy_window_j": {str(r["rank"]): sum(r["gpu_energy_j"].values()) for r in everyone} if gpu else None,
            "gpu_power_avg_w": power,
            "cpu_process_core_s": sum(r["cpu_s"] for r in everyone) / steps,
            "gpu_meter": getattr(self.monitor, "gpu_meter_kind", "absent"),
            "cpu_meter": f"{kind}; {basis}" if estimated and basis else kind,
            "world_size": len(everyone),
        }


def torch_agree(device) -> Callable[[float, str], float]:
    """Reduce a number over the ranks of torch.distributed (identity when it is not running)."""
    import torch
    import torch.distributed as dist

    def agree(value: float, op: str) -> float:
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return value
        t = torch.tensor([value], device=device, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.MIN)
        return t.item()

    return agree
