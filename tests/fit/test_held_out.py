"""Leave-one-out and k-fold: small error where the runs inform the held-out run, no leak of the held-out
run into its own fit, and honest error where only that run informed a constant."""
from __future__ import annotations

import numpy as np
import pytest
from synthetic import synthetic_runs

from models.fit import ProfileFit, RunEvaluator, fitted_run_ids
from models.held_out import k_fold, leave_one_out
from models.predict import predict


@pytest.fixture(scope="module")
def small_fit(small_runs, base):
    return ProfileFit().fit(small_runs, base)


@pytest.fixture(scope="module")
def held(small_runs, base, small_fit):
    return leave_one_out(small_runs, base, full_fit=small_fit)


def test_loo_error_is_small_on_a_well_covered_machine(held, small_runs):
    assert [h.run for h in held] == small_runs
    time_err = np.array([h.step_time_s / h.run.step_time_s - 1 for h in held])
    energy_err = np.array([h.gpu_energy_j / h.run.gpu_energy_j - 1 for h in held])
    # 1% measurement noise: held-out errors of a few percent at most, except runs whose
    # family only they inform (asserted below), so look at the typical error.
    assert np.median(np.abs(time_err)) < 0.02
    assert np.median(np.abs(energy_err)) < 0.02


def test_folds_shared_among_processes_give_what_one_process_gives(small_runs, base, small_fit, held):
    """The refits are independent: two worker processes return the same folds, in run order."""
    shared = leave_one_out(small_runs, base, full_fit=small_fit, jobs=2)
    assert [h.run.run_id for h in shared] == [h.run.run_id for h in held]
    assert [h.step_time_s for h in shared] == pytest.approx([h.step_time_s for h in held], rel=1e-9)
    assert [h.gpu_energy_j for h in shared] == pytest.approx([h.gpu_energy_j for h in held], rel=1e-9)


def test_held_out_run_never_informs_its_own_fold(held):
    for h in held:
        assert h.profile.provenance.kind == "fitted"
        ids = fitted_run_ids(h.profile)
        assert len(ids) == 15 and h.run.run_id not in ids


def test_a_family_measured_once_is_predicted_from_the_start_values_when_held_out(specs, base):
    # One ZeRO-3 run among ZeRO-0/1/2 runs: it alone informs the ZeRO-3 hook cost. Held out,
    # that constant stays at its start (0 s) and the run's error shows it, not hidden by the fit.
    chosen = [specs[i] for i in (0, 7, 8, 1, 5, 21, 22, 25, 41)]
    runs = synthetic_runs(noise=0.005, seed=6, specs=chosen)
    i = next(k for k, r in enumerate(runs) if r.strategy.zero_stage == 3)
    full = ProfileFit(prior_strength=1e-6).fit(runs, base)  # 9 runs: a default-strength prior would dominate
    assert full.parameters_["overheads.zero3_module_pass"].informed
    fold = leave_one_out(runs, base, full_fit=full)[i]
    assert fold.profile.overheads.zero3_module_pass.value == base.overheads.zero3_module_pass.value
    in_sample = predict(runs[i].workload, runs[i].strategy, full.profile_).step_time_s
    assert abs(in_sample / runs[i].step_time_s - 1) < 0.02
    assert fold.step_time_s / runs[i].step_time_s - 1 < -0.03  # the hooks' time is missing


def test_warm_started_folds_agree_with_cold_refits(small_specs, base):
    """The warm start and the shared probe are shortcuts, not approximations."""
    runs = synthetic_runs(noise=0.03, seed=3, specs=small_specs)
    quick = leave_one_out(runs, base)
    for i in (5, 11):
        cold = ProfileFit().fit(runs[:i] + runs[i + 1:], base).profile_
        p = predict(runs[i].workload, runs[i].strategy, cold)
        assert quick[i].step_time_s == pytest.approx(p.step_time_s, rel=2e-3)
        assert quick[i].gpu_energy_j == pytest.approx(p.gpu_energy_j, rel=2e-3)


def test_cross_validation_prefers_the_prior_that_predicts_held_out_runs(small_specs, base):
    from models.held_out import choose_prior_strength

    # Precise runs of a machine far from the start: a strong prior holds the constants back.
    runs = synthetic_runs(noise=0.002, seed=9, specs=small_specs[:10])
    best, scores, model = choose_prior_strength(runs, base, grid=(1e-3, 10.0))
    assert best == 1e-3 and scores[1e-3] < scores[10.0]
    assert model.prior_strength == best
    # every strength is an independent fit: shared among processes, the same scores
    shared = choose_prior_strength(runs, base, grid=(1e-3, 10.0), jobs=2)
    assert shared[0] == best and shared[1] == pytest.approx(scores, rel=1e-9)
    # once the error rises, stronger priors are not tried
    walked = choose_prior_strength(runs, base, grid=(1e-3, 10.0, 100.0))
    assert list(walked[1]) == [1e-3, 10.0] and walked[0] == best
    # unless the whole grid is asked for (a calibration's few steps): each is tried, the least error kept
    every = choose_prior_strength(runs, base, grid=(1e-3, 10.0, 100.0), whole_grid=True)
    assert list(every[1]) == [1e-3, 10.0, 100.0] and every[0] == min(every[1], key=every[1].get)


def test_leverage_corrected_residuals_track_exact_leave_one_out(small_specs, base):
    """One fit's runs as if held out (r / (1 - h)) against refits without each run: the linearised
    leave-one-out is what makes the band cheap, so it must be near the exact one, and further from the
    fit's own residuals where a run pulls its constants."""
    from models.held_out import leverage_held_out

    runs = synthetic_runs(noise=0.03, seed=3, specs=small_specs)
    model = ProfileFit(prior_strength=0.01).fit(runs, base)
    quick = leverage_held_out(runs, model)
    exact = leave_one_out(runs, base, estimator=model, full_fit=model)
    quick_err = np.array([np.log(h.step_time_s / h.run.step_time_s) for h in quick])
    exact_err = np.array([np.log(h.step_time_s / h.run.step_time_s) for h in exact])
    in_sample = np.log(RunEvaluator(runs)(model.profile_).step_time_s / [r.step_time_s for r in runs])
    assert np.mean(np.abs(quick_err)) > np.mean(np.abs(in_sample))  # held out, a run is predicted worse
    close = np.abs(quick_err - exact_err) <= 0.2 * np.abs(exact_err) + 0.005
    # the linearisation's blind spot: a run that alone pulls a constant off its prior (here one of 16)
    assert np.sum(~close) <= 1


def test_a_refit_says_what_it_does_and_how_far_exact_refits_are(small_runs, base):
    """advisor.refit.refit: what it fits; with exact leave-one-out, at every tenth of the refits how many
    are done; the last message says all are. Without --exact, no refits: the held-out errors come from
    the one fit."""
    from advisor.refit import refit

    messages = []
    done = refit(small_runs, base, prior=0.01, jobs=1, progress=messages.append, exact=True)
    n = len(small_runs)
    assert messages[0] == f"fitting {n} runs..."
    assert messages[1].startswith("fitted in ") and f"({n} refits on 1 processes" in messages[1]
    folds = [m for m in messages[2:] if m.startswith("left out ")]
    assert len(folds) >= 2 and folds[-1].startswith(f"left out {n} of {n} runs") and "to go" not in folds[-1]
    assert "to go" in folds[0]
    assert len(done.held) == n and done.report.mode == "leave-one-out"
    quick = refit(small_runs, base, prior=0.01, jobs=1)
    assert len(quick.held) == n and quick.report.mode == "leave-one-out, leverage-corrected"
    quiet = []
    refit(small_runs, base, prior=0.01, loo=False, progress=quiet.append)
    assert quiet == [f"fitting {n} runs..."]  # no refits, no estimate of them


def test_k_fold_predicts_every_run_once_in_order_from_a_fit_without_its_fold(small_runs, base, small_fit):
    held = k_fold(small_runs, base, 4, full_fit=small_fit)
    assert [h.run.run_id for h in held] == [r.run_id for r in small_runs]
    folds = {}
    for h in held:
        ids = fitted_run_ids(h.profile)
        assert h.run.run_id not in ids  # its own fold is left out of its fit
        folds.setdefault(frozenset(ids), []).append(h.run.run_id)
    assert len(folds) == 4 and sum(len(v) for v in folds.values()) == len(small_runs)
    for ids, members in folds.items():  # each fit holds out exactly the runs it predicts
        assert ids | set(members) == {r.run_id for r in small_runs} and not ids & set(members)
    time_err = np.array([h.step_time_s / h.run.step_time_s - 1 for h in held])
    assert np.median(np.abs(time_err)) < 0.03
    first = held[0]
    again = predict(first.run.workload, first.run.strategy, first.run.on_its_host(first.profile))
    assert first.step_time_s == pytest.approx(again.step_time_s)


def test_the_fit_bands_the_pool_over_the_held_out_runs_that_measured_it(all_runs, base):
    """`band_of`: the pool's band is made of log(measured / predicted pool) of the runs with a measured
    pool; a run without one, or without a predicted pool, gives no ratio."""
    import dataclasses

    from advisor.refit import band_of
    from models.held_out import HeldOutPrediction

    ratios = np.linspace(-0.2, 0.1, 30)
    held = []
    for i, run in enumerate(all_runs[:32]):
        measured_pool = 10.0 + i if i < 30 else None  # the last two measured no pool
        run = dataclasses.replace(run, peak_gpu_reserved_gib=measured_pool)
        predicted_pool = measured_pool / np.exp(ratios[i]) if measured_pool else float("nan")
        held.append(HeldOutPrediction(run, run.step_time_s, run.gpu_energy_j or 1.0, 1.0, predicted_pool, base))
    band = band_of(held, base, "test")
    assert band.reserved_gpu_mem_gib.runs == 30
    assert (band.reserved_gpu_mem_gib.low_log, band.reserved_gpu_mem_gib.high_log) == pytest.approx((-0.2, 0.1))
    assert band.step_time_s.runs == 32  # every run has a step time


def _h100_runs(name: str):
    from pathlib import Path

    from runs.jsonl import read_records
    from runs.measured import to_run_set

    path = Path(__file__).resolve().parents[2] / "data" / "runs" / "h100" / name
    return to_run_set(read_records(path)).runs


def test_few_runs_of_two_models_choose_the_prior_by_holding_each_model_out():
    """Five lent-H100 runs of two models: leaving one run out chose the weakest prior, whose fit priced the
    runs of other models far off; holding each model out chooses a prior that keeps them."""
    import numpy as np

    from advisor.refit import refit
    from models.fit import RunEvaluator
    from models.held_out import PRIOR_GRID, PRIOR_GRID_BY_GROUP
    from models.profile import load_profile

    flow = _h100_runs("h100-x1-flow-2026-12-06.jsonl")
    others = _h100_runs("h100-x1-derived-heldout-2026-12-06.jsonl")  # models the five runs do not hold
    from pathlib import Path

    base = load_profile(str(Path(__file__).resolve().parents[2] / "data" / "calibration" / "h100"
                            / "h100-steps-calibrated-refit-2026-12-06.json"))
    done = refit(flow, base, "cv", loo=False)
    unhurt = [s for s in done.cv_scores if not done.prior_hurt[s]]
    assert set(done.cv_scores) == set(PRIOR_GRID_BY_GROUP) and done.prior_strength == min(unhurt, key=done.cv_scores.get)
    assert "each model's runs fitted without them" in done.model.profile_.provenance.notes
    weakest = refit(flow, base, PRIOR_GRID[0], loo=False)

    def mape(profile) -> float:
        predicted = RunEvaluator(others)(profile).step_time_s
        return float(np.mean(np.abs(predicted / np.array([r.step_time_s for r in others]) - 1)))

    assert mape(done.model.profile_) < mape(weakest.model.profile_)


def test_a_prior_that_predicts_some_model_worse_than_before_the_fit_is_not_chosen_however_well_it_averages():
    """24 H100 runs of eight models: the prior 0.1 misses least on average (it moves the offload terms,
    and ZeRO-3 offload of a 3B model comes closer) but prices a 0.5B model's host-bound step further off
    than the calibration did; the guard keeps the strength that hurts no model."""
    from pathlib import Path

    from models.fit import prefit_profile
    from models.held_out import choose_prior_strength_by_group
    from models.profile import load_profile

    runs = [r for name in ("h100-x1-calibration-steps-2026-12-06.jsonl", "h100-x1-derived-heldout-2026-12-06.jsonl",
                           "h100-x1-flow-2026-12-06.jsonl", "h100-x1-unseen-2026-12-06.jsonl") for r in _h100_runs(name)]
    base = prefit_profile(load_profile(str(Path(__file__).resolve().parents[2] / "data" / "calibration" / "h100"
                                           / "h100-steps-calibrated-refit-2026-12-06.json")))
    choice = choose_prior_strength_by_group(runs, base, [r.workload.arch.name for r in runs], grid=(0.1, 100.0))
    assert choice.scores[0.1] < choice.scores[100.0]  # the average alone would take the weaker
    assert "qwen2.5-0.5b" in choice.hurt[0.1] and choice.hurt[100.0] == []
    assert choice.strength == 100.0


def test_a_constant_that_helps_every_model_held_out_is_released_from_a_prior_the_guard_kept_strong():
    """29 H100 runs of eight models from the fifth lease's calibration: the guard keeps prior 10 (weaker ones
    hurt the 0.5B model), which held SuperOffload's per-parameter price at its 0.6B step. Freed alone, it is
    fitted on the 1.7B and 3B SuperOffload runs: every model held out comes out no worse, and the mean
    better; a constant whose release helps nothing stays held."""
    from pathlib import Path

    from models.fit import ProfileFit, prefit_profile
    from models.held_out import _scored_by_group, groups_before_fit, release_constants
    from models.profile import load_profile

    runs = [r for name in ("h100-x1-calibration-steps-2026-12-06.jsonl", "h100-x1-derived-heldout-2026-12-06.jsonl",
                           "h100-x1-flow-2026-12-06.jsonl", "h100-x1-unseen-2026-12-06.jsonl",
                           "h100-x1-unseen-2-2026-12-06.jsonl") for r in _h100_runs(name)]
    base = prefit_profile(load_profile(str(Path(__file__).resolve().parents[2] / "data" / "calibration" / "h100"
                                           / "h100-steps-calibrated-lease5-2026-12-06.json")))
    held, before = groups_before_fit(runs, base, [r.workload.arch.name for r in runs])
    settings = {**ProfileFit().get_params(), "prior_strength": 10.0, "released_prior_strength": 1e-3}
    [(held_strong, _)] = _scored_by_group(runs, base, held, [settings], jobs=1)
    super_price = "overheads.super_offload_step_per_gparam"
    released, score = release_constants(runs, base, held, before, settings,
                                        [super_price, "overlap.compute_slowdown_with_collective"], held_strong)
    assert released == (super_price,)  # no run here has a collective: nothing to gain by freeing that one
    assert score < held_strong - 0.001
