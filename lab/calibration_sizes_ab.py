"""A calibration's families measured again at other sizes, in the same lease: an A/B of a sizes change.

    python lab/calibration_sizes_ab.py FROM.raw.jsonl OUT.json --batches 5 --power-window-s 3 --family gemm ...

Copies the finished calibration's raw file FROM.raw.jsonl beside OUT.json without the named families' results,
then resumes it (`calibration.calibrate`) with the full calibration's `Sizes` replaced by the given timed batches
and energy window: only those families are measured, and OUT.json is the profile the calibration would have
written with them measured so. Run it once at the old sizes and once at today's (the noise of measuring again),
then compare the three profiles' predictions on the same runs.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from calibration import calibrate  # noqa: E402
from calibration.microbench.common import Sizes  # noqa: E402
from calibration.rawlog import raw_path_for  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source", type=Path, help="a finished calibration's raw file")
    p.add_argument("out", type=Path)
    p.add_argument("--batches", type=int, required=True)
    p.add_argument("--power-window-s", type=float, required=True)
    p.add_argument("--family", action="append", required=True, help="a family to measure again")
    a = p.parse_args()
    again = set(a.family)
    kept = [line for line in a.source.read_text().splitlines() if json.loads(line).get("family") not in again]
    raw_path_for(a.out).write_text("\n".join(kept) + "\n")
    original = calibrate.sizes_for

    def sizes_for(quick: bool, cpu: bool) -> Sizes:
        if quick or cpu:
            return original(quick, cpu)
        return Sizes(quick=False, cpu=False, batch_target_s=0.05, batches=a.batches, power_window_s=a.power_window_s)

    calibrate.sizes_for = sizes_for
    result = calibrate.run(calibrate.options_from_args(calibrate.build_arg_parser().parse_args(
        ["--out", str(a.out), "--name", a.out.stem])))
    if result.error:
        print(f"calibration_sizes_ab: {result.error}", file=sys.stderr)
    return 0 if result.error is None else 2


if __name__ == "__main__":
    sys.exit(main())
