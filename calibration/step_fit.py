"""The calibration's own DeepSpeed steps (family ds_steps) -> the overhead terms it had carried.

A one-GPU calibration measures rates; DeepSpeed's overheads it starts from another machine's values
(calibration.carried). The short real steps of each family then move those carried time terms by
least squares (models.fit.ProfileFit: the carried value is the prior's centre, the prior's strength
chosen by the steps' leverage-corrected held-out error), on each step's own host probe. A term no
step responds to keeps its carried value and source; a fitted one says so. Measured terms (rates,
powers) are not moved, and the memory shares stay carried: the steps share one process, so their
pools are not their own (runs.record.SHARED_PROCESS_ADJUSTMENT).

The result stays a calibration (no `fit` record): a later `advisor fit` to the user's runs starts
from these values.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from calibration.rawlog import RawResult
from models.fit import ProfileFit, default_parameters
from models.held_out import choose_prior_strength
from models.measured_run import MeasuredRun
from models.profile import HardwareProfile
from models.profile_values import get_value, getattr_path, with_values
from models.term_basis import UNMEASURED, basis_of
from runs.record import Candidate, RunRecord, RunResult

FAMILY = "ds_steps"


@dataclass(frozen=True)
class StepError:
    case: str
    measured_s: float
    carried_s: float  # predicted with the carried terms
    fitted_s: float  # predicted after the fit
    held_out_s: float  # predicted had this step been left out (leverage-corrected)


@dataclass(frozen=True)
class StepFit:
    profile: dict
    fitted: dict[str, tuple[float, float]]  # term -> (carried value, fitted value)
    kept: list[str]  # carried terms no step responds to
    prior_strength: float
    steps: list[StepError]


def step_records(results: dict[str, RawResult]) -> list[RunRecord]:
    """The calibration's finished steps as run records (for `advisor fit`, and for the fit below)."""
    out = []
    for r in results.values():
        if r.family != FAMILY or r.status != "ok" or "candidate" not in r.data:
            continue
        result = RunResult.from_dict(r.data["result"])
        if result.status == "ok":
            out.append(RunRecord.now(Candidate(**r.data["candidate"]), result, notes=[f"calibration step {r.key}"]))
    return out


def carried_time_terms(profile: HardwareProfile, runs: list[MeasuredRun]) -> tuple:
    """The step-time constants the fit may move whose source is carried or a placeholder."""
    return tuple(p for p in default_parameters(profile, runs)
                 if p.kind == "time" and basis_of(getattr_path(profile, p.name).source) in UNMEASURED)


def fit_to_steps(profile_data: dict, results: dict[str, RawResult]) -> StepFit | None:
    """`profile_data` with its carried time terms fitted to the calibration's steps; None without steps."""
    from runs.measured import to_measured_run

    runs: list[MeasuredRun] = []
    for record in step_records(results):
        try:
            runs.append(to_measured_run(record))
        except ValueError:
            continue
    profile = HardwareProfile.model_validate(profile_data)
    terms = carried_time_terms(profile, runs)
    if len(runs) < 2 or not terms:
        return None
    note = f"the {len(runs)} DeepSpeed steps of this calibration (family {FAMILY})"
    strength, _, model = choose_prior_strength(
        runs, profile, estimator=ProfileFit(parameters=terms, fit_memory=False, data_note=note), whole_grid=True)
    fitted = {name: f for name, f in model.parameters_.items() if f.informed}
    sources = {name: (f"fitted: {f.value:.4g}{'' if f.std is None else f' +- {f.std:.3g}'} by least squares to the "
                      f"step time of {note}, prior strength {strength:g} toward the value it was "
                      f"{getattr_path(profile, name).source}")
               for name, f in fitted.items()}
    after = with_values(profile, {n: f.value for n, f in fitted.items()}, sources, validate=True)
    notes = (f"{after.provenance.notes} DeepSpeed overheads fitted to {note}: {', '.join(sorted(fitted)) or 'none'}; "
             f"kept as carried: {', '.join(sorted(p.name for p in terms if p.name not in fitted)) or 'none'}.")
    after = after.model_copy(update={"provenance": after.provenance.model_copy(update={"notes": notes})})
    return StepFit(profile=json.loads(after.to_json()),
                   fitted={n: (get_value(profile, n), f.value) for n, f in fitted.items()},
                   kept=sorted(p.name for p in terms if p.name not in fitted), prior_strength=strength,
                   steps=_errors(runs, profile, after, model))


def _errors(runs: list[MeasuredRun], before: HardwareProfile, after: HardwareProfile, model: ProfileFit) -> list[StepError]:
    from models.fit import RunEvaluator

    evaluate = RunEvaluator(runs)
    carried, fitted = evaluate(before).step_time_s, evaluate(after).step_time_s
    measured = np.array([r.step_time_s for r in runs])
    held = measured * np.exp(model.held_out_log_ratio_["time"])
    return [StepError(r.label, float(m), float(c), float(f), float(h))
            for r, m, c, f, h in zip(runs, measured, carried, fitted, held)]
