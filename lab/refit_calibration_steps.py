"""Fit a stored calibration's DeepSpeed steps again with today's code, no GPU needed.

    python lab/refit_calibration_steps.py PROFILE.json RAW.jsonl OUT.json [--reference h200]

The calibration wrote PROFILE.json with its carried overheads already fitted to its steps
(calibration.step_fit). This puts the carried values back (calibration.carried, from the same
reference profile and the profile's own host figures), fits them to the steps in RAW.jsonl again,
and writes OUT.json: how a change to the step fit is judged on a calibration already made.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from calibration.carried import carried_overheads  # noqa: E402
from calibration.rawlog import read_raw  # noqa: E402
from calibration.step_fit import fit_to_steps  # noqa: E402
from models.profile import HardwareProfile, load_profile  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("profile")
    p.add_argument("raw")
    p.add_argument("out")
    p.add_argument("--reference", default="h200")
    a = p.parse_args()
    data = json.loads(Path(a.profile).read_text())
    profile = HardwareProfile.model_validate(data)
    carried = carried_overheads(profile.host, profile.gpus_per_node.value, load_profile(a.reference))
    data["overheads"].update(carried)
    _, results = read_raw(a.raw)
    fit = fit_to_steps(data, results)
    if fit is None:
        print("no steps to fit")
        return 1
    Path(a.out).write_text(json.dumps(fit.profile, indent=2) + "\n")
    print(f"prior strength {fit.prior_strength:g}")
    for name, (before, after) in sorted(fit.fitted.items()):
        print(f"  {name:48s} {before:11.4g} -> {after:11.4g}")
    print("  kept: " + ", ".join(fit.kept))
    for s in fit.steps:
        print(f"  {s.case[:60]:60s} {s.measured_s:7.3f} s  carried {s.carried_s / s.measured_s - 1:+6.1%}  "
              f"fitted {s.fitted_s / s.measured_s - 1:+6.1%}  held out {s.held_out_s / s.measured_s - 1:+6.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
