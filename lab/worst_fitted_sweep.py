"""Write a sweep of the fitted settings that leave-one-out predicts worst, to measure them again.

    python lab/worst_fitted_sweep.py data/sweeps/NAME.jsonl [--gpus 1] [--count 20] [--skip 0] [--max-step-s 1.5]

A fitted run predicted badly with the run left out is a question: is the model wrong there, or was
the host slower or faster than the probe taken for it said? The same setting measured again, with
the issue probe on both sides of its window, tells the two apart. Each line runs the record's own
DeepSpeed config, so the new run gets the old one's key and `runs.measured` averages the two.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from advisor.validate import candidates_from_sweep  # noqa: E402
from runs.measured import shipped_run_files  # noqa: E402
from runs.jsonl import read_records  # noqa: E402


def shipped_by_key() -> dict:
    """The fitted shipped runs by key, the latest of each (its config is the key's)."""
    records = {}
    for path in shipped_run_files(with_excluded=False):
        for record in read_records(path):
            if record.candidate.strategy is not None:
                records[record.key] = record
    return records


def worst_keys(report: dict, records: dict, gpus: int, max_step_s: float) -> list[tuple[float, str]]:
    """(larger of the time and energy errors, run key) of the report's held-out runs (leave-one-out's
    or k-fold's) on `gpus` GPUs (as their records say), worst first."""
    out = []
    held = report.get("leave_one_out") or report["held_out"]  # leave-one-out's runs, or k-fold's
    for run in held["runs"]:
        measured, predicted = run["measured"], run["predicted"]
        record = records.get(run["run_id"])
        if record is None or record.candidate.gpus != gpus or measured["step_time_s"] > max_step_s:
            continue
        errors = [abs(predicted[k] / measured[k] - 1) for k in ("step_time_s", "gpu_energy_j") if measured.get(k)]
        out.append((max(errors), run["run_id"]))
    return sorted(out, reverse=True)


def sweep_line(record) -> dict:
    c = record.candidate
    line = {"label": c.label, "model": c.model, "seq": c.seq_len, "loss_dtype": c.loss_dtype,
            "ds_config": c.ds_config, "strategy": c.strategy}
    for name, default in (("images", 0), ("frames", 0), ("image_size", None), ("freeze_vision", False)):
        if getattr(c, name) != default:
            line[name] = getattr(c, name)
    return line


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--report", type=Path, default=REPO / "data" / "profiles" / "h200.fit-report.json")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--count", type=int, default=20)
    p.add_argument("--skip", type=int, default=0, help="leave out the N worst (a sweep before this one has them)")
    p.add_argument("--max-step-s", type=float, default=1.5, help="leave out settings whose steps take longer")
    args = p.parse_args(argv)
    if args.count < 1 or args.gpus < 1 or args.skip < 0:
        p.error("--count and --gpus must be positive, --skip not negative")
    try:
        report = json.loads(args.report.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        p.error(f"cannot read the fit report: {exc}")
    records = shipped_by_key()
    worst = [records[key] for _, key in worst_keys(report, records, args.gpus, args.max_step_s)]
    chosen = worst[args.skip:args.skip + args.count]
    try:
        args.out.write_text("".join(json.dumps(sweep_line(r)) + "\n" for r in chosen))
    except OSError as exc:
        p.error(f"cannot write the sweep: {exc}")
    keys = [c.key() for c in candidates_from_sweep(args.out)]
    moved = [r.candidate.label for r, key in zip(chosen, keys) if key != r.key]
    if moved:
        args.out.unlink()
        print(f"worst_fitted_sweep: these lines would not share their run's key: {moved}", file=sys.stderr)
        return 1
    print(f"{len(chosen)} settings -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
