"""benchmarks/issue_crossover.py on the CPU path: the stack runs, its rows are written, and bad input
is one line (the GPU's measurement itself: data/calibration/README.md)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "issue_crossover.py"
sys.path.insert(0, str(REPO / "benchmarks"))

from issue_crossover import best_p, smooth_max  # noqa: E402


def test_the_cpu_path_times_the_forward_at_each_token_count(tmp_path):
    out = tmp_path / "xo.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--preset", "qwen2.5-0.5b", "--tokens", "4,8", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["tokens"] for r in rows] == [4, 8]
    assert all(r["forward_host_s"] > 0 and r["forward_wall_s"] > 0 for r in rows)


@pytest.mark.parametrize("args, says", [(["--tokens", "a,b"], "whole numbers"), (["--tokens", "0"], "at least 1"),
                                        (["--preset", "nope"], "unknown model")])
def test_bad_input_is_one_line_and_exit_2(args, says):
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr


def test_the_fitted_sharpness_recovers_the_p_that_made_the_wall_times():
    host = np.array([0.2, 0.5, 0.8, 1.0, 1.2, 2.0, 5.0])
    rows = [{"forward_host_s": h, "forward_gpu_s": 1.0, "forward_wall_s": float(smooth_max(h, 1.0, 3.0))} for h in host]
    assert best_p(rows) == pytest.approx(3.0)
    assert best_p([{**rows[0], "forward_gpu_s": float("nan")}]) is None
