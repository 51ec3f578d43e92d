"""The residual model learns what the profile cannot express, and fades where it has no data."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from synthetic import synthetic_runs, true_profile

from models.fit import RunEvaluator
from models.residual import FEATURES, ResidualModel, features


@pytest.fixture(scope="module")
def planted():
    """All sweep runs; ZeRO-3 runs measured 12% slower than the profile says (a structural miss)."""
    runs = synthetic_runs(noise=0.0)
    rng = np.random.default_rng(8)
    out = []
    for r in runs:
        factor = (1.12 if r.strategy.zero_stage == 3 else 1.0) * np.exp(0.005 * rng.standard_normal())
        out.append(dataclasses.replace(r, step_time_s=r.step_time_s * factor))
    return out


def test_features_have_one_column_each(planted):
    x = features(planted, RunEvaluator(planted)(true_profile()))
    assert x.shape == (len(planted), len(FEATURES))
    assert np.all(np.isfinite(x))
    shares = x[:, FEATURES.index("share_compute")]
    assert np.all((shares > 0) & (shares <= 1))


def test_learns_a_planted_miss_on_held_out_runs(planted):
    profile = true_profile()
    train, test = planted[::2], planted[1::2]
    model = ResidualModel("step_time_s").fit(train, RunEvaluator(train)(profile))
    base = RunEvaluator(test)(profile)
    corrected, lo, hi = model.predict(test, base)
    measured = np.array([r.step_time_s for r in test])
    z3 = np.array([r.strategy.zero_stage == 3 for r in test])
    before = np.abs(base.step_time_s / measured - 1)
    after = np.abs(corrected / measured - 1)
    assert z3.sum() >= 5 and np.mean(before[z3]) > 0.09
    assert np.mean(after[z3]) < 0.04  # learned on the other ZeRO-3 runs
    assert np.mean(after[~z3]) < 0.02  # and not spilled onto the rest
    assert np.mean((lo <= measured) & (measured <= hi)) >= 0.8
    assert np.all(lo < corrected) and np.all(corrected < hi)


def test_far_from_the_runs_the_correction_fades_and_the_band_widens(planted):
    profile = true_profile()
    model = ResidualModel("step_time_s", prior_std=0.1).fit(planted, RunEvaluator(planted)(profile))
    near_x = model.scaler_.transform(features(planted[:1], RunEvaluator(planted[:1])(profile)))
    far_x = np.full((1, len(FEATURES)), 50.0)  # 50 standard deviations from every run
    _, near_std = model.gp_.predict(near_x, return_std=True)
    far_mean, far_std = model.gp_.predict(far_x, return_std=True)
    assert abs(far_mean[0]) < 1e-3  # no correction carried over
    assert far_std[0] > 2 * near_std[0]


def test_needs_runs_with_the_metric(planted):
    runs = [dataclasses.replace(r, gpu_energy_j=None) for r in planted[:5]]
    with pytest.raises(ValueError, match="at least 3 runs"):
        ResidualModel("gpu_energy_j").fit(runs, RunEvaluator(runs)(true_profile()))


def test_saved_model_predicts_the_same(planted):
    import json

    profile = true_profile()
    pred = RunEvaluator(planted)(profile)
    model = ResidualModel("step_time_s").fit(planted, pred)
    again = ResidualModel.from_dict(json.loads(json.dumps(model.to_dict())))
    for a, b in zip(model.predict(planted[:7], RunEvaluator(planted[:7])(profile)),
                    again.predict(planted[:7], RunEvaluator(planted[:7])(profile))):
        np.testing.assert_allclose(a, b, rtol=1e-9)
    broken = {**model.to_dict(), "features": ["something", "else"]}
    with pytest.raises(ValueError, match="features"):
        ResidualModel.from_dict(broken)
