"""lab/probe_drift.py: what its summary reads from a drift file, and a short real case on the CPU
path (gloo, a tiny model, one thread)."""
from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "lab" / "probe_drift.py"
sys.path.insert(0, str(REPO / "lab"))

from probe_drift import drift_summary, following, pin_plan, placement_summary, spread  # noqa: E402


def test_white_noise_is_noise_and_a_slow_walk_is_drift():
    rng = random.Random(1)
    white = [math.exp(rng.gauss(0, 0.1)) for _ in range(400)]
    s = spread("white", white)
    assert s.noise_sd_log == pytest.approx(0.1, rel=0.15)
    assert s.drift_sd_log < 0.05
    assert abs(s.lag1_autocorrelation) < 0.15
    walk = [math.exp(math.sin(i / 40)) for i in range(400)]  # moves slowly: little changes block to block
    s = spread("walk", walk)
    assert s.noise_sd_log < 0.05
    assert s.drift_sd_log > 0.5
    assert s.lag1_autocorrelation > 0.9
    with pytest.raises(ValueError):
        spread("short", [1.0, 2.0])


def test_a_step_that_follows_the_host_shows_once_the_probe_noise_is_smoothed():
    rng = random.Random(2)
    host = [0.2 * math.sin(i / 15) for i in range(300)]  # the host's drift, in log
    probe = [100 * math.exp(h + rng.gauss(0, 0.15)) for h in host]  # a noisy reading of it
    step = [0.5 * math.exp(0.8 * h + rng.gauss(0, 0.01)) for h in host]  # a step that is 80% the host's
    raw, smooth = following(probe, step, 1), following(probe, step, 10)
    assert raw.correlation < smooth.correlation
    assert smooth.slope == pytest.approx(0.8, abs=0.15)
    assert raw.slope < 0.6  # a noisy probe dilutes the slope: what two probes a window apart suffer
    assert following(probe[:20], step[:20], 10) is None  # too few smoothed points


def test_a_window_is_read_from_the_probes_within_it_when_the_host_moves_between_windows():
    rng = random.Random(3)
    levels = [rng.gauss(0, 0.1) for _ in range(50)]
    host = [levels[i // 4] for i in range(200)]  # a host that holds its speed for 4 blocks, then jumps
    rows = [{"t_s": i * 1.0, "probe_rounds_us": [150 * math.exp(h + rng.gauss(0, 0.02)) for _ in range(5)],
             "step_s": [0.5 * math.exp(h)] * 2, "step_thread_cpu_s": [0.2 * math.exp(h)] * 2}
            for i, h in enumerate(host)]
    window = drift_summary(rows)["window"]
    assert window["window_blocks"] == 10
    assert window["probes_within"]["correlation"] > 0.95
    assert window["bracketing_probes"]["correlation"] < window["probes_within"]["correlation"] - 0.2
    assert "side_meter_within" not in window  # no meter given


def test_a_pin_plan_visits_every_cpu_once_a_cycle_with_one_unpinned_block():
    plan = pin_plan([0, 1, 2, 3], cycles=3, seed=5)
    assert len(plan) == 15
    for cycle in range(3):
        assert sorted(c for k, c in plan if k == cycle and c is not None) == [0, 1, 2, 3]
        assert [c for k, c in plan if k == cycle].count(None) == 1
    assert [c for _, c in plan[:5]] != [c for _, c in plan[5:10]]  # shuffled anew each cycle


def _pinned_rows(cpu_effect: dict[int, float], cycles: int, noise: float, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for cycle, cpu in pin_plan(sorted(cpu_effect), cycles, seed):
        level = cpu_effect[cpu] if cpu is not None else 0.0
        step = 0.5 * math.exp(level + rng.gauss(0, noise))
        rows.append({"cycle": cycle, "pinned_cpu": cpu, "cpus_ran_on": [7, 7] if cpu is None else [cpu, cpu],
                     "step_s": [step, step], "probe_rounds_us": [150 * math.exp(rng.gauss(0, noise))] * 5})
    return rows


def test_placement_tells_a_cpu_that_stays_slow_from_noise():
    slow_half = {c: (0.3 if c % 2 else 0.0) for c in range(16)}  # every odd CPU 35% slower, cycle after cycle
    steady = placement_summary(_pinned_rows(slow_half, cycles=6, noise=0.05, seed=1))
    step, probe = steady["series"]
    assert steady["cpus"] == 16 and steady["cycles"] == 6
    assert step["even_odd_cycle_correlation"] > 0.9
    assert step["between_cpus_sd_log"] == pytest.approx(0.15, abs=0.03)
    assert step["within_cpu_sd_log"] < 0.07
    assert step["slowest_over_fastest_cpu"] > 1.25
    assert abs(probe["even_odd_cycle_correlation"]) < 0.6  # the probe here is noise alone
    assert steady["unpinned_ran_on"] == [7]
    flat = placement_summary(_pinned_rows({c: 0.0 for c in range(16)}, cycles=6, noise=0.05, seed=2))
    assert abs(flat["series"][0]["even_odd_cycle_correlation"]) < 0.6
    assert placement_summary([{"step_s": [1.0], "probe_rounds_us": [1.0]}]) is None  # not a pinned case


def test_a_short_case_runs_on_the_cpu_and_its_file_reads(tmp_path):
    out = tmp_path / "drift.jsonl"
    done = subprocess.run([sys.executable, str(SCRIPT), "--model", "tiny-cpu", "--seq", "32", "--zero-stage", "3",
                           "--seconds", "2", "--warmup", "1", "--meter", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1", "MASTER_PORT": "29547"})
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) >= 3
    assert rows[0]["threads"] == 1 and rows[0]["zero_stage"] == 3 and rows[0]["device"] == "cpu"
    assert all(len(r["probe_rounds_us"]) == 5 and len(r["step_s"]) == 2 for r in rows)
    assert all(0 < c <= w * 1.5 for r in rows for c, w in zip(r["step_thread_cpu_s"], r["step_s"]))
    assert all(r["steps_unix_s"][0] < r["steps_unix_s"][1] for r in rows)
    bins = [json.loads(line) for line in (tmp_path / "drift.meter.jsonl").read_text().splitlines()]
    assert len(bins) >= 5 and all(b["us_per_chunk"] > 0 for b in bins)  # the side meter ran beside the steps
    summary = drift_summary(rows, bins)
    assert summary["blocks"] == len(rows)
    shown = subprocess.run([sys.executable, str(SCRIPT), "--summary", str(out), "--json"], capture_output=True,
                           text=True, timeout=60, cwd=REPO)
    assert json.loads(shown.stdout)["blocks"] == len(rows)


def test_a_pinned_case_runs_on_the_cpu_and_says_where_it_ran(tmp_path):
    out = tmp_path / "pinned.jsonl"
    done = subprocess.run([sys.executable, str(SCRIPT), "--model", "tiny-cpu", "--seq", "32", "--zero-stage", "0",
                           "--checkpoint-every", "0", "--seconds", "60", "--warmup", "1", "--pin-cycle", "2",
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1", "MASTER_PORT": "29548"})
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    cpus = sorted(__import__("os").sched_getaffinity(0))
    assert len(rows) == 2 * (len(cpus) + 1)  # ends after its cycles, well before --seconds
    for r in rows:
        if r["pinned_cpu"] is not None:
            assert set(r["cpus_ran_on"]) == {r["pinned_cpu"]}  # the steps ran where they were pinned
    assert [r["pinned_cpu"] for r in rows].count(None) == 2
    shown = subprocess.run([sys.executable, str(SCRIPT), "--summary", str(out)], capture_output=True, text=True,
                           timeout=60, cwd=REPO)
    assert shown.returncode == 0 and "main thread pinned to each of" in shown.stdout


def test_a_bad_file_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"probe_rounds_us": [1.0]}\n')
    done = subprocess.run([sys.executable, str(SCRIPT), "--summary", str(bad)], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "probe_drift:" in done.stderr
    negative = subprocess.run([sys.executable, str(SCRIPT), "--pin-cycle", "-1", "--out", str(tmp_path / "x.jsonl")],
                              capture_output=True, text=True, timeout=60, cwd=REPO)
    assert negative.returncode == 2 and "--pin-cycle -1" in negative.stderr and not (tmp_path / "x.jsonl").exists()
    missing = subprocess.run([sys.executable, str(SCRIPT), "--summary", str(tmp_path / "none.jsonl")],
                             capture_output=True, text=True, timeout=60, cwd=REPO)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
