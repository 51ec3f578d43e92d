"""A new cluster as a user meets it, on the lent H100 of data/calibration/h100: each profile a step of the
flow produced, against each set of real runs, as is (no refit here).

    python benchmarks/new_cluster.py [--json]

Profiles: the calibration without steps (carried overheads), the calibration with its DeepSpeed steps as the
device wrote it, the same steps fitted again with today's code (lab/refit_calibration_steps.py), `recommend
--validate --refit` of the flow's runs as the device wrote it and again with today's code (from the steps
fitted again; the prior chosen by holding each model out), the calibrations of a third, a fifth and a sixth lease (the
fifth's by the code that cut it to 345 s, the sixth's to 330 s), and the shipped h100. Run sets (data/runs/h100): the seven short
steps and seven held-out runs of the first lease (each its own process), the flow's runs (predicted before
they ran by the calibration with steps), five settings none of those had (ZeRO-3 offload at 3B, SuperOffload;
predicted before they ran), and five more (ZeRO-3 offload at 1.1-4B, SuperOffload at 3B; run on the fifth
lease after its calibration). A profile fitted to a set is marked in-sample there. Profiles written before
ZeRO-3's offload walk went per tensor (2026-12-06) read it as not fitted (models.profile.Overheads): "as
written" is today's model on their other constants; "fitted again" fits their steps again with today's code.
Errors are 100 (predicted - measured) / measured.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from models.fit import RunEvaluator, fitted_run_ids  # noqa: E402
from models.profile import load_profile  # noqa: E402
from runs.jsonl import read_records  # noqa: E402
from runs.measured import to_run_set  # noqa: E402

CAL, RUNS = REPO / "data" / "calibration" / "h100", REPO / "data" / "runs" / "h100"
PROFILES = {
    "calibrated, carried overheads": CAL / "h100-calibrated-2026-12-06.json",
    "calibrated with steps (as written)": CAL / "h100-steps-calibrated-2026-12-06.json",
    "calibrated with steps (fitted again)": CAL / "h100-steps-calibrated-refit-2026-12-06.json",
    "flow --refit (as written)": CAL / "h100-steps-calibrated-flow-refit-2026-12-06.json",
    "flow --refit (again, prior by model)": CAL / "h100-steps-calibrated-flow-refit-again-2026-12-06.json",
    "third lease's calibration (as written)": CAL / "h100-steps-calibrated-lease3-2026-12-06.json",
    "third lease's calibration (fitted again)": CAL / "h100-steps-calibrated-lease3-refit-2026-12-06.json",
    "fifth lease's calibration (345 s)": CAL / "h100-steps-calibrated-lease5-2026-12-06.json",
    "sixth lease's calibration (330 s)": CAL / "h100-steps-calibrated-lease6-2026-12-06.json",
    "shipped h100": "h100",
}
RUN_SETS = {
    "first lease (14)": ("h100-x1-calibration-steps-2026-12-06.jsonl", "h100-x1-derived-heldout-2026-12-06.jsonl"),
    "flow (5)": ("h100-x1-flow-2026-12-06.jsonl",),
    "unseen settings (5)": ("h100-x1-unseen-2026-12-06.jsonl",),
    "unseen settings, second (5)": ("h100-x1-unseen-2-2026-12-06.jsonl",),
}


def errors(profile, runs) -> dict:
    predicted = RunEvaluator(runs)(profile)
    t = 100 * (predicted.step_time_s / np.array([r.step_time_s for r in runs]) - 1)
    e = 100 * (predicted.gpu_energy_j / np.array([r.gpu_energy_j for r in runs]) - 1)
    seen = fitted_run_ids(profile) & {r.run_id for r in runs}
    return {"n": len(runs), "in_sample": bool(seen), "time_mape": float(np.mean(np.abs(t))),
            "time_worst": float(t[np.argmax(np.abs(t))]), "energy_mape": float(np.mean(np.abs(e))),
            "energy_worst": float(e[np.argmax(np.abs(e))])}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    sets = {name: to_run_set([r for f in files for r in read_records(RUNS / f)]).runs for name, files in RUN_SETS.items()}
    rows = [{"profile": label, "run_set": set_name, **errors(load_profile(str(path)), runs)}
            for label, path in PROFILES.items() for set_name, runs in sets.items()]
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="H100, one GPU: each profile of the new-cluster flow on real runs (as is)")
    for col in ("profile", "runs", "time MAPE", "worst", "energy MAPE", "worst"):
        table.add_column(col, justify="left" if col in ("profile", "runs") else "right")
    for r in rows:
        table.add_row(r["profile"], r["run_set"] + (" in-sample" if r["in_sample"] else ""), f"{r['time_mape']:.1f}%",
                      f"{r['time_worst']:+.1f}%", f"{r['energy_mape']:.1f}%", f"{r['energy_worst']:+.1f}%")
    Console().print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
