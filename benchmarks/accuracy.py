"""The numbers of record: how well the shipped profile predicts the shipped real runs.

    python benchmarks/accuracy.py [--profile h200] [--runs 'data/runs/*.jsonl'] [--plot PNG] [--json]
    python benchmarks/accuracy.py --markdown > docs/ACCURACY.md

Leave-one-out: for each shipped run, the profile's constants are refitted (from the profile's
pre-fit values, `models.fit.prefit_profile`) to the other runs, and that profile predicts the
held-out run, the way `advisor fit` fits (prior strength by 5-fold cross-validation on all the
runs: the one choice that sees every run). The table (step-time and GPU-energy MAPE, worst error, rank correlation, allocated
GPU memory, per strategy family) is printed against the targets of issue 4, PASS or MISS:
MAPE <= 5%, worst < 15%, memory within 10%, least-energy pick within 3% of the best measured.
The shipped profile's own in-sample error is printed after it for comparison, marked as such.

`--markdown` refits nothing: it writes the accuracy report of record (docs/ACCURACY.md) in seconds from
the profile's stored fit report (its 5-fold cross-validation), the shipped runs as the shipped profile
predicts them, the predictions committed before their runs, and memory (benchmarks/accuracy_doc.py).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from advisor.accuracy import accuracy_report, compare_as_is, format_report  # noqa: E402
from advisor.refit import refit, to_stderr  # noqa: E402
from models.profile import load_profile  # noqa: E402
from runs.measured import gather_records, to_run_set  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--profile", default="h200", help="shipped profile name or JSON path (default h200)")
    p.add_argument("--runs", default=str(REPO / "data/runs/*.jsonl"), help="glob of run files")
    p.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    p.add_argument("--plot", type=Path, help="write the leave-one-out predicted-against-measured plot (PNG) here")
    p.add_argument("--markdown", action="store_true",
                   help="print the accuracy report of record as Markdown from the stored fit report; no refit (seconds)")
    args = p.parse_args(argv)
    if args.markdown:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from accuracy_doc import markdown

        print(markdown(args.profile))
        return 0

    paths = sorted(glob.glob(args.runs))
    if not paths:
        print(f"no run files match {args.runs}: nothing to measure against", file=sys.stderr)
        return 1
    run_set = to_run_set(gather_records(paths))
    if not run_set.runs:
        print(f"no successful runs in {', '.join(paths)} ({run_set.summary()})", file=sys.stderr)
        return 1
    profile = load_profile(args.profile)
    start = time.perf_counter()
    done = refit(run_set.runs, profile, data_note=", ".join(paths), jobs=os.cpu_count() or 1,
                 progress=to_stderr)
    seconds = time.perf_counter() - start
    loo, strength, scores = done.report, done.prior_strength, done.cv_scores
    as_is = accuracy_report(compare_as_is(run_set.runs, profile), "as-is, in-sample where fitted to these runs",
                            profile.describe())
    if args.plot:
        from advisor.plot import accuracy_plot

        accuracy_plot(loo, args.plot)
    if args.json:
        print(json.dumps({"runs": paths, "summary": run_set.summary(), "seconds": seconds,
                          "prior_strength": strength, "cross_validation": {str(k): v for k, v in scores.items()},
                          "leave_one_out": loo.to_dict(), "as_is": as_is.to_dict(),
                          "band": json.loads(done.band.to_json()) if done.band else None}))
        return 0
    print(f"runs: {', '.join(Path(x).name for x in paths)}: {run_set.summary()}")
    for line in run_set.skipped:
        print(f"  unusable: {line}")
    if scores:
        print("prior strength by the runs held out (mean |log error|): "
              + ", ".join(f"{k:g}: {v:.3f}" for k, v in scores.items()) + f"; chose {strength:g}")
    held = (f"the 90% band held {done.band.step_time_s.loo_coverage:.0%} (time) and "
            f"{done.band.gpu_energy_j.loo_coverage:.0%} (energy) of the runs, each left out" if done.band
            else "too few runs for a 90% band")
    print(f"{loo.mode}: {len(done.held)} runs, {seconds:.0f} s with the choice of the prior; {held}\n")
    print(format_report(loo))
    print()
    print(format_report(as_is))
    return 0


if __name__ == "__main__":
    sys.exit(main())
