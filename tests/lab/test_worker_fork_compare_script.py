"""lab/worker_fork_compare.py on the CPU path: each mode's requests in order, the forked steps marked so."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from calibration.ds_worker import FORKED_NOTE

SCRIPT = Path(__file__).resolve().parents[2] / "lab" / "worker_fork_compare.py"


def test_both_modes_run_every_request_and_only_the_forked_steps_say_so(tmp_path):
    out = tmp_path / "compare.jsonl"
    subprocess.run([sys.executable, str(SCRIPT), str(out)], check=True, capture_output=True, timeout=600)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    for fork in (False, True):
        mine = [r for r in rows if r["fork"] == fork]
        assert [r["request"] for r in mine] == ["warm", "zero3_hooks", "z3", "z2-offload", "z3"]
        assert mine[0]["forks"] == fork
        steps = [r for r in mine if r["request"] != "warm" and r["request"] != "zero3_hooks"]
        assert all("error" not in r and r["step_time_s"] > 0 for r in steps), steps
        assert all((FORKED_NOTE in r["config_adjustments"]) == fork for r in steps)
