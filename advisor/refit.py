"""Choose the prior, fit, hold each run out, report, band: the one path from measured runs to a
refined profile that `advisor fit`, `advisor report --loo`, `recommend --validate --refit` and
`benchmarks/accuracy.py` all take."""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from advisor.accuracy import AccuracyReport, accuracy_report, compare_held_out, user_host_share
from models.band import POOL_METRIC, Band
from models.fit import ProfileFit, prefit_profile
from models.measured_run import MeasuredRun
from models.profile import HardwareProfile
from models.held_out import (PRIOR_GRID, PRIOR_GRID_BY_GROUP, HeldOutPrediction, PriorChoice, choose_prior_strength,
                             choose_prior_strength_by_group, k_fold, leave_one_out, leverage_held_out)

MIN_RUNS_FOR_CV = 4
# Up to this many runs the prior is chosen by holding each model out whole (a fit per model and strength:
# seconds here); above it, by the one fit's leverage-corrected residuals, which kept `advisor fit` of the
# 382 shipped runs at 41 s where a fit per model and strength would take many minutes.
MAX_RUNS_HELD_OUT_BY_MODEL = 60


@dataclass(frozen=True)
class Refit:
    model: ProfileFit  # fitted to every run: `model.profile_` is the refined profile
    base: HardwareProfile  # the pre-fit profile it started from
    prior_strength: float
    cv_scores: dict[float, float]  # prior strength -> mean |log error| of its runs held out
    prior_hurt: dict[float, list[str]]  # prior strength -> the models held out it predicted worse than the pre-fit
    released: tuple[str, ...]  # constants fitted at the weakest prior instead (models.held_out.release_constants)
    released_score: float | None  # the models' held-out mean |log error| with them released
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
          data_note: str = "", jobs: int = 1, progress: Callable[[str], None] = lambda message: None,
          folds: int | None = None, exact: bool = False) -> Refit:
    """Fit `profile`'s constants (from its pre-fit values) to `runs`, report the held-out errors and
    make the band from them. Each run is held out by its leverage-corrected residual of the one fit
    (`models.held_out.leverage_held_out`: seconds); with `folds`, by that many refits without a fold each;
    with `exact`, by a refit without each run (`jobs` processes; an hour on 300 runs and two cores).
    A prior strength of 'cv' is chosen by the error of runs held out (`_chosen_prior_fit`)."""
    base = prefit_profile(profile)
    workers = min(len(runs), jobs if jobs > 0 else os.cpu_count() or 1)
    started = time.monotonic()
    if prior == "cv" and len(runs) >= MIN_RUNS_FOR_CV:
        choice = _chosen_prior_fit(runs, base, data_note, jobs, workers, progress)
    else:
        strength = ProfileFit().prior_strength if prior == "cv" else float(prior)
        progress(f"fitting {len(runs)} runs...")
        choice = PriorChoice(strength, {}, ProfileFit(prior_strength=strength, data_note=data_note).fit(runs, base), {})
    model = choice.fit
    fit_s = time.monotonic() - started

    def done(held, report, band) -> Refit:
        return Refit(model, base, choice.strength, choice.scores, choice.hurt, choice.released, choice.released_score,
                     held, report, band)

    if not loo:
        return done(None, None, None)
    on_fold = _fold_progress(len(runs), progress)
    if folds:
        progress(f"fitted in {fit_s:.0f} s; now {folds} folds held out in turn ({folds} refits on {workers} "
                 f"processes)")
        held = k_fold(runs, base, folds, estimator=model, full_fit=model, jobs=jobs, on_fold=on_fold)
        how = f"{folds}-fold cross-validation"
    elif exact:
        progress(f"fitted in {fit_s:.0f} s; now each run left out in turn ({len(runs)} refits on {workers} "
                 f"processes, each starting from this fit's values): the tenths below tell")
        held = leave_one_out(runs, base, estimator=model, full_fit=model, jobs=jobs, on_fold=on_fold)
        how = "leave-one-out"
    else:
        held = leverage_held_out(runs, model)
        how = "leave-one-out, leverage-corrected"
    report = accuracy_report(compare_held_out(held), how, base.describe())
    band = band_of(held, model.profile_, how)
    if not np.isfinite(band.step_time_s.high_log):
        progress(f"no band: {len(held)} runs held out are too few to bound {band.level:.0%} of new runs")
        band = None
    return done(held, report, band)


def _chosen_prior_fit(runs: list[MeasuredRun], base: HardwareProfile, data_note: str, jobs: int, workers: int,
                      progress: Callable[[str], None]) -> PriorChoice:
    """The prior strength whose runs held out miss least, its scores, its fit and the models each strength
    hurt. Few runs of several models hold each model out whole, and a strength that predicts some model
    worse than the pre-fit profile is not chosen (constants that help alone are then released from it);
    more runs, or runs of one model, are held out one by one through the one fit's leverage (no model is
    judged apart there)."""
    models = [r.workload.arch.name for r in runs]
    by_model = len(runs) <= MAX_RUNS_HELD_OUT_BY_MODEL and len(set(models)) > 1
    grid = PRIOR_GRID_BY_GROUP if by_model else PRIOR_GRID
    listed = ", ".join(f"{g:g}" for g in grid)
    if by_model:
        how = (f"each model's runs held out in turn ({len(set(models))} models), to keep the strength that misses "
               "an unseen model least; then each constant freed from it in turn where that helps (a fit per model "
               "and constant: minutes for 30 runs)")
        chosen_by = ("the error of each model's runs fitted without them, among the strengths that predict no "
                     "model worse than before the fit")
    else:
        how = f"on {min(workers, len(grid))} processes, to keep the one whose runs held out miss least"
        chosen_by = "the leave-one-out error (leverage-corrected residuals)"
    progress(f"fitting {len(runs)} runs at prior strengths {listed}, {how}...")
    estimator = ProfileFit(data_note=(f"{data_note}; " if data_note else "")
                           + f"prior strength chosen from {listed} by {chosen_by}")
    if by_model:
        return choose_prior_strength_by_group(runs, base, models, estimator=estimator, jobs=jobs)
    strength, scores, model = choose_prior_strength(runs, base, estimator=estimator, jobs=jobs)
    return PriorChoice(strength, scores, model, {})


def to_stderr(message: str) -> None:
    """`refit`'s progress where a command shows it: stderr, so --json output stays one object."""
    print(message, file=sys.stderr, flush=True)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _fold_progress(total: int, progress: Callable[[str], None]) -> Callable[[int], None]:
    """Tells `progress` at every tenth of the refits how many are done and how long the rest should take."""
    started = time.monotonic()
    step = max(1, total // 10)

    def on_fold(done: int) -> None:
        if done % step == 0 or done == total:
            spent = time.monotonic() - started
            progress(f"left out {done} of {total} runs in {_minutes(spent)}"
                     + (f"; about {_minutes(spent / done * (total - done))} to go" if done < total else ""))
    return on_fold


def band_of(held: list[HeldOutPrediction], profile: HardwareProfile, how: str = "leave-one-out") -> Band:
    """The 90% band from held-out log ratios, log(measured / predicted), for `profile`; and each
    regime's, a run's regime by the share of its step on the host as `profile` predicts it for a user
    (at the profile's own host, not the run's); and the pool's, over the runs that measured it."""
    share = [user_host_share(h.run, profile) for h in held]
    time = [float(np.log(h.run.step_time_s / h.step_time_s)) for h in held]
    with_energy = [i for i, h in enumerate(held) if h.run.gpu_energy_j]
    energy = [float(np.log(held[i].run.gpu_energy_j / held[i].gpu_energy_j)) for i in with_energy]
    pool = [float(np.log(h.run.peak_gpu_reserved_gib / h.reserved_gpu_mem_gib)) for h in held
            if h.run.peak_gpu_reserved_gib and h.reserved_gpu_mem_gib > 0]
    return Band.from_residuals({"step_time_s": time, "gpu_energy_j": energy, POOL_METRIC: pool}, profile.to_json(),
                               source=f"{how} of advisor fit over {len(held)} runs",
                               host_shares={"step_time_s": share, "gpu_energy_j": [share[i] for i in with_energy]})
