import time

import numpy as np
import pytest

from calibration.harness.pass_power import CounterSampler, fit_pass_power

PASSES = (("forward", 0.08, 650.0), ("backward", 0.13, 690.0), ("step", 0.07, 420.0), ("between", 0.004, 90.0))
IDLE_W = 80.0


def _steps(n: int, start: float = 1.0):
    """Edges and kinds of n periodic steps, and the power at any time (idle outside them)."""
    edges, kinds, powers = [start], [], []
    for i in range(n):
        for name, seconds, watts in PASSES[:3] if i == n - 1 else PASSES:
            edges.append(edges[-1] + seconds)
            kinds.append(name)
            powers.append(watts)
    return np.array(edges), kinds, np.array(powers)


def _counter(edges, powers, update_s: float, delay_s: float, seed: int = 0):
    """A counter that moves every ~update_s (jittered) by the energy up to `delay_s` before it moves."""
    rng = np.random.default_rng(seed)
    grid = np.linspace(edges[0] - 0.5, edges[-1] + 0.5, 200_001)
    where = np.searchsorted(edges, grid, side="right") - 1
    inside = (where >= 0) & (where < len(powers))
    watts = np.where(inside, powers[np.clip(where, 0, len(powers) - 1)], IDLE_W)
    energy = np.concatenate([[0.0], np.cumsum(watts[:-1] * np.diff(grid))])
    changes, t = [], grid[0] + 0.2
    while t < grid[-1]:
        changes.append((t, float(np.interp(t - delay_s, grid, energy))))
        t += update_s * rng.uniform(0.9, 1.1)
    return changes


@pytest.mark.parametrize("delay_s", [0.0, 0.04, 0.11])
def test_each_kind_of_pass_gets_its_own_power_and_the_counters_delay_is_found(delay_s):
    edges, kinds, powers = _steps(40)
    fitted = fit_pass_power(_counter(edges, powers, 0.1, delay_s), list(edges), kinds)
    assert fitted.delay_s == pytest.approx(delay_s, abs=0.003)
    for name, _, watts in PASSES[:3]:
        assert fitted.power_w[name] == pytest.approx(watts, rel=0.01)
    assert fitted.update_s == pytest.approx(0.1, rel=0.05) and fitted.rms_w < 5.0


def test_read_at_the_wrong_delay_the_optimizer_step_would_take_the_backwards_power():
    """Why the delay is fitted: with the counter 60 ms late, a fit that assumed none puts the step far off."""
    edges, kinds, powers = _steps(40)
    changes = _counter(edges, powers, 0.1, 0.06)
    assumed_none = fit_pass_power(changes, list(edges), kinds, max_delay_s=0.0)
    assert abs(assumed_none.power_w["step"] - 420.0) > 50.0
    assert fit_pass_power(changes, list(edges), kinds).power_w["step"] == pytest.approx(420.0, rel=0.01)


def test_too_few_changes_within_the_passes_give_no_answer():
    edges, kinds, powers = _steps(2)
    assert fit_pass_power(_counter(edges, powers, 0.1, 0.0), list(edges), kinds) is None


def test_the_sampler_keeps_each_change_of_the_counter_once():
    values = iter([None, 1.0, 1.0, 2.0] + [2.0] * 10_000)
    with CounterSampler(lambda: next(values), poll_s=0.0005) as sampler:
        deadline = time.monotonic() + 5.0
        while len(sampler.changes) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
    assert [v for _, v in sampler.changes] == [1.0, 2.0]
    assert sampler.changes[0][0] < sampler.changes[1][0]
