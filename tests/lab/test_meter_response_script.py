"""lab/meter_response.py on its CPU path: the waves' edges kept, every reading absent, none invented."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "lab" / "meter_response.py"


def test_the_cpu_path_keeps_each_bursts_edges_and_no_reading(tmp_path):
    out = tmp_path / "response.json"
    subprocess.run([sys.executable, str(SCRIPT), str(out), "--periods", "0.02,0.05", "--seconds", "0.2"],
                   check=True, capture_output=True, timeout=120)
    result = json.loads(out.read_text())
    assert [w["period_s"] for w in result["waves"]] == [0.02, 0.05]
    for wave in result["waves"]:
        starts = [on for on, _ in wave["bursts"]]
        assert len(starts) >= 2 and all(on < off for on, off in wave["bursts"])
        assert all(b > a for a, b in zip(starts, starts[1:]))
    assert result["readings"] == {"energy_counter_j": [], "power_w": [], "instant_power_w": []}


def test_bad_periods_are_one_line_and_a_nonzero_exit(tmp_path):
    run = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "r.json"), "--periods", "a,b"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--periods" in run.stderr and "Traceback" not in run.stderr
