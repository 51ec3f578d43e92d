"""Cross-validation by group: does the fit help every regime, or only the average?

    python benchmarks/grouped_cv.py [--runs GLOB ...] [--profile h200] [--by gpus|model|zero3-gpus ...] [--json]

Random folds let a regime's own runs into its fit. Here each group (a GPU count, a model, ZeRO-3 at a
GPU count) is held out whole: the profile is fitted to the other groups' runs (scikit-learn's GroupKFold,
at most `--folds` fits a grouping) and predicts the held-out group's runs on their probed hosts, beside the
profile before any fit (`models.fit.prefit_profile`). A group the fit predicts worse than the pre-fit
profile is a regime a fitted constant hurts: a missing structure, not noise. Step time and GPU energy,
MAPE and worst, per group.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from sklearn.model_selection import GroupKFold

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from models.fit import ProfileFit, RunEvaluator, prefit_profile  # noqa: E402
from models.measured_run import MeasuredRun  # noqa: E402
from models.profile import load_profile  # noqa: E402
from runs.measured import add_runs_option, gather_records, run_files, to_run_set  # noqa: E402

GROUPINGS = {
    "gpus": lambda r: f"{r.strategy.gpus} GPU",
    "model": lambda r: r.workload.arch.name,
    "zero3-gpus": lambda r: f"ZeRO-{'3' if r.strategy.zero_stage == 3 else '0-2'} on {r.strategy.gpus} GPU",
}


def errors(runs: list[MeasuredRun], profile) -> tuple[np.ndarray, np.ndarray]:
    """Relative step time and GPU energy errors of `runs` on `profile`, each on its probed host."""
    pred = RunEvaluator(runs)(profile)
    t = pred.step_time_s / np.array([r.step_time_s for r in runs]) - 1
    e = np.array([p / r.gpu_energy_j - 1 if r.gpu_energy_j else np.nan for p, r in zip(pred.gpu_energy_j, runs)])
    return t, e


def grouped(runs: list[MeasuredRun], base, by: str, folds: int, prior: float) -> list[dict]:
    """One row a group: its runs predicted by a fit to the other groups, and by the pre-fit profile."""
    labels = np.array([GROUPINGS[by](r) for r in runs])
    n_folds = min(folds, len(set(labels)))
    held_t, held_e = np.full(len(runs), np.nan), np.full(len(runs), np.nan)
    for train, test in GroupKFold(n_splits=n_folds).split(runs, groups=labels):
        fitted = ProfileFit(prior_strength=prior).fit([runs[i] for i in train], base).profile_
        held_t[test], held_e[test] = errors([runs[i] for i in test], fitted)
    pre_t, pre_e = errors(runs, base)
    rows = []
    for label in sorted(set(labels)):
        m = labels == label
        rows.append({"grouping": by, "group": label, "runs": int(m.sum()),
                     "prefit": _summary(pre_t[m], pre_e[m]), "held_out_fit": _summary(held_t[m], held_e[m])})
    return rows


def _summary(t: np.ndarray, e: np.ndarray) -> dict:
    e = e[np.isfinite(e)]
    return {"time_mape": float(np.mean(np.abs(t))), "time_worst": float(t[np.argmax(np.abs(t))]),
            "energy_mape": float(np.mean(np.abs(e))) if len(e) else None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_runs_option(p)
    p.add_argument("--profile", default="h200")
    p.add_argument("--by", action="append", choices=sorted(GROUPINGS), help="groupings (default: all)")
    p.add_argument("--folds", type=int, default=5, help="fits a grouping at most (GroupKFold)")
    p.add_argument("--prior-strength", type=float, default=1e-3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    runs = to_run_set(gather_records([str(f) for f in run_files(args.runs) if f.parent.name != "excluded"],
                                     None)).runs
    base = prefit_profile(load_profile(args.profile))
    rows = [row for by in args.by or sorted(GROUPINGS) for row in grouped(runs, base, by, args.folds,
                                                                          args.prior_strength)]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{len(runs)} runs; profile {args.profile} before its fit, and fitted without each group "
          f"(prior strength {args.prior_strength:g}); step time MAPE / worst, GPU energy MAPE, %")
    print(f"{'group':34} {'runs':>5}  {'pre-fit':>22}  {'fit without the group':>24}  verdict")
    for r in rows:
        a, b = r["prefit"], r["held_out_fit"]
        cell = (lambda s: f"{100 * s['time_mape']:5.1f} / {100 * s['time_worst']:+6.1f}, "
                          f"{100 * s['energy_mape']:5.1f}" if s["energy_mape"] is not None else "-")
        verdict = "fit helps" if b["time_mape"] <= a["time_mape"] else "FIT HURTS"
        print(f"{r['grouping'] + ': ' + r['group']:34} {r['runs']:>5}  {cell(a):>22}  {cell(b):>24}  {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
