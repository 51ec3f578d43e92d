"""Write a sweep's predictions before its runs are made: data/sweeps/NAME.predicted.jsonl.

    python lab/predict_sweep.py data/sweeps/NAME.jsonl [--profile h200]

One line per candidate, keyed as `advisor validate` keys the run, with the shipped model's
prediction. Commit the file before the device call: `benchmarks/committed_predictions.py`
compares it with the runs afterwards, apart from leave-one-out.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from advisor.validate import SweepFileError, predicted_sweep  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sweep", type=Path)
    p.add_argument("--profile", default="h200")
    args = p.parse_args(argv)
    try:
        predicted = predicted_sweep(args.sweep, args.profile)
    except (OSError, SweepFileError) as exc:
        print(f"predict_sweep: {exc}", file=sys.stderr)
        return 1
    out = args.sweep.with_name(args.sweep.name.removesuffix(".jsonl") + ".predicted.jsonl")
    lines = [json.dumps({"key": entry.candidate.key(), "label": entry.candidate.label, "profile": entry.profile,
                         "notes": entry.notes, "prediction": entry.prediction}) for entry in predicted]
    out.write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} predictions -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
