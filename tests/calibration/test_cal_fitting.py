"""Alpha-beta fits and curve building recover what synthetic data was made from."""
from pathlib import Path

import numpy as np
import pytest

from calibration.fitting import (
    build_curve,
    bus_bandwidth,
    bus_factor,
    fit_alpha_beta,
)
from models.profile import Curve


@pytest.mark.parametrize("op,n,expected", [
    ("all_reduce", 2, 1.0), ("all_reduce", 8, 1.75), ("all_gather", 8, 0.875),
    ("reduce_scatter", 4, 0.75), ("all_to_all", 4, 0.75), ("all_reduce", 1, 0.0),
])
def test_bus_factors_are_the_nccl_tests_ones(op, n, expected):
    assert bus_factor(op, n) == pytest.approx(expected)


def test_bus_factor_rejects_unknown_op_and_empty_group():
    with pytest.raises(ValueError, match="unknown collective"):
        bus_factor("broadcast", 4)
    with pytest.raises(ValueError):
        bus_factor("all_reduce", 0)


def test_bus_bandwidth_of_one_measurement():
    # 1 GiB all-reduce over 8 ranks in 10 ms: algbw 107.4 GB/s, busbw 1.75x that.
    assert bus_bandwidth("all_reduce", 8, 2**30, 0.01) == pytest.approx(1.75 * 2**30 / 0.01)


@pytest.mark.parametrize("op,n", [("all_reduce", 8), ("all_gather", 2), ("all_to_all", 4)])
def test_alpha_beta_recovers_alpha_and_bandwidth_exactly(op, n):
    alpha, bw = 25e-6, 180e9
    sizes = 2.0 ** np.arange(15, 31, 2)
    f = bus_factor(op, n)
    times = alpha + f * sizes / bw
    fit = fit_alpha_beta(sizes, times, f)
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-6)
    assert fit.bus_bandwidth_bytes_per_s == pytest.approx(bw, rel=1e-6)
    assert fit.max_rel_error < 1e-6
    assert fit.points == len(sizes)


def test_alpha_beta_with_noise_stays_close():
    rng = np.random.default_rng(0)
    alpha, bw, f = 40e-6, 300e9, 1.0
    sizes = 2.0 ** np.arange(14, 31)
    times = (alpha + f * sizes / bw) * rng.lognormal(0.0, 0.03, sizes.size)
    fit = fit_alpha_beta(sizes, times, f)
    assert fit.alpha_s == pytest.approx(alpha, rel=0.1)
    assert fit.bus_bandwidth_bytes_per_s == pytest.approx(bw, rel=0.1)


def test_alpha_beta_relative_weighting_keeps_latency_of_small_messages():
    # An unweighted fit would let the 1 GiB point dominate and push alpha to ~0.
    sizes = np.array([2**10, 2**12, 2**14, 2**30])
    times = 10e-6 + sizes / 100e9
    fit = fit_alpha_beta(sizes, times, 1.0)
    assert fit.alpha_s == pytest.approx(10e-6, rel=1e-3)


def test_group_of_one_gives_alpha_only():
    sizes = [2**12, 2**20, 2**24]
    times = [20e-6, 21e-6, 19e-6]
    fit = fit_alpha_beta(sizes, times, bus_factor("all_reduce", 1))
    assert fit.bus_bandwidth_bytes_per_s is None
    assert 19e-6 <= fit.alpha_s <= 21e-6


def test_alpha_beta_rejects_too_few_or_bad_points():
    with pytest.raises(ValueError):
        fit_alpha_beta([1024], [1e-5], 1.0)
    with pytest.raises(ValueError):
        fit_alpha_beta([1024, 2048], [1e-5, -1.0], 1.0)
    with pytest.raises(ValueError, match="no bandwidth"):
        fit_alpha_beta([1024, 2**20, 2**24], [3e-5, 2e-5, 1e-5], 1.0)  # time falls with size


def test_curve_merges_points_of_similar_size_and_is_strictly_increasing():
    x = [1e9, 1.01e9, 1e10, 1e11, 1e11]
    y = [100e12, 120e12, 300e12, 600e12, 640e12]
    c = build_curve(x, y)
    assert len(c.x) == 3
    assert all(b > a for a, b in zip(c.x, c.x[1:]))
    assert c.y[0] == pytest.approx(110e12)  # median of the merged pair
    assert c.y[-1] == pytest.approx(620e12)
    Curve(x_unit="flop", y_unit="flop/s", x=c.x, y=c.y, source="test")  # the schema accepts it


def test_curve_monotone_pools_a_dip_and_raw_keeps_it():
    x = [1e8, 1e9, 1e10, 1e11]
    y = [100.0, 300.0, 200.0, 400.0]  # a dip at 1e10 (wave quantisation, noise)
    mono = build_curve(x, y, monotone=True)
    raw = build_curve(x, y, monotone=False)
    assert all(b >= a for a, b in zip(mono.y, mono.y[1:]))
    assert mono.y[1] == pytest.approx(250.0) and mono.y[2] == pytest.approx(250.0)  # pooled
    assert raw.y == [100.0, 300.0, 200.0, 400.0]


def test_curve_drops_non_positive_points_and_rejects_empty():
    c = build_curve([0.0, 1e6, 1e7], [5.0, 0.0, 7.0])
    assert c.x == [1e7] and c.y == [7.0]
    with pytest.raises(ValueError):
        build_curve([], [])
    with pytest.raises(ValueError):
        build_curve([1.0, -1.0], [0.0, 1.0])


def _gap_series(hot_w, wait_w, decay_s, gaps_s, noise=0.0, seed=0):
    """Windows of 100 ms bursts at `hot_w` and gaps decaying toward `wait_w`, as the benchmark records them."""
    rng = np.random.default_rng(seed)
    out = [{"gap_s": 0.0, "cycles": 30, "time_s": 3.0, "busy_s": 3.0, "gpu_energy_j": 3.0 * hot_w}]
    for g in gaps_s:
        cycles = 20
        gap_w = wait_w + (hot_w - wait_w) * decay_s / g * -np.expm1(-g / decay_s)
        energy = cycles * (0.1 * hot_w + g * gap_w) * (1 + noise * rng.standard_normal())
        out.append({"gap_s": g, "cycles": cycles, "time_s": cycles * (0.1 + g), "busy_s": cycles * 0.1,
                    "gpu_energy_j": energy})
    return out


def test_the_wait_decay_is_recovered_from_its_windows():
    from calibration.fitting import fit_wait_decay
    from calibration.microbench.wait_decay import GAPS_S

    gaps = tuple(g for g in GAPS_S if g > 0)  # the sleeps the calibration times
    fit = fit_wait_decay(_gap_series(690.0, 125.0, 0.03, gaps), 125.0)
    assert fit.hot_w == pytest.approx(690.0) and fit.decay_s == pytest.approx(0.03, rel=1e-3) and fit.gaps == len(gaps)
    noisy = fit_wait_decay(_gap_series(690.0, 125.0, 0.03, gaps, noise=0.003), 125.0)
    assert noisy.decay_s == pytest.approx(0.03, rel=0.15)  # the short gaps' noise is weighed down
    with pytest.raises(ValueError, match="at least 3 gap lengths"):
        fit_wait_decay(_gap_series(690.0, 125.0, 0.03, (0.05, 0.1)), 125.0)


REPO = Path(__file__).resolve().parents[2]
STORED_DECAYS = [p for p in sorted((REPO / "data").glob("calibration/**/*.raw.jsonl")) if '"key": "wait_decay"' in p.read_text()]


@pytest.mark.parametrize("raw", STORED_DECAYS, ids=lambda p: p.name)
def test_the_gaps_timed_fit_the_decay_the_stored_calibrations_fitted_from_all_their_gaps(raw):
    """Calibrations stored before the 5 and 10 ms gaps were dropped timed them too: the gaps timed now
    must give the same decay from the same windows."""
    from calibration.fitting import fit_wait_decay
    from calibration.microbench.wait_decay import GAPS_S
    from calibration.rawlog import read_raw

    decay = read_raw(raw)[1]["wait_decay"]
    assert decay.status == "ok"
    series = decay.data["series"]
    every = fit_wait_decay(series, 124.0)
    timed = fit_wait_decay([s for s in series if s["gap_s"] in GAPS_S], 124.0)
    assert timed.decay_s == pytest.approx(every.decay_s, rel=0.01)
