"""The prediction band: conformal order statistics of held-out log ratios, checked leave-one-out."""
from __future__ import annotations

import math

import numpy as np
import pytest

from models.band import Band, BandError, band_path, conformal_bounds, coverage, load_band


def test_bounds_are_order_statistics_with_the_finite_sample_rank():
    r = np.arange(1.0, 20.0)  # 19 ratios: rank ceil(20 * 0.95) = 19 -> the extremes
    assert conformal_bounds(r, 0.9) == (1.0, 19.0)
    r = np.arange(1.0, 40.0)  # 39: rank ceil(40 * 0.95) = 38 -> second from each end
    assert conformal_bounds(r, 0.9) == (2.0, 38.0)
    assert conformal_bounds([0.1, 0.2], 0.9) == (-math.inf, math.inf)  # too few runs to claim 90%


def test_the_band_holds_its_level_on_runs_it_did_not_see():
    rng = np.random.default_rng(0)
    ratios = rng.normal(0.0, 0.08, 2000)
    low, high = conformal_bounds(ratios[:200], 0.9)
    new = ratios[200:]
    assert 0.86 <= np.mean((new >= low) & (new <= high)) <= 0.96
    assert 0.86 <= coverage(ratios[:200], 0.9) <= 0.96


def test_a_band_is_used_only_with_the_profile_it_was_fitted_with(tmp_path):
    band = Band.from_residuals({"step_time_s": [-0.1, 0.0, 0.1] * 10, "gpu_energy_j": [-0.05, 0.05] * 10},
                               '{"profile": 1}', source="test")
    profile = tmp_path / "mine.json"
    band_path(profile).write_text(band.to_json())
    loaded, why = load_band(profile, '{"profile": 1}')
    assert loaded == band and why == ""
    low, high = loaded.step_time_s.around(2.0)
    assert low == pytest.approx(2.0 * math.exp(-0.1)) and high == pytest.approx(2.0 * math.exp(0.1))
    assert load_band(profile, '{"profile": 2}')[0] is None
    assert "no band" in load_band(tmp_path / "other.json", "{}")[1]
    band_path(profile).write_text("{}")
    with pytest.raises(BandError, match="not a prediction band"):
        load_band(profile, '{"profile": 1}')


def test_the_shipped_band_belongs_to_the_shipped_profile():
    """A refit rewrites both; a profile changed after its fit (merged, hand-edited) loses its band
    silently in predict, which a user only sees as a note."""
    from models.profile import load_profile, profile_path

    band, why = load_band(profile_path("h200"), load_profile("h200").to_json())
    assert band is not None, why


def test_host_bound_and_gpu_bound_steps_take_their_own_bands(tmp_path):
    """Mondrian conformal: the runs are split by their predicted host share, and each regime's band
    is made from its own runs only."""
    from models.band import HOST_BOUND_SHARE

    gpu, host = [-0.04, 0.0, 0.04] * 10, [-0.3, 0.0, 0.3] * 10
    shares = [0.05] * 30 + [0.6] * 30
    band = Band.from_residuals({"step_time_s": gpu + host, "gpu_energy_j": gpu + host}, "{}", source="test",
                               host_shares={"step_time_s": shares, "gpu_energy_j": shares})
    assert band.for_share(0.05).step_time_s.high_log == pytest.approx(0.04)
    assert band.for_share(HOST_BOUND_SHARE).step_time_s.high_log == pytest.approx(0.3)
    assert band.step_time_s.high_log == pytest.approx(0.3)  # all runs together
    assert band.for_share(None) == band.for_share(float("nan"))  # unknown share: the band of all runs
    assert band.for_share(None).step_time_s is band.step_time_s
    path = tmp_path / "p.band.json"
    path.write_text(band.to_json())
    assert Band.from_json(path.read_text(), "p") == band


def test_a_regime_with_too_few_runs_for_the_level_takes_the_band_of_all_runs():
    ratios = [-0.1, 0.0, 0.1] * 10
    shares = [0.05] * 27 + [0.9] * 3  # three host-bound runs cannot hold 90%
    band = Band.from_residuals({"step_time_s": ratios, "gpu_energy_j": ratios}, "{}", source="test",
                               host_shares={"step_time_s": shares, "gpu_energy_j": shares})
    assert set(band.regimes) == {"gpu_bound"}
    assert band.for_share(0.9).step_time_s is band.step_time_s


def test_a_version_1_band_still_loads_with_one_band_for_every_step():
    import json

    band = Band.from_residuals({"step_time_s": [-0.1, 0.1] * 20, "gpu_energy_j": [-0.1, 0.1] * 20}, "{}", "test")
    data = json.loads(band.to_json())
    data.update(version=1)
    del data["regimes"]
    old = Band.from_json(json.dumps(data), "old")
    assert old.regimes == {} and old.for_share(0.9).step_time_s == band.step_time_s


def test_the_band_says_whose_it_is():
    from advisor.bands import band_fields

    ratios, shares = [-0.1, 0.0, 0.1] * 20, [0.05] * 30 + [0.5] * 30
    band = Band.from_residuals({"step_time_s": ratios, "gpu_energy_j": ratios}, "{}", source="test",
                               host_shares={"step_time_s": shares, "gpu_energy_j": shares})
    assert band_fields(band, 1.0, 100.0, 0.5)["band_regime"] == "host_bound"
    assert band_fields(band, 1.0, 100.0, 0.01)["band_regime"] == "gpu_bound"
    assert band_fields(band, 1.0, 100.0, None)["band_regime"] is None
    assert band_fields(None, 1.0, 100.0, 0.5) == {"step_time_s_band": None, "energy_j_band": None, "band_regime": None,
                                                  "reserved_gpu_mem_gib_band": None, "peak_gpu_mem_gib_band": None}


def test_the_pool_has_one_band_for_every_step_and_the_peak_takes_it_with_what_lies_outside_the_pool(tmp_path):
    """The pool's ratios give the pool's band whatever the host share; the peak's band is the pool's
    band plus the memory outside the pool, as predicted (not scaled: CUDA's context does not fragment)."""
    from advisor.bands import band_fields, pool_band_note

    ratios, shares = [-0.1, 0.0, 0.1] * 20, [0.05] * 30 + [0.5] * 30
    pool = [-0.05, 0.0, 0.2] * 20
    band = Band.from_residuals({"step_time_s": ratios, "gpu_energy_j": ratios, "reserved_gpu_mem_gib": pool}, "{}",
                               source="test", host_shares={"step_time_s": shares, "gpu_energy_j": shares})
    assert (band.reserved_gpu_mem_gib.low_log, band.reserved_gpu_mem_gib.high_log) == pytest.approx((-0.05, 0.2))
    fields = band_fields(band, 1.0, 100.0, 0.5, reserved_gpu_mem_gib=100.0, peak_gpu_mem_gib=102.0)
    assert fields["reserved_gpu_mem_gib_band"] == pytest.approx([100.0 * math.exp(-0.05), 100.0 * math.exp(0.2)])
    assert fields["peak_gpu_mem_gib_band"] == pytest.approx([100.0 * math.exp(-0.05) + 2.0, 100.0 * math.exp(0.2) + 2.0])
    assert band_fields(band, 1.0, 100.0, 0.5, float("nan"), 102.0)["peak_gpu_mem_gib_band"] is None  # an old search
    assert band_fields(band, 1.0, 100.0, 0.5)["peak_gpu_mem_gib_band"] is None  # no pool given
    assert Band.from_json(band.to_json(), "p") == band
    # 124 GiB at the band's top: over a 120 GiB GPU, a note; under a 141 GiB one, none
    assert "up to 124 GiB" in pool_band_note(fields["peak_gpu_mem_gib_band"], 120.0, band.level)
    assert pool_band_note(fields["peak_gpu_mem_gib_band"], 141.0, band.level) is None
    few = Band.from_residuals({"step_time_s": ratios, "gpu_energy_j": ratios, "reserved_gpu_mem_gib": pool[:5]}, "{}",
                              source="test")
    assert few.reserved_gpu_mem_gib is None  # five runs cannot hold 90%


def test_a_version_2_band_loads_without_a_pool_band():
    import json

    band = Band.from_residuals({"step_time_s": [-0.1, 0.1] * 20, "gpu_energy_j": [-0.1, 0.1] * 20,
                                "reserved_gpu_mem_gib": [-0.1, 0.1] * 20}, "{}", "test")
    data = json.loads(band.to_json())
    data.update(version=2)
    del data["reserved_gpu_mem_gib"]
    old = Band.from_json(json.dumps(data), "old")
    assert old.reserved_gpu_mem_gib is None and old.step_time_s == band.step_time_s


@pytest.mark.parametrize("edit, key", [
    (lambda d: d["step_time_s"].update(low_log="-0.1"), "step_time_s.low_log"),
    (lambda d: d["gpu_energy_j"].update(low_log=0.2, high_log=0.1), "gpu_energy_j"),
    (lambda d: d["step_time_s"].update(high_log=1e30), "step_time_s"),
    (lambda d: d["step_time_s"].update(runs=True), "step_time_s.runs"),
    (lambda d: d.update(level=90), "level"),
    (lambda d: d.update(version=4), "version"),
    (lambda d: d.update(profile_sha256="x"), "profile_sha256"),
])
def test_a_band_edited_out_of_shape_is_refused_naming_the_key(edit, key):
    """A band widens or narrows every prediction's: a string, a reversed or an absurd bound is not used."""
    import json

    band = Band.from_residuals({"step_time_s": [-0.1, 0.1] * 20, "gpu_energy_j": [-0.1, 0.1] * 20}, "{}", "test")
    data = json.loads(band.to_json())
    edit(data)
    with pytest.raises(BandError, match=f"bad key '{key}"):
        Band.from_json(json.dumps(data), "p.band.json")
