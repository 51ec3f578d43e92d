"""benchmarks/memory_accuracy.py --reserved: the reserved pool is compared with the predicted pool
(like with like), not with the peak that adds the framework's reserve outside it."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "memory_accuracy.py"
RUNS = REPO / "data" / "runs" / "h200-x1-llama3-heldout-2026-12-03.jsonl"


def test_each_run_shows_its_reserved_pool_against_the_predicted_pool():
    done = subprocess.run([sys.executable, str(SCRIPT), "--runs", str(RUNS), "--reserved"], capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in RUNS.read_text().splitlines()]
    summary = next(line for line in done.stdout.splitlines() if "runs with reserved memory" in line)
    assert summary.startswith(f"{len(records)} runs with reserved memory")
    within, total = map(int, re.search(r"within 10%: (\d+)/(\d+)", summary).groups())
    assert total == len(records) and within < total  # the offload run held 1.64 times its allocation
    offload = next(line for line in done.stdout.splitlines() if "off-opt" in line)
    measured, predicted, err, peak = (float(x) for x in offload.split()[-4:])
    assert err < -15.0 and abs(100 * (predicted - measured) / measured - err) < 0.1
    assert peak > predicted  # the peak adds the framework's reserve to the pool
