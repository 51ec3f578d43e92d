"""Choose the prior, fit, hold each run out, report, band: the one path from measured runs to a
refined profile that `advisor fit`, `advisor report --loo`, `recommend --validate --refit` and
`benchmarks/accuracy.py` all take."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from advisor.accuracy import AccuracyReport, accuracy_report, compare_held_out, user_host_share
from models.band import Band
from models.fit import MeasuredRun, ProfileFit, prefit_profile
from models.profile import HardwareProfile
from models.held_out import HeldOutPrediction, choose_prior_strength, leave_one_out

MIN_RUNS_FOR_CV = 4


@dataclass(frozen=True)
class Refit:
    model: ProfileFit  # fitted to every run: `model.profile_` is the refined profile
    base: HardwareProfile  # the pre-fit profile it started from
    prior_strength: float
    cv_scores: dict[float, float]  # prior strength -> mean |log error| of 5-fold cross-validation
    held: list[HeldOutPrediction] | None  # leave-one-out predictions (None when not asked for)
    report: AccuracyReport | None
    band: Band | None  # from the leave-one-out ratios, for `model.profile_`


def parse_prior(text: str) -> float | str:
    """A number >= 0, or 'cv'."""
    if text == "cv":
        return text
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise PriorError(f"bad --prior-strength '{text}': give a number >= 0 or 'cv'")
    return value


class PriorError(ValueError):
    """A prior strength that is neither a number >= 0 nor 'cv'."""


def refit(runs: list[MeasuredRun], profile: HardwareProfile, prior: float | str = "cv", loo: bool = True,
          data_note: str = "", jobs: int = 1) -> Refit:
    """Fit `profile`'s constants (from its pre-fit values) to `runs`; with `loo`, refit without each
    run in turn (in `jobs` processes), report the held-out errors and make the band from them."""
    base = prefit_profile(profile)
    scores: dict[float, float] = {}
    if prior == "cv":
        if len(runs) >= MIN_RUNS_FOR_CV:
            strength, scores = choose_prior_strength(runs, base)
        else:
            strength = ProfileFit().prior_strength
    else:
        strength = float(prior)
    note = data_note
    if scores:
        note += "; prior strength chosen by cross-validation, mean |log error| " + ", ".join(
            f"{k:g}: {v:.3f}" for k, v in scores.items())
    model = ProfileFit(prior_strength=strength, data_note=note).fit(runs, base)
    if not loo:
        return Refit(model, base, strength, scores, None, None, None)
    held = leave_one_out(runs, base, estimator=model, full_fit=model, jobs=jobs)
    report = accuracy_report(compare_held_out(held), "leave-one-out", base.describe())
    return Refit(model, base, strength, scores, held, report, band_of(held, model.profile_))


def band_of(held: list[HeldOutPrediction], profile: HardwareProfile) -> Band:
    """The 90% band from held-out log ratios, log(measured / predicted), for `profile`; and each
    regime's, a run's regime by the share of its step on the host as `profile` predicts it for a user
    (at the profile's own host, not the run's)."""
    share = [user_host_share(h.run, profile) for h in held]
    time = [float(np.log(h.run.step_time_s / h.step_time_s)) for h in held]
    with_energy = [i for i, h in enumerate(held) if h.run.gpu_energy_j]
    energy = [float(np.log(held[i].run.gpu_energy_j / held[i].gpu_energy_j)) for i in with_energy]
    return Band.from_residuals({"step_time_s": time, "gpu_energy_j": energy}, profile.to_json(),
                               source=f"leave-one-out of advisor fit over {len(held)} runs",
                               host_shares={"step_time_s": share, "gpu_energy_j": [share[i] for i in with_energy]})
