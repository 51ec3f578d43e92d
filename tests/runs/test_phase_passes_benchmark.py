"""benchmarks/phase_passes.py: the traced runs' passes beside the model's, and one line for bad input."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "phase_passes.py"
RUNS = REPO / "data" / "runs" / "h200-x1-phases-heldout-2026-12-03.jsonl"
TRACES = REPO / "data" / "runs" / "phases" / "h200-x1-phases-heldout-2026-12-03-AW"


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=REPO)


def test_each_traced_run_shows_its_measured_passes_beside_the_models():
    done = run("--runs", RUNS, "--traces", TRACES, "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["runs"]
    assert len(rows) == len(list(TRACES.glob("*.json"))) == 10
    key = next(json.loads(line)["key"] for line in RUNS.read_text().splitlines()
               if json.loads(line)["candidate"]["label"].startswith("qwen2.5-3b 6144 z3 ckpt"))
    trace = {p["name"]: p for p in json.loads((TRACES / f"{key}.json").read_text())["passes"]}
    row = next(r for r in rows if r["label"].startswith("qwen2.5-3b 6144 z3 ckpt"))
    assert row["forward"]["host_s"] == trace["forward"]["host_s"]  # the measured side is the trace's
    assert row["step"]["gpu_busy_s"] == trace["step"]["gpu_busy_s"]
    for r in rows:
        for name in ("forward", "backward"):
            p = r[name]
            assert p["model_issue_s"] > 0 and p["model_gpu_s"] > 0
            assert p["model_span_s"] >= max(p["model_gpu_s"], p["model_issue_s"])  # the pass waits on the slower
    table = run("--runs", RUNS, "--traces", TRACES)
    assert table.returncode == 0 and "step GPU busy" in table.stdout


def test_bad_input_is_one_line_and_a_non_zero_exit(tmp_path):
    for args in (["--runs", RUNS, "--traces", tmp_path / "none"], ["--runs", tmp_path / "none.jsonl", "--traces", TRACES],
                 ["--runs", RUNS, "--traces", tmp_path], ["--runs", RUNS, "--traces", TRACES, "--profile", "nosuch"]):
        done = run(*args)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.strip().splitlines()[-1].startswith("phase_passes.py: error:")


def test_an_offload_runs_step_has_no_model_figure_to_compare():
    """The trace's busy time of an offload step is mostly its host copies, which the model keeps apart."""
    runs = REPO / "data" / "runs" / "h200-x1-phases-offload-heldout-2026-12-03.jsonl"
    traces = REPO / "data" / "runs" / "phases" / "h200-x1-phases-offload-heldout-2026-12-03-BA"
    done = run("--runs", runs, "--traces", traces, "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["runs"]
    assert len(rows) == 5 and all(r["host_copies_in_gpu_busy"] for r in rows)
    assert all(r["step"]["model_gpu_s"] is None and r["step"]["gpu_busy_s"] > 0 for r in rows)
    table = run("--runs", runs, "--traces", traces)
    assert table.returncode == 0 and "host copies" in table.stdout
