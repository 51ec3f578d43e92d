import time

import numpy as np
import pytest

from calibration.harness.pass_power import ChangeSampler, fit_pass_power, on_counter_grid

PASSES = (("forward", 0.08, 650.0), ("backward", 0.13, 690.0), ("step", 0.07, 420.0))
IDLE_W = 80.0


def _steps(n: int, start: float = 1.0):
    """Edges and kinds of n periodic steps, and the power at any time (idle outside them)."""
    edges, kinds, powers = [start], [], []
    for _ in range(n):
        for name, seconds, watts in PASSES:
            edges.append(edges[-1] + seconds)
            kinds.append(name)
            powers.append(watts)
    return np.array(edges), kinds, np.array(powers)


def _counter(edges, powers, update_s: float = 0.1, late_s: float = 0.0, seed: int = 0):
    """A counter that moves every update_s by the energy up to that moment, each move seen up to
    late_s later (a poll held up by the training thread)."""
    rng = np.random.default_rng(seed)
    grid = np.linspace(edges[0] - 0.5, edges[-1] + 0.5, 200_001)
    where = np.searchsorted(edges, grid, side="right") - 1
    inside = (where >= 0) & (where < len(powers))
    watts = np.where(inside, powers[np.clip(where, 0, len(powers) - 1)], IDLE_W)
    energy = np.concatenate([[0.0], np.cumsum(watts[:-1] * np.diff(grid))])
    moves = np.arange(grid[0] + 0.2, grid[-1], update_s)
    seen = moves + rng.uniform(0.0, late_s, len(moves)) * (rng.uniform(size=len(moves)) < 0.3)
    return [(float(s), float(np.interp(m, grid, energy))) for s, m in zip(seen, moves)]


def test_each_kind_of_pass_gets_its_own_power():
    edges, kinds, powers = _steps(40)
    fitted = fit_pass_power(_counter(edges, powers), list(edges), kinds)
    for name, _, watts in PASSES:
        assert fitted.power_w[name] == pytest.approx(watts, rel=0.01)
    assert fitted.update_s == pytest.approx(0.1, rel=0.01) and fitted.rms_w < 5.0
    assert sum(fitted.seconds.values()) == pytest.approx(0.1 * fitted.increments)


def test_changes_seen_late_are_put_back_on_the_counters_grid():
    """Machine BK: a third of the changes seen up to 25 ms late moved a 700 W burst's increments by +-20%."""
    edges, kinds, powers = _steps(40)
    late = _counter(edges, powers, late_s=0.025)
    on_time = _counter(edges, powers)
    assert max(abs(a[0] - b[0]) for a, b in zip(on_counter_grid(late), on_time)) < 0.002
    fitted = fit_pass_power(late, list(edges), kinds)
    for name, _, watts in PASSES:
        assert fitted.power_w[name] == pytest.approx(watts, rel=0.02)


def test_too_few_changes_within_the_passes_give_no_answer():
    edges, kinds, powers = _steps(2)
    assert fit_pass_power(_counter(edges, powers), list(edges), kinds) is None
    assert fit_pass_power([(0.0, 1.0)], list(edges), kinds) is None


def test_the_sampler_keeps_each_change_of_the_counter_once():
    values = iter([None, 1.0, 1.0, 2.0] + [2.0] * 10_000)
    with ChangeSampler(lambda: next(values), poll_s=0.0005) as sampler:
        deadline = time.monotonic() + 5.0
        while len(sampler.changes) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
    assert [v for _, v in sampler.changes] == [1.0, 2.0]
    assert sampler.changes[0][0] < sampler.changes[1][0]
