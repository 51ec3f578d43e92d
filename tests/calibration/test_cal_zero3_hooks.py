"""ZeRO-3's hooks pass by pass: measured in a DeepSpeed engine on the CPU path, written into a profile
and merged into one (the cost model's use of them: tests/models/test_timing.py)."""
from __future__ import annotations

import json

import pytest
import torch
from cal_helpers import env, gpu_results, ratio_raw, ratio_rows, rr

from calibration.merge import main, merged_profile
from calibration.calibrate import _worker
from calibration.microbench.common import BenchContext, Skip, sizes_for
from calibration.microbench.zero3_hooks import bench_zero3_hooks, hook_ratios
from calibration.profile_writer import build_profile
from models.profile import parse_profile

ZERO0 = {"forward": 1.0, "backward": 1.6, "checkpointed_forward": 1.0, "checkpointed_backward": 3.0}


def test_each_pass_s_hooks_are_zero3_s_time_less_zero0_s_over_the_forward_s():
    zero3 = {"forward": 3.0, "backward": 3.2, "checkpointed_forward": 2.0, "checkpointed_backward": 6.6}
    ratios = hook_ratios(ZERO0, zero3)
    assert ratios == pytest.approx({"backward_ratio": 0.8, "checkpointed_forward_ratio": 0.5,
                                    "recompute_ratio": (3.6 - 1.6) / 2.0})


def test_a_zero3_forward_no_slower_than_zero0_s_is_an_error_not_a_ratio():
    with pytest.raises(RuntimeError, match="no hooks to measure"):
        hook_ratios(ZERO0, {**ZERO0, "forward": 0.9})


def test_a_recompute_lost_in_the_host_s_noise_is_an_error_not_a_negative_ratio():
    """CI, 2026-12-03: a loaded CPU path measured the recompute's hooks at -0.21 of a forward's, and the
    profile it wrote would not load."""
    zero3 = {"forward": 3.0, "backward": 3.2, "checkpointed_forward": 2.0, "checkpointed_backward": 4.5}
    with pytest.raises(RuntimeError, match=r"recompute -100\.000 ms.*no hooks to measure"):
        hook_ratios(ZERO0, zero3)  # checkpointing added 1.4 s to ZeRO-0's backward, 1.3 s to ZeRO-3's


@pytest.mark.slow
def test_the_cpu_path_times_both_stages_in_the_deepspeed_worker():
    ctx = BenchContext(device=torch.device("cpu"), sizes=sizes_for(True, True))
    ctx.worker = _worker(ctx)
    try:
        row = bench_zero3_hooks(ctx, "qwen2.5-0.5b")
    finally:
        ctx.worker.close()
    assert row["ran"] and row["layers"] > 1 and row["threads"] == ctx.issue_threads == 1
    assert row["zero3_forward_s_per_layer"] > row["zero0_forward_s_per_layer"] > 0  # the fetch and release hooks
    for stage in (0, 3):
        assert row[f"zero{stage}_checkpointed_backward_s_per_layer"] > row[f"zero{stage}_backward_s_per_layer"]
    assert row["backward_ratio"] > 0 and row["checkpointed_forward_ratio"] > 0


def test_without_a_worker_the_hooks_are_skipped_with_the_reason():
    ctx = BenchContext(device=torch.device("cpu"), sizes=sizes_for(True, True))
    with pytest.raises(Skip, match="no DeepSpeed worker"):
        bench_zero3_hooks(ctx, "qwen2.5-0.5b")


def test_another_rank_of_the_node_leaves_it_to_local_rank_0():
    ctx = BenchContext(device=torch.device("cpu"), sizes=sizes_for(True, True), local_rank=1)
    assert bench_zero3_hooks(ctx, "qwen2.5-0.5b") == {"ran": False}


def hook_rows():
    return ratio_rows((("a", 0.9, 0.6, 1.1), ("b", 1.1, 0.8, 0.9), ("c", 1.0, 0.7, 1.0)))


def test_the_profile_keeps_the_median_hook_ratio_of_each_pass_and_a_merge_replaces_only_it(tmp_path):
    results = gpu_results()
    for i, row in enumerate(hook_rows()):
        results[f"cpu/zero3_hooks/{i}"] = rr(f"cpu/zero3_hooks/{i}", "zero3_hooks", row)
    written = parse_profile(build_profile(env(), results, name="node", raw_file="x.raw.jsonl"))
    hooks = written.host.zero3_hook_pass
    assert (hooks.backward.value, hooks.checkpointed_forward.value, hooks.recompute.value) == (1.0, 0.7, 1.0)
    assert "0.60-0.80" in hooks.checkpointed_forward.source and "DeepSpeed engine" in hooks.recompute.source
    assert written.host.pass_issue is None  # the layers' own pass ratios are another family's

    base = build_profile(env(), gpu_results(), name="node", raw_file="base.raw.jsonl")
    assert "zero3_hook_pass" not in base["host"]  # not measured: every pass costs a forward's hooks
    path = tmp_path / "node.json"
    path.write_text(json.dumps(base))
    merged = parse_profile(merged_profile(ratio_raw(tmp_path / "hooks.raw.jsonl", "zero3_hooks", hook_rows()), path))
    assert merged.host.zero3_hook_pass.checkpointed_forward.value == 0.7
    assert "hooks.raw.jsonl" in merged.host.zero3_hook_pass.recompute.source
    assert merged.gpu.gemm_bf16 == parse_profile(base).gpu.gemm_bf16  # the rest is kept


def test_repeated_runs_of_one_machine_pool_into_one_median(tmp_path):
    """Lent hosts drift between runs: the median of both runs' rows, not the last run's."""
    base = tmp_path / "node.json"
    base.write_text(json.dumps(build_profile(env(), gpu_results(), name="node", raw_file="base.raw.jsonl")))
    first = ratio_raw(tmp_path / "one.raw.jsonl", "zero3_hooks", hook_rows())  # checkpointed forward 0.6, 0.8, 0.7
    again = [{**row, "checkpointed_forward_ratio": row["checkpointed_forward_ratio"] + 0.5} for row in hook_rows()]
    second = ratio_raw(tmp_path / "two.raw.jsonl", "zero3_hooks", again)  # 1.1, 1.3, 1.2
    assert parse_profile(merged_profile(second, base)).host.zero3_hook_pass.checkpointed_forward.value == 1.2
    out = tmp_path / "pooled.json"
    main([str(first), str(second), "--into", str(base), "--out", str(out)])
    pooled = parse_profile(json.loads(out.read_text()))
    assert pooled.host.zero3_hook_pass.checkpointed_forward.value == pytest.approx((0.8 + 1.1) / 2)
    assert "one.raw.jsonl + two.raw.jsonl" in pooled.host.zero3_hook_pass.backward.source
    presets = [r["preset"] for r in hook_rows()]
    named = pooled.host.zero3_hook_pass.backward.source.split("median of ")[1].split(" (")[0]
    assert named == f"{2 * len(presets)} layers of " + ", ".join(dict.fromkeys(presets))  # each preset once
    assert "ZeRO-3's hooks in each pass replaced" in pooled.provenance.notes


def test_runs_of_different_machines_are_not_pooled(tmp_path, capsys):
    base = tmp_path / "node.json"
    base.write_text(json.dumps(build_profile(env(), gpu_results(), name="node", raw_file="base.raw.jsonl")))
    h200 = ratio_raw(tmp_path / "h200.raw.jsonl", "zero3_hooks", hook_rows())
    h100 = ratio_raw(tmp_path / "h100.raw.jsonl", "zero3_hooks", hook_rows(), device="NVIDIA H100")
    with pytest.raises(SystemExit, match="not one machine's runs"):
        main([str(h200), str(h100), "--into", str(base), "--out", str(tmp_path / "x.json")])


def test_a_file_that_is_not_a_raw_file_is_named_in_one_line(tmp_path):
    base = tmp_path / "node.json"
    base.write_text(json.dumps(build_profile(env(), gpu_results(), name="node", raw_file="base.raw.jsonl")))
    other = tmp_path / "results.json"
    other.write_text(json.dumps({"rows": []}, indent=1))
    with pytest.raises(SystemExit, match="results.json: not a calibration raw file"):
        main([str(ratio_raw(tmp_path / "one.raw.jsonl", "zero3_hooks", hook_rows())), str(other), "--into", str(base),
              "--out", str(tmp_path / "x.json")])
