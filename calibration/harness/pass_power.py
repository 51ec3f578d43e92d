"""Each pass's GPU power within a training step (forward, backward, optimizer step), from the energy counter.

Why: the energy model draws each phase at a power of its own (`models.energy`), and whole-step energy
cannot say which phase draws more than it says (the Gemma-shaped runs came out 4-11% under at the right
time). NVML's energy counter moves in steps (about every 100 ms, longer than an optimizer step) and may
trail the work, so a pass's energy cannot be read off the counter at the pass's edges.

So: a thread polls the counter and keeps every change (host time, joules) while steps run with a
synchronize at each pass's edge, whose host times bound the passes. Each counter increment is the
integral of the GPU's power over the interval since the last change, shifted by the counter's delay;
with one power per kind of pass the increments are linear in those powers. Non-negative least squares
gives them at each delay scanned, and the delay that fits best is the counter's (reported beside them).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.optimize import nnls

POLL_S = 0.001
MAX_DELAY_S = 0.3
DELAY_STEP_S = 0.002


class CounterSampler:
    """Polls `read_j` on a thread and keeps each change of the counter with its host time
    (`time.perf_counter`). The NVML call releases the GIL, so the training thread runs on."""

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

    def __enter__(self) -> "CounterSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)


@dataclass(frozen=True)
class PassPower:
    """The fitted power of each kind of pass, at the counter delay that fitted best."""

    power_w: dict[str, float]
    seconds: dict[str, float]  # each kind's seconds within the increments fitted
    delay_s: float
    rms_w: float  # the increments' residual, over their own seconds
    increments: int
    update_s: float  # the counter's median seconds between changes

    def to_dict(self) -> dict:
        return {"power_w": self.power_w, "seconds": self.seconds, "delay_s": self.delay_s, "rms_w": self.rms_w,
                "increments": self.increments, "counter_update_s": self.update_s}


def _overlaps(edges: np.ndarray, kinds: list[str], names: list[str], start: float, end: float) -> np.ndarray:
    """Seconds of [start, end] inside each named kind of pass; pass k spans edges[k] to edges[k + 1]."""
    row = np.zeros(len(names))
    lo = np.clip(edges[:-1], start, end)
    hi = np.clip(edges[1:], start, end)
    for k, seconds in enumerate(hi - lo):
        if seconds > 0:
            row[names.index(kinds[k])] += seconds
    return row


def _system(changes: list[tuple[float, float]], edges: np.ndarray, kinds: list[str], names: list[str],
            delay_s: float) -> tuple[np.ndarray, np.ndarray]:
    """One row per counter increment whose interval, moved back by the delay, lies within the passes."""
    rows, joules = [], []
    for (t0, e0), (t1, e1) in zip(changes, changes[1:]):
        start, end = t0 - delay_s, t1 - delay_s
        if start >= edges[0] and end <= edges[-1]:
            rows.append(_overlaps(edges, kinds, names, start, end))
            joules.append(e1 - e0)
    return np.array(rows).reshape(-1, len(names)), np.array(joules)


def fit_pass_power(changes: list[tuple[float, float]], edges: list[float], kinds: list[str],
                   max_delay_s: float = MAX_DELAY_S, delay_step_s: float = DELAY_STEP_S) -> PassPower | None:
    """Each kind's power from the counter's changes and the passes' edges (host times; pass k, of kind
    kinds[k], spans edges[k] to edges[k + 1]). None when too few increments fall within the passes to
    tell the kinds apart."""
    names = sorted(set(kinds))
    edge_array = np.asarray(edges, dtype=float)
    best = None
    for delay in np.arange(0.0, max_delay_s + delay_step_s / 2, delay_step_s):
        a, y = _system(changes, edge_array, kinds, names, float(delay))
        if len(y) < 2 * len(names) or np.linalg.matrix_rank(a) < len(names):
            continue
        power, _ = nnls(a, y)
        rms = float(np.sqrt(np.mean(((a @ power - y) / a.sum(axis=1)) ** 2)))
        if best is None or rms < best[0]:
            best = (rms, float(delay), power, a)
    if best is None:
        return None
    rms, delay, power, a = best
    times = [t for t, _ in changes]
    return PassPower(power_w={n: float(p) for n, p in zip(names, power)},
                     seconds={n: float(s) for n, s in zip(names, a.sum(axis=0))},
                     delay_s=delay, rms_w=rms, increments=len(a), update_s=float(np.median(np.diff(times))))
