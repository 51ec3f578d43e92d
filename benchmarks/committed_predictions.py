"""Predictions committed before the runs they predict, against those runs: one row per sweep.

    python benchmarks/committed_predictions.py [--json]

Each `data/sweeps/NAME.predicted.jsonl` was committed before its runs were made (git log shows
the order); its keys are matched with the measured records of `data/runs/*.jsonl`. These are
the out-of-sample errors of the model as it stood at that commit, apart from leave-one-out
(benchmarks/accuracy.py). Errors are 100 (predicted - measured) / measured.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from runs.jsonl import read_records  # noqa: E402

METRICS = (("step time", "step_time_s", "step_time_s"), ("GPU energy", "gpu_energy_j", "gpu_energy_j"),
           ("allocated memory", "allocated_gpu_mem_gib", "peak_gpu_mem_gib"))


def measured_by_key() -> dict:
    """The latest ok record of each run key, and of each label, in the shipped run files (sweeps
    predicted before a run key changed, 2026-11-30, are matched by their label)."""
    out = {}
    for path in sorted((REPO / "data" / "runs").glob("*.jsonl")):
        for r in read_records(path):
            if r.result.status == "ok":
                out[r.key] = r
                out[r.candidate.label] = r
    return out


def sweep_errors(predicted_path: Path, measured: dict) -> dict:
    rows = [json.loads(line) for line in predicted_path.read_text().splitlines() if line.strip()]
    runs = []
    for row in rows:
        record = measured.get(row["key"]) or measured.get(row["label"])
        if record is None or not row.get("prediction"):
            continue
        errors = {}
        for name, pkey, mkey in METRICS:
            p, m = row["prediction"].get(pkey), getattr(record.result, mkey)
            errors[name] = None if p is None or not m else 100.0 * (p - m) / m
        runs.append({"label": row["label"], "errors_pct": errors})
    summary = {}
    for name, _, _ in METRICS:
        values = [r["errors_pct"][name] for r in runs if r["errors_pct"][name] is not None]
        summary[name] = ({"mape_pct": sum(map(abs, values)) / len(values), "worst_pct": max(values, key=abs)}
                         if values else None)
    return {"sweep": predicted_path.name.removesuffix(".predicted.jsonl"), "predicted": len(rows), "measured": len(runs), "summary": summary,
            "runs": runs}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    args = p.parse_args(argv)
    measured = measured_by_key()
    results = [sweep_errors(path, measured) for path in sorted((REPO / "data" / "sweeps").glob("*.predicted.jsonl"))]
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    table = Table(title="Predictions committed before the runs (MAPE / worst, %)")
    table.add_column("sweep", no_wrap=True)
    table.add_column("runs", justify="right")
    for name, _, _ in METRICS:
        table.add_column(name, justify="right")
    for res in results:
        cells = [f"{s['mape_pct']:.1f} / {s['worst_pct']:+.1f}" if s else "-" for s in res["summary"].values()]
        table.add_row(res["sweep"], f"{res['measured']} of {res['predicted']}", *cells)
    console = Console(width=max(120, Console().width))
    console.print(table)
    if any(not res["measured"] for res in results):
        console.print("A sweep with no run matched predates the run labels of today's records: "
                      "benchmarks/scale_out.py reads its pre-run predictions from the records themselves.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
