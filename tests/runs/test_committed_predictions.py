"""benchmarks/committed_predictions.py matches each committed prediction with its measured run."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("committed_predictions", REPO / "benchmarks" / "committed_predictions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_held_out_offload_sweep_is_matched_run_by_run(bench):
    result = bench.sweep_errors(REPO / "data" / "sweeps" / "h200-heldout-structure.predicted.jsonl",
                                bench.shipped_records())
    assert result["predicted"] == result["measured"] == 3
    by_label = {r["label"]: r["errors_pct"] for r in result["runs"]}
    # 7B ZeRO-3 offload on 2 GPUs: 3.91 s predicted before the run, 4.90 s measured
    assert by_label["llama-2-7b 8192 z3 off-opt ckpt 2gpu 16thr"]["step time"] == pytest.approx(-20.3, abs=0.1)
    assert result["summary"]["step time"]["worst_pct"] == pytest.approx(-24.3, abs=0.1)


def test_a_run_measured_again_later_does_not_replace_the_one_that_was_predicted(bench):
    """The unsampled re-measurement of qwen2.5-1.5b 8k ZeRO-3 offload (1.83 s, 2026-11-30 22:2x)
    has the key of the run the structure sweep predicted (2.32 s, 19:3x): that one is compared."""
    result = bench.sweep_errors(REPO / "data" / "sweeps" / "h200-structure-1gpu.predicted.jsonl", bench.shipped_records())
    assert result["measured"] == 5
    assert result["summary"]["step time"]["worst_pct"] == pytest.approx(-33.0, abs=0.1)


def test_a_prediction_without_its_run_is_counted_not_compared(bench, tmp_path):
    path = tmp_path / "x.predicted.jsonl"
    path.write_text('{"key": "none", "label": "never ran", "prediction": {"step_time_s": 1.0}}\n')
    result = bench.sweep_errors(path, [])
    assert (result["predicted"], result["measured"], result["summary"]["step time"]) == (1, 0, None)
