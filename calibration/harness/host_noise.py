"""Where a measured step's wall time went on the host, step by step: three readings that tell a
slow step's cause apart.

Why: host-bound steps on lent H200 machines scatter far more than the model's error (qwen2.5-1.5b
2k ZeRO-3 with checkpointing ran 0.51-0.91 s from step to step in one window, 2026-12-01), and
the host probes on both sides of a window do not explain it. The candidates are the hypervisor
(other guests run on this VM's vCPUs), Python's garbage collector (ZeRO-3's hooks allocate many
small objects), or the step's own host work:
- `steal_cpu_s`: CPU time the hypervisor gave other guests, summed over all vCPUs (`/proc/stat`);
- `gc_s`: time this process spent in Python's garbage collector (`gc.callbacks`);
- `thread_cpu_s`: the main thread's own CPU time (`time.thread_time`). Wall time beyond it is
  waiting: for the GPU, for a lock, or descheduled.
A reading the host cannot give (no `/proc/stat`) is None, never a zero.
"""
from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

PROC_STAT = Path("/proc/stat")
STEAL_FIELD = 8  # "cpu user nice system idle iowait irq softirq steal ...": steal is the 8th number


def steal_cpu_s(proc_stat: Path = PROC_STAT) -> float | None:
    """CPU seconds stolen from this VM so far, over all its vCPUs; None where the host does not say."""
    try:
        first = proc_stat.read_text().splitlines()[0].split()
        return int(first[STEAL_FIELD]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


@dataclass
class HostNoise:
    """Call `start()` when the window opens, `lap()` after each measured step, `close()` at the end."""

    proc_stat: Path = PROC_STAT
    steal_cpu_s: list[float] | None = field(default_factory=list)
    gc_s: list[float] = field(default_factory=list)
    thread_cpu_s: list[float] = field(default_factory=list)

    def __post_init__(self):
        self._gc_total_s = 0.0
        self._gc_started = None

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started is not None:
            self._gc_total_s += time.perf_counter() - self._gc_started
            self._gc_started = None

    def start(self) -> None:
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)
        self._last = (steal_cpu_s(self.proc_stat), self._gc_total_s, time.thread_time())

    def lap(self) -> None:
        steal, gc_total, cpu = steal_cpu_s(self.proc_stat), self._gc_total_s, time.thread_time()
        last_steal, last_gc, last_cpu = self._last
        if steal is None or last_steal is None or self.steal_cpu_s is None:
            self.steal_cpu_s = None
        else:
            self.steal_cpu_s.append(steal - last_steal)
        self.gc_s.append(gc_total - last_gc)
        self.thread_cpu_s.append(cpu - last_cpu)
        self._last = (steal, gc_total, cpu)

    def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def result_fields(self) -> dict:
        """`RunResult` fields: one entry a measured step, beside `step_times_s`."""
        return {"step_steal_cpu_s": self.steal_cpu_s, "step_gc_s": list(self.gc_s),
                "step_thread_cpu_s": list(self.thread_cpu_s)}
