"""Each pass's GPU power within a training step (forward, backward, optimizer step), from the energy counter.

Why: the energy model draws each phase at a power of its own (`models.energy`), and whole-step energy
cannot say which phase draws more than it says (the Gemma-shaped runs came out 4-11% under at the right
time). NVML's energy counter moves in steps (every 100 ms, longer than an optimizer step), so a pass's
energy cannot be read off the counter at the pass's edges.

So: a thread polls the counter and keeps every change while steps run, and the passes' edges are
taken as host times (on the GPU's clock where there is one, `phase_trace.gpu_edges`). Each counter increment is the integral of the GPU's power over
the interval since the last change; with one power per kind of pass the increments are linear in those
powers, and non-negative least squares gives them. What the counter is was measured against a square
wave of GEMM bursts (`lab/meter_response.py`, machine BK, 2026-12-03): it moves every 100.0 ms by
the energy of that interval (idle 123 W and bursts 700-750 W read sharply, edges within a few ms), where
NVML's power reading is a one-second running mean. The poll sees a change up to ~25 ms late when the
training thread holds the interpreter, so the changes are put back on the counter's own regular grid.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.optimize import nnls

POLL_S = 0.001
GRID_QUANTILE = 2  # percent: the changes seen soonest after the counter moved mark its grid


class ChangeSampler:
    """Polls a reading (the energy counter, a power) on a thread and keeps each change of it with its
    host time (`time.perf_counter`). The NVML call releases the GIL, so the training thread runs on."""

    def __init__(self, read_j: Callable[[], float | None], poll_s: float = POLL_S):
        self._read_j, self._poll_s = read_j, poll_s
        self.changes: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        last = None
        while not self._stop.is_set():
            value = self._read_j()
            if value is not None and value != last:
                self.changes.append((time.perf_counter(), value))
                last = value
            time.sleep(self._poll_s)

    def __enter__(self) -> "ChangeSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)


@dataclass(frozen=True)
class PassPower:
    """The fitted power of each kind of pass."""

    power_w: dict[str, float]
    seconds: dict[str, float]  # each kind's seconds within the increments fitted
    rms_w: float  # the increments' residual, over their own seconds
    increments: int
    update_s: float  # the counter's period

    def to_dict(self) -> dict:
        return {"power_w": self.power_w, "seconds": self.seconds, "rms_w": self.rms_w,
                "increments": self.increments, "counter_update_s": self.update_s}


def on_counter_grid(changes: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The changes at the times the counter moved: a line through their times by index (the counter's
    period), set at the soonest-seen of them (a poll is late, never early). A run of changes
    with one missing would bend the line; the counter moves at every period while the GPU draws power."""
    times = np.array([t for t, _ in changes])
    index = np.arange(len(times))
    period, start = np.polyfit(index, times, 1)
    late = times - (period * index + start)
    grid = period * index + start + np.percentile(late, GRID_QUANTILE)
    return [(float(t), value) for t, (_, value) in zip(grid, changes)]


def _overlaps(edges: np.ndarray, kinds: list[str], names: list[str], start: float, end: float) -> np.ndarray:
    """Seconds of [start, end] inside each named kind of pass; pass k spans edges[k] to edges[k + 1]."""
    row = np.zeros(len(names))
    lo = np.clip(edges[:-1], start, end)
    hi = np.clip(edges[1:], start, end)
    for k, seconds in enumerate(hi - lo):
        if seconds > 0:
            row[names.index(kinds[k])] += seconds
    return row


def _system(changes: list[tuple[float, float]], edges: np.ndarray, kinds: list[str],
            names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """One row per counter increment whose interval lies within the passes."""
    rows, joules = [], []
    for (start, e0), (end, e1) in zip(changes, changes[1:]):
        if start >= edges[0] and end <= edges[-1]:
            rows.append(_overlaps(edges, kinds, names, start, end))
            joules.append(e1 - e0)
    return np.array(rows).reshape(-1, len(names)), np.array(joules)


def fit_pass_power(changes: list[tuple[float, float]], edges: list[float], kinds: list[str]) -> PassPower | None:
    """Each kind's power from the counter's changes as polled and the passes' edges (host times; pass k,
    of kind kinds[k], spans edges[k] to edges[k + 1]). None when too few increments fall within the
    passes to tell the kinds apart."""
    names = sorted(set(kinds))
    if len(changes) < 3:
        return None
    gridded = on_counter_grid(changes)
    a, y = _system(gridded, np.asarray(edges, dtype=float), kinds, names)
    if len(y) < 2 * len(names) or np.linalg.matrix_rank(a) < len(names):
        return None
    power, _ = nnls(a, y)
    rms = float(np.sqrt(np.mean(((a @ power - y) / a.sum(axis=1)) ** 2)))
    return PassPower(power_w={n: float(p) for n, p in zip(names, power)},
                     seconds={n: float(sec) for n, sec in zip(names, a.sum(axis=0))}, rms_w=rms,
                     increments=len(y), update_s=float(gridded[1][0] - gridded[0][0]))
