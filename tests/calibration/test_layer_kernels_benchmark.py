"""benchmarks/layer_kernels.py: the shipped layer calibration's blocks against the model's three ways of
costing their elementwise kernels."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_shipped_profile_costs_every_measured_layer_within_its_fit_and_the_counted_bytes_do_not():
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "layer_kernels.py"), "--json"],
                          capture_output=True, text=True, check=True)
    report = json.loads(done.stdout)
    assert set(report["fit"]["bytes_per_element"]) == {"hidden", "attention_dim", "kv_dim", "ffn", "qk_norm_dim",
                                                      "sandwich_norm_dim"}
    rows = report["rows"]
    assert {r["preset"] for r in rows} >= {"qwen3-4b", "qwen3-4b/no-qk-norm", "qwen3-4b/sandwich-norms"}
    for r in rows:  # the shipped h200 merged this very file: each block within its fit's worst miss
        assert abs(r["modeled_profile_other_s"] / r["other_s"] - 1) < 0.08, r["preset"]
        assert r["modeled_counted_other_s"] < 0.25 * r["other_s"], r["preset"]  # unfused, fp32: 5-10x the counted


def test_a_file_that_is_not_a_raw_file_is_one_line(tmp_path):
    bad = tmp_path / "x.raw.jsonl"
    bad.write_text("{}\n")
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "layer_kernels.py"), str(bad)],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "layer_kernels:" in done.stderr
