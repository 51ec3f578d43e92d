"""benchmarks/phase_passes.py: the traced runs' passes beside the model's, and one line for bad input."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_the_passes_power_is_refitted_from_the_kept_counter_and_shown_for_gpu_bound_runs_only():
    """Machine BK's traces kept the counter's changes: each GPU-bound run's forward and backward power and
    its optimizer step's, refitted by the current fit; qwen2.5-3b at 2k, whose passes wait on the host, none."""
    runs = REPO / "data" / "runs" / "h200-x1-phases-power-2026-12-03-BK.jsonl"
    traces = REPO / "data" / "runs" / "phases" / "h200-x1-phases-power-2026-12-03-BK"
    done = run("--runs", runs, "--traces", traces, "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["label"]: r for r in json.loads(done.stdout)["runs"]}
    powered = {label: r["power"] for label, r in rows.items() if r["power"]}
    assert sorted(label.split()[0] for label in powered) == ["gemma-2b-shape"] * 3 + ["llama-3.2-3b"]
    assert all(r["power"] is None for label, r in rows.items() if label.startswith("qwen2.5-3b 2048"))
    for w in powered.values():  # the optimizer step draws about half what the forward and backward do
        assert 600 < w["forward_backward_w"] < 800 and 200 < w["step_w"] < 400
        assert w["model_step_w"] < w["model_forward_backward_w"]
        assert 0.0 < w["excess"] < 0.2  # the synchronizes' idle time, said beside the watts
    table = run("--runs", runs, "--traces", traces)
    assert table.returncode == 0 and "GPU power of the passes" in table.stdout


def test_a_trace_that_kept_no_counter_changes_has_no_power_row():
    """Machine BJ's traces were fitted on the machine by the first fit and kept no changes to refit."""
    runs = REPO / "data" / "runs" / "h200-x1-phases-power-2026-12-03-BJ.jsonl"
    traces = REPO / "data" / "runs" / "phases" / "h200-x1-phases-power-2026-12-03-BJ"
    done = run("--runs", runs, "--traces", traces, "--json")
    assert done.returncode == 0, done.stderr
    assert all(r["power"] is None for r in json.loads(done.stdout)["runs"])


def test_edges_on_the_gpus_clock_leave_the_steps_near_the_marked_ones():
    """Machine BM took the passes' edges from CUDA events, with no synchronize at each: its power steps
    ran within 6% of the marked ones, where BK's synchronized ones ran up to 14% longer."""
    runs = REPO / "data" / "runs" / "h200-x1-phases-power-3-2026-12-03.jsonl"
    traces = REPO / "data" / "runs" / "phases" / "h200-x1-phases-power-3-2026-12-03-BM"
    assert all(json.loads(p.read_text())["pass_power"]["edges_on"] == "gpu" for p in traces.glob("*.json"))
    done = run("--runs", runs, "--traces", traces, "--json")
    assert done.returncode == 0, done.stderr
    powered = [r["power"] for r in json.loads(done.stdout)["runs"]]
    assert len(powered) == 3 and all(w and 0.0 <= w["excess"] < 0.06 for w in powered)
    assert all(w["rms_w"] < 40 and w["step_w"] < w["forward_backward_w"] for w in powered)


def test_a_trace_with_its_kernels_by_kind_is_set_beside_the_models_parts(tmp_path):
    """A trace that kept each pass's kernels by kind (phase_trace.PassKernels): GEMM, attention, elementwise
    (the trace's "other") and communication (NCCL kernels and copies) beside the model's parts of the pass;
    the pass's longest kernels go through. A trace without them has no kinds."""
    key = next(json.loads(line)["key"] for line in RUNS.read_text().splitlines()
               if json.loads(line)["candidate"]["label"].startswith("qwen2.5-3b 6144 z3 ckpt"))
    trace = json.loads((TRACES / f"{key}.json").read_text())
    by_class = {"gemm": 0.2, "attention": 0.05, "communication": 0.01, "copy": 0.002, "other": 0.03}
    top = [{"name": "nvjet_tst_128x256", "calls": 400, "seconds": 0.15}]
    for p in trace["passes"]:
        p["kernels"] = {"by_class_s": by_class, "top": top}
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / f"{key}.json").write_text(json.dumps(trace))
    done = run("--runs", RUNS, "--traces", traces, "--json")
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)["runs"]
    for name in ("forward", "backward"):
        kinds = row[name]["kinds"]
        assert kinds["gemm"]["measured_s"] == 0.2 and kinds["elementwise"]["measured_s"] == 0.03
        assert kinds["communication"]["measured_s"] == pytest.approx(0.012)
        assert kinds["gemm"]["model_s"] > kinds["elementwise"]["model_s"] > 0
        assert kinds["communication"]["model_s"] == 0.0  # one GPU, no offload: nothing beside the compute
        assert row[name]["top_kernels"] == top
    assert row["backward"]["kinds"]["gemm"]["model_s"] > row["forward"]["kinds"]["gemm"]["model_s"]
    table = run("--runs", RUNS, "--traces", traces)
    assert table.returncode == 0 and "by kind of kernel" in table.stdout
    plain = json.loads(run("--runs", RUNS, "--traces", TRACES, "--json").stdout)["runs"]
    assert all(r["forward"]["kinds"] is None and r["forward"]["top_kernels"] is None for r in plain)
