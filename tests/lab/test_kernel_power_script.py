"""lab/kernel_power.py on its CPU path: every window, its meter reported absent, none invented."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "lab" / "kernel_power.py"


def test_the_cpu_path_writes_every_window_with_no_energy_where_no_meter_is(tmp_path):
    out = tmp_path / "kernel_power.jsonl"
    subprocess.run([sys.executable, str(SCRIPT), str(out)], check=True, capture_output=True, timeout=300)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    kinds = [r["kind"] for r in rows]
    assert kinds[0] == "idle" and kinds[-1] == "idle_after"
    assert {"gemm", "attention_fwd", "attention_bwd", "copy", "gapped", "mixed", "adam", "adam_after_burst"} <= set(kinds)
    assert all(r["meter"] == "absent" and r["energy_j"] is None and r["avg_w"] is None for r in rows)
    gemms = [r for r in rows if r["kind"] == "gemm"]
    assert all(r["flops"] == 2.0 * r["m"] * r["n"] * r["k"] and r["calls"] >= 1 for r in gemms)
    solid, spaced = (r for r in rows if r["kind"] == "gapped")
    assert spaced["gap_s"] > solid["gap_s"] == 0.0
    assert spaced["busy_s"] / spaced["wall_s"] < solid["busy_s"] / solid["wall_s"]  # the gaps are idle time
    plain, with_passes = (r for r in rows if r["kind"] == "mixed")
    assert plain["passes"] == 0 and "elementwise_alone" not in plain
    assert with_passes["passes"] > 0 and with_passes["elementwise_alone"]["calls"] >= 1
    burst = next(r for r in rows if r["kind"] == "adam_after_burst")
    # The window holds whole rounds of a burst and a step. Whether the bursts' estimated busy time stays
    # under the window's wall time is a timing question a loaded CPU does not answer (CI saw 51 ms of
    # estimated busy time in a 50 ms window), so it is not asserted here.
    assert burst["rounds"] >= 1 and burst["burst_calls"] >= 1 and burst["step_s"] > 0 and burst["burst_busy_s"] > 0


def test_only_runs_the_kinds_named(tmp_path):
    out = tmp_path / "kernel_power.jsonl"
    subprocess.run([sys.executable, str(SCRIPT), str(out), "--only", "adam"], check=True, capture_output=True,
                   timeout=300)
    kinds = [json.loads(line)["kind"] for line in out.read_text().splitlines()]
    assert kinds == ["idle", "adam", "adam_after_burst", "idle_after"]


def test_a_bad_output_path_ends_in_one_line_and_a_non_zero_exit(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "no" / "such" / "dir.jsonl")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert done.stderr.strip().startswith("kernel_power:") and len(done.stderr.strip().splitlines()) == 1
