"""The host's issue time pass by pass: measured on the CPU path, written into a profile and merged into
one (the cost model's use of it: tests/models/test_timing.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cal_helpers import env, gpu_results, ratio_raw, ratio_rows, rr

from calibration.merge import merged_profile
from calibration.microbench.common import BenchContext, sizes_for
from calibration.microbench.pass_issue import bench_pass_issue, recompute_ratio
from calibration.profile_writer import build_profile
from models.profile import parse_profile


def test_the_cpu_path_times_each_pass_of_harness_blocks():
    ctx = BenchContext(device=torch.device("cpu"), sizes=sizes_for(True, True))
    threads = torch.get_num_threads()
    row = bench_pass_issue(ctx, "qwen2.5-0.5b")
    assert row["ran"] and row["layers"] > 1
    assert row["threads"] == 1 and torch.get_num_threads() == threads  # one thread on the CPU path, then back
    for key in ("forward", "backward", "checkpointed_forward", "checkpointed_backward"):
        assert row[f"{key}_s_per_layer"] > 0
    # a checkpointed layer's backward runs its forward again first
    assert row["checkpointed_backward_s_per_layer"] > row["backward_s_per_layer"]
    assert row["recompute_ratio"] > 0 and row["backward_ratio"] > 0


def test_a_recompute_lost_in_the_host_s_noise_is_an_error_not_a_ratio():
    """Rounds of ((forward, backward) plain, (forward, backward) checkpointed) in seconds."""
    assert recompute_ratio([((1.0, 2.0), (1.0, 3.0)), ((1.0, 2.0), (1.0, 2.5))]) == pytest.approx(0.75)
    with pytest.raises(RuntimeError, match=r"added -0\.10 of a forward's"):
        recompute_ratio([((1.0, 2.0), (1.0, 1.9)), ((1.0, 2.0), (1.0, 1.9))])


def pass_rows():
    return ratio_rows((("a", 1.5, 0.7, 2.0), ("b", 1.7, 0.8, 2.4), ("c", 1.6, 0.75, 2.2)))


def test_the_profile_keeps_the_median_ratio_of_each_pass_and_a_merge_replaces_only_it(tmp_path):
    results = gpu_results()
    for i, row in enumerate(pass_rows()):
        results[f"cpu/pass_issue/{i}"] = rr(f"cpu/pass_issue/{i}", "pass_issue", row)
    written = parse_profile(build_profile(env(), results, name="node", raw_file="x.raw.jsonl"))
    assert (written.host.pass_issue.backward.value, written.host.pass_issue.checkpointed_forward.value,
            written.host.pass_issue.recompute.value) == (1.6, 0.75, 2.2)
    assert "1.50-1.70" in written.host.pass_issue.backward.source

    base = build_profile(env(), gpu_results(), name="node", raw_file="base.raw.jsonl")
    assert "pass_issue" not in base["host"]  # not measured: every pass costs the forward's
    path = tmp_path / "node.json"
    path.write_text(json.dumps(base))
    merged = parse_profile(merged_profile(ratio_raw(tmp_path / "passes.raw.jsonl", "pass_issue", pass_rows()), path))
    assert merged.host.pass_issue.recompute.value == 2.2
    assert "passes.raw.jsonl" in merged.host.pass_issue.recompute.source
    assert merged.gpu.gemm_bf16 == parse_profile(base).gpu.gemm_bf16  # the rest is kept
