"""Merging a calibration's collectives into a fitted profile keeps everything else."""
import json
from pathlib import Path

import pytest
from cal_helpers import env, gpu_results

from calibration.merge import main, merged_profile
from calibration.profile_writer import build_profile
from calibration.rawlog import RawLog, RawResult
from models.profile import load_profile, parse_profile


def _profile_file(tmp_path):
    data = build_profile(env(), gpu_results(), name="node", raw_file="base.raw.jsonl")
    data["overheads"]["compute_efficiency"]["value"] = 0.71  # stands for a fitted constant
    path = tmp_path / "node.json"
    path.write_text(json.dumps(data))
    return path


def _raw_file(tmp_path, world=4):
    raw = RawLog(tmp_path / "x4.raw.jsonl", {"kind": "measured", "device": "NVIDIA H200", "gpus_per_node": world,
                                            "nodes": 1, "quick": False, "machine": "node4"})
    for r in gpu_results(world=world).values():
        if r.family == "collective":
            raw.append(r)
    return raw.path


def test_merge_replaces_intra_collectives_and_keeps_fitted_constants(tmp_path):
    merged = parse_profile(merged_profile(_raw_file(tmp_path), _profile_file(tmp_path)))
    assert merged.intra_node.all_gather.group_size_measured.value == 4
    assert merged.intra_node.all_gather.alpha.source.startswith("x4.raw.jsonl: measured")
    assert merged.overheads.compute_efficiency.value == pytest.approx(0.71)
    assert merged.inter_node.all_gather.group_size_measured.value == 2  # untouched
    assert "x4.raw.jsonl" in merged.provenance.notes


def test_merge_refuses_a_raw_file_with_nothing_to_merge(tmp_path):
    raw = RawLog(tmp_path / "empty.raw.jsonl", {"kind": "measured", "device": "x", "gpus_per_node": 4, "nodes": 1,
                                               "quick": False, "machine": "m"})
    with pytest.raises(ValueError, match="nothing to merge"):
        merged_profile(raw.path, _profile_file(tmp_path))


def test_cli_writes_the_merged_profile(tmp_path):
    out = tmp_path / "merged.json"
    main([str(_raw_file(tmp_path)), "--into", str(_profile_file(tmp_path)), "--out", str(out)])
    assert parse_profile(json.loads(out.read_text())).intra_node.all_reduce.group_size_measured.value == 4


def test_the_cpu_optimizer_against_threads_is_merged_and_the_rest_kept(tmp_path):
    from models.profile import load_profile

    raw = RawLog(tmp_path / "threads.raw.jsonl", {"kind": "measured", "device": "NVIDIA H200", "gpus_per_node": 1,
                                                  "nodes": 1, "quick": False, "machine": "m"})
    for t, rate in ((1, 6.8e8), (4, 2.3e9), (16, 4.2e9)):
        raw.append(RawResult(f"cpu/adam/threads-{t}", "cpu_adam_threads", "ok",
                             {"ran": True, "optimizer": "DeepSpeedCPUAdam", "why": "default", "params": 2**28,
                              "threads": t, "step_time_s": 2**28 / rate, "params_per_s": rate}, None, 1.0, "now"))
    merged = parse_profile(merged_profile(raw.path, _profile_file(tmp_path)))
    assert merged.host.cpu_adam_threads.x == [1.0, 4.0, 16.0]
    assert merged.host.cpu_adam_threads.source.startswith("threads.raw.jsonl, on NVIDIA H200: measured")
    before = load_profile(_profile_file(tmp_path))
    assert merged.intra_node == before.intra_node and merged.overheads == before.overheads


def test_the_all_core_cpu_optimizer_brings_the_hosts_core_count(tmp_path):
    """`recommend`'s offload note measures both on the user's node: the all-core rate bounds what the
    node's ranks share, and the core count sets the launch lines' threads per rank."""
    raw = RawLog(tmp_path / "host.raw.jsonl", {"kind": "measured", "device": "NVIDIA H200", "gpus_per_node": 1,
                                               "nodes": 1, "quick": False, "machine": "m"})
    raw.append(RawResult("cpu/adam", "cpu_adam", "ok",
                         {"ran": True, "optimizer": "DeepSpeedCPUAdam", "why": "default", "params": 2**28,
                          "threads": 16, "step_time_s": 2**28 / 3.9e9, "params_per_s": 3.9e9}, None, 1.0, "now"))
    base = parse_profile(json.loads(_profile_file(tmp_path).read_text()))
    merged = parse_profile(merged_profile(raw.path, _profile_file(tmp_path)))
    assert merged.host.cpu_adam.value == pytest.approx(3.9e9) and merged.host.cores.value == 16
    assert merged.host.cpu_adam.source.startswith("host.raw.jsonl, on NVIDIA H200: measured")
    assert merged.host.cpu_adam_threads == base.host.cpu_adam_threads  # not measured here: kept


def test_the_parameter_refresh_against_threads_is_merged(tmp_path):
    raw = RawLog(tmp_path / "refresh.raw.jsonl", {"kind": "measured", "device": "NVIDIA H200", "gpus_per_node": 1,
                                                  "nodes": 1, "quick": False, "machine": "m"})
    for path, rates in (("cast", (1.5e9, 1.2e10)), ("direct", (6.3e8, 2.3e9))):
        for t, rate in zip((1, 16), rates):
            raw.append(RawResult(f"cpu/refresh/{path}-threads-{t}", "param_refresh", "ok",
                                 {"ran": True, "path": path, "params": 2**28, "threads": t, "time_s": 2**28 / rate,
                                  "params_per_s": rate}, None, 1.0, "now"))
    host = parse_profile(merged_profile(raw.path, _profile_file(tmp_path))).host
    assert host.param_cast_threads.y == pytest.approx([1.5e9, 1.2e10])
    assert host.param_direct_upload_threads.y == pytest.approx([6.3e8, 2.3e9])
    assert host.param_direct_upload_threads.source.startswith("refresh.raw.jsonl, on NVIDIA H200: measured")

def test_the_hosts_issue_time_is_merged_and_scales_the_fitted_issue_constants(tmp_path):
    """A user's node calibrates its host probe: predictions scale the issue constants by its reading
    over the one they were fitted at; the constants themselves are kept."""
    raw = RawLog(tmp_path / "issue.raw.jsonl", {"kind": "measured", "device": "NVIDIA H200", "gpus_per_node": 1,
                                                "nodes": 1, "quick": False, "machine": "m"})
    raw.append(RawResult("cpu/host_issue", "host_issue", "ok", {"ran": True, "threads": 16, "us_per_layer": 180.0},
                         None, 1.0, "now"))
    data = json.loads(_profile_file(tmp_path).read_text())
    data["overheads"]["issue_fitted_at_per_layer"] = {"value": 120e-6, "unit": "s", "source": "fitted at"}
    fitted = tmp_path / "fitted.json"
    fitted.write_text(json.dumps(data))
    merged = parse_profile(merged_profile(raw.path, fitted))
    assert merged.host.issue_per_layer.value == pytest.approx(180e-6)
    assert merged.host.issue_per_layer.source.startswith("issue.raw.jsonl, on NVIDIA H200: measured")
    assert merged.overheads == parse_profile(data).overheads
    assert merged.host_issue_scale == pytest.approx(1.5)


def test_the_wait_decay_is_merged_toward_the_profiles_wait_power(tmp_path):
    """The shipped h200's measurement (machine V): after 100 ms bursts the GPU's power falls with a time
    constant of about 31 ms toward the profile's `wait`; everything else kept."""
    shipped = Path(__file__).resolve().parents[2] / "data" / "calibration" / "h200-x1-wait-decay-2026-12-01-V.raw.jsonl"
    base = _profile_file(tmp_path)
    merged = parse_profile(merged_profile(shipped, base))
    decay = merged.power.gpu.wait_decay
    assert decay.burst_s.value == 0.1
    assert 0.02 < decay.decay_s.value < 0.045
    assert "(691 W)" in decay.decay_s.source  # fitted from the bursts' own power
    assert decay.decay_s.source.startswith("h200-x1-wait-decay-2026-12-01-V.raw.jsonl, on NVIDIA H200: measured")
    assert merged.power.gpu.wait == parse_profile(json.loads(base.read_text())).power.gpu.wait


def test_the_shipped_head_dim_ratios_and_layer_kernels_are_what_merging_their_raw_files_gives():
    """h200's attention rate against head dim and its decoder layers' elementwise bytes come from the
    raw files of their own calibrations (machines CB and CD, 2026-12-05)."""
    repo = Path(__file__).resolve().parents[2]
    shipped = load_profile("h200").gpu
    calibrations = repo / "data" / "calibration"
    attention = "h200-x1-attention-head-dims-2026-12-05-CB.raw.jsonl"
    merged = parse_profile(merged_profile(calibrations / attention, "h200")).gpu
    for side in ("attention_fwd_head_dim_ratio", "attention_bwd_head_dim_ratio"):
        assert getattr(merged, side).x == getattr(shipped, side).x == [64.0, 72.0, 80.0, 96.0, 128.0, 256.0]
        assert getattr(merged, side).y == getattr(shipped, side).y
        assert attention in getattr(shipped, side).source
    layers = "h200-x1-layers-norms-2026-12-05-CD.raw.jsonl"
    merged = parse_profile(merged_profile(calibrations / layers, "h200")).gpu.layer_elementwise
    for width in ("per_hidden", "per_attention", "per_kv", "per_ffn", "per_qk_norm", "per_sandwich_norm"):
        assert getattr(merged, width).value == getattr(shipped.layer_elementwise, width).value
        assert layers in getattr(shipped.layer_elementwise, width).source


@pytest.mark.parametrize("raw_text", [None, "{}\n"])
def test_cli_bad_input_is_one_line(tmp_path, raw_text):
    raw = tmp_path / "x.raw.jsonl"
    if raw_text is not None:
        raw.write_text(raw_text)
    with pytest.raises(SystemExit) as stop:
        main([str(raw), "--into", str(_profile_file(tmp_path)), "--out", str(tmp_path / "out.json")])
    message = str(stop.value.code)
    assert message.startswith("error: ") and "\n" not in message and "x.raw.jsonl" in message
