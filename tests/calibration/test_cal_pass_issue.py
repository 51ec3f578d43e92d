"""The host's issue time pass by pass: measured on the CPU path, written into a profile, merged into
one, and used by the cost model to decide, pass by pass, whether the GPU waits on the host."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from cal_helpers import env, gpu_results, rr

from calibration.merge import merged_profile
from calibration.microbench.common import BenchContext, sizes_for
from calibration.microbench.pass_issue import bench_pass_issue
from calibration.profile_writer import build_profile
from calibration.rawlog import RawLog, RawResult
from models.architecture import load_architecture
from models.predict import predict
from models.profile import PassIssue, Quantity, load_profile, parse_profile
from models.strategy import Strategy
from models.workload import Workload


def test_the_cpu_path_times_each_pass_of_harness_blocks():
    ctx = BenchContext(device=torch.device("cpu"), sizes=sizes_for(True, True))
    row = bench_pass_issue(ctx, "qwen2.5-0.5b")
    assert row["ran"] and row["layers"] > 1
    for key in ("forward", "backward", "checkpointed_forward", "checkpointed_backward"):
        assert row[f"{key}_s_per_layer"] > 0
    # a checkpointed layer's backward runs its forward again first
    assert row["checkpointed_backward_s_per_layer"] > row["backward_s_per_layer"]
    assert row["recompute_ratio"] > 0 and row["backward_ratio"] > 0


def pass_rows():
    return [{"ran": True, "preset": p, "layers": 8, "tokens": 16, "backward_ratio": b, "checkpointed_forward_ratio": f,
             "recompute_ratio": r} for p, b, f, r in (("a", 1.5, 0.7, 2.0), ("b", 1.7, 0.8, 2.4), ("c", 1.6, 0.75, 2.2))]


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
    raw = RawLog(tmp_path / "passes.raw.jsonl", {"kind": "measured", "device": "NVIDIA H200", "gpus_per_node": 1,
                                                 "nodes": 1, "quick": False, "machine": "m"})
    for i, row in enumerate(pass_rows()):
        raw.append(RawResult(f"cpu/pass_issue/{i}", "pass_issue", "ok", row, None, 1.0, "now"))
    merged = parse_profile(merged_profile(raw.path, path))
    assert merged.host.pass_issue.recompute.value == 2.2
    assert "passes.raw.jsonl" in merged.host.pass_issue.recompute.source
    assert merged.gpu.gemm_bf16 == parse_profile(base).gpu.gemm_bf16  # the rest is kept


def _with_passes(profile, backward, checkpointed_forward, recompute):
    ratio = lambda v: Quantity(value=v, unit="ratio", source="test")  # noqa: E731
    passes = PassIssue(backward=ratio(backward), checkpointed_forward=ratio(checkpointed_forward),
                       recompute=ratio(recompute))
    return profile.model_copy(update={"host": profile.host.model_copy(update={"pass_issue": passes})})


def _host_wait_s(workload, strategy, profile) -> float:
    return next(p.time_s for p in predict(workload, strategy, profile).breakdown if p.name == "deepspeed_overhead")


def _with_layer_pass(profile, seconds):
    overheads = profile.overheads
    return profile.model_copy(update={"overheads": overheads.model_copy(update={
        "layer_pass": overheads.layer_pass.model_copy(update={"value": seconds})})})


def test_a_host_bound_forward_is_not_hidden_by_a_gpu_bound_backward():
    """The same host time a micro-step, split between the passes three ways: the GPU's backward is
    twice its forward, so the more of the host's time falls in the forward, the longer the GPU waits."""
    h200 = load_profile("h200")
    workload, strategy = Workload(load_architecture("qwen2.5-0.5b"), 4096), Strategy(gpus=1, zero_stage=0)
    total = 2 * h200.overheads.layer_pass.value  # a forward and a backward per layer, before the split

    def wait_s(backward):
        profile = _with_passes(_with_layer_pass(h200, total / (1 + backward)), backward, 1.0, 1.0)
        return _host_wait_s(workload, strategy, profile)

    assert wait_s(0.5) > wait_s(1.0) > wait_s(2.0)


def test_checkpointing_charges_its_measured_share_of_the_forward():
    h200 = load_profile("h200")
    workload = Workload(load_architecture("qwen2.5-0.5b"), 256)  # all host
    plain, checkpointed = Strategy(gpus=1, zero_stage=0), Strategy(gpus=1, zero_stage=0, checkpoint_every=1)
    layers, layer_pass = workload.arch.num_layers, h200.overheads.layer_pass.value * h200.host_issue_scale

    def added_s(backward, checkpointed_forward, recompute):
        profile = _with_passes(h200, backward, checkpointed_forward, recompute)
        return _host_wait_s(workload, checkpointed, profile) - _host_wait_s(workload, plain, profile)

    # recompute 2x and the first forward free of autograd (0.5x): 1.5 more forward passes
    np.testing.assert_allclose(added_s(1.5, 0.5, 2.0) - added_s(1.5, 1.0, 1.0), 0.5 * layers * layer_pass, rtol=0.1)


def test_profiles_without_the_measurement_charge_every_pass_alike():
    h200 = load_profile("h200")
    bare = h200.model_copy(update={"host": h200.host.model_copy(update={"pass_issue": None})})
    workload, strategy = Workload(load_architecture("qwen2.5-0.5b"), 512), Strategy(gpus=1, zero_stage=2)
    assert predict(workload, strategy, bare).step_time_s == pytest.approx(
        predict(workload, strategy, _with_passes(h200, 1.0, 1.0, 1.0)).step_time_s)


@pytest.mark.slow
def test_the_zero3_benchmark_times_each_pass_under_both_stages_on_the_cpu_path(tmp_path):
    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "z3.json"
    done = subprocess.run([sys.executable, str(repo / "benchmarks" / "zero3_pass_issue.py"), "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "MASTER_PORT": "29641"})
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {r["stage"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {0, 3}
    for r in rows.values():
        assert r["checkpointed_backward_ms"] > r["backward_ms"] > 0 and r["forward_ms"] > 0
    assert rows[3]["forward_ms"] > rows[0]["forward_ms"]  # ZeRO-3's fetch and release hooks
