"""Profile building from raw results, and the schema's strict parsing of what we write."""
import copy

import pytest
from cal_helpers import ALPHA_S, BUS_BW, env, gpu_results, rr

from calibration.fitting import bus_factor

from calibration.profile_writer import MissingMeasurements, build_profile
from models.profile import HardwareProfile, ProfileError, parse_profile


def build(results=None, e=None, **kw):
    return build_profile(e or env(), results if results is not None else gpu_results(),
                         name=kw.pop("name", "test-h200"), raw_file="t.raw.jsonl", **kw)


def test_gpu_profile_parses_and_carries_the_fitted_numbers():
    data = build()
    p = parse_profile(data)
    assert p.provenance.kind == "measured" and p.provenance.gpu == "NVIDIA H200"
    assert p.gpus_per_node.value == 2
    ar = p.intra_node.all_reduce
    assert ar.alpha.value == pytest.approx(ALPHA_S, rel=1e-4)
    assert ar.bus_bandwidth.value == pytest.approx(BUS_BW, rel=1e-4)
    assert ar.group_size_measured.value == 2
    assert p.gpu.hbm_bandwidth.value == pytest.approx(4.3e12)  # best size
    assert p.gpu.power_cap.value == 700.0
    assert p.power.gpu.compute.value == 690.0 and p.power.gpu.idle.value == 81.0
    assert p.host.cpu_adam.value == pytest.approx(3.4e9)
    assert "DeepSpeedCPUAdam" in p.host.cpu_adam.source


def test_curves_are_monotone_and_use_head_dim_128_only():
    p = parse_profile(build())
    y = p.gpu.gemm_bf16.y
    assert all(b >= a for a, b in zip(y, y[1:]))
    assert p.gpu.attention_fwd_bf16.x == [1024.0, 4096.0, 16384.0]  # the d=64 point at 2048 is left out
    assert "causal FLOPs only" in p.gpu.attention_bwd_bf16.source


def test_head_dim_ratio_comes_from_the_sequences_both_head_dims_were_measured_at():
    from models.flops import causal_attention_flops

    results = gpu_results()
    assert parse_profile(build(results)).gpu.attention_fwd_head_dim_ratio is None  # no common sequence
    for s, fwd_share in ((1024, 0.7), (4096, 0.8), (16384, 0.9)):
        ref = results[f"attention/{s}"].data
        f, b = causal_attention_flops(1, 64, s, 64), causal_attention_flops(1, 64, s, 64, backward=True)
        results[f"attention/{s}/d64"] = rr(f"attention/{s}/d64", "attention", {
            "seq_len": s, "head_dim": 64, "batch": 1, "heads": 64, "fwd_flops": f, "bwd_flops": b,
            "fwd_time_s": f / (fwd_share * ref["fwd_flop_per_s"]), "bwd_time_s": b / (0.5 * ref["bwd_flop_per_s"])})
    gpu = parse_profile(build(results)).gpu
    assert gpu.attention_fwd_head_dim_ratio.x == [64.0, 128.0]
    assert gpu.attention_fwd_head_dim_ratio.y == pytest.approx([0.8, 1.0])  # the median of 0.7, 0.8, 0.9
    assert gpu.attention_bwd_head_dim_ratio.y == pytest.approx([0.5, 1.0])
    fwd_128, _ = gpu.attention_rates(4096, 128)
    fwd_64, _ = gpu.attention_rates(4096, 64)
    assert fwd_64 == pytest.approx(0.8 * fwd_128)


def test_negative_overlap_is_clamped_and_says_so():
    p = parse_profile(build())
    q = p.overlap.compute_slowdown_with_copy
    assert q.value == 0.0 and "clamped" in q.source
    assert p.overlap.compute_slowdown_with_all_to_all.value == pytest.approx(0.38)


def test_single_node_inter_node_is_a_labelled_copy():
    p = parse_profile(build())
    assert p.inter_node.all_gather.bus_bandwidth.value == p.intra_node.all_gather.bus_bandwidth.value
    assert p.inter_node.all_gather.bus_bandwidth.source.startswith("not measured (single-node")


def test_no_cpu_sensor_gives_estimate_never_zero():
    p = parse_profile(build())
    assert p.power.cpu.measured is False and p.power.cpu.sensor == "absent"
    assert p.power.cpu.idle.value > 0 and p.power.cpu.optimizer.value > p.power.cpu.idle.value
    assert "estimate, not measured" in p.power.cpu.idle.source


def test_measured_cpu_power_is_used_when_a_sensor_read_it():
    results = gpu_results()
    for phase, w in (("idle", 90.0), ("wait", 240.0)):
        data = dict(results[f"power/{phase}"].data, cpu_power_w=w, cpu_meter="rapl", cpu_work="adam")
        results[f"power/{phase}"] = rr(f"power/{phase}", "power", data)
    p = parse_profile(build(results))
    assert p.power.cpu.measured is True and p.power.cpu.sensor == "rapl"
    assert p.power.cpu.idle.value == 90.0 and p.power.cpu.optimizer.value == 240.0


def test_a_phase_read_past_the_power_limit_or_below_idle_is_taken_at_the_bound_and_says_so():
    """A lent H100 read 702 W over a 3-s overlap window at its 700 W limit, and its profile failed to write."""
    results = gpu_results()
    for phase, w in (("overlap", 702.0), ("wait", 75.0)):
        results[f"power/{phase}"] = rr(f"power/{phase}", "power", dict(results[f"power/{phase}"].data, gpu_power_w=w))
    p = parse_profile(build(results))
    assert p.power.gpu.overlap.value == 700.0 and "read 702.0 W, above the enforced limit" in p.power.gpu.overlap.source
    assert p.power.gpu.wait.value == 81.0 and "read 75.0 W, below the idle window's" in p.power.gpu.wait.source
    assert p.power.gpu.compute.value == 690.0 and "taken at" not in p.power.gpu.compute.source


def test_failed_family_is_an_error_naming_it_not_a_made_up_number():
    results = gpu_results()
    for k in [k for k in results if k.startswith("gemm/")]:
        results[k] = rr(k, "gemm", {}, status="failed", reason="CUDA out of memory")
    with pytest.raises(MissingMeasurements) as exc:
        build(results)
    msg = str(exc.value)
    assert "gpu.gemm_bf16" in msg and "CUDA out of memory" in msg and "--fill-from" in msg


def test_missing_power_without_nvml_is_an_error_unless_filled_from_a_reference():
    results = gpu_results(power_w=False)
    e = dict(env(), gpu_power_limit_w=None)
    with pytest.raises(MissingMeasurements, match="power.gpu.idle"):
        build(results, e)
    ref = parse_profile(build(name="reference"))
    p = parse_profile(build(results, e, fill_from=ref))
    assert p.power.gpu.idle.value == 81.0
    assert p.power.gpu.idle.source.startswith("from profile 'reference'")
    assert p.gpu.power_cap.source.startswith("from profile 'reference'")


def test_one_gpu_profile_labels_what_it_could_not_measure():
    results = {k: v for k, v in gpu_results(world=1).items()
               if not k.startswith(("overlap/all", "power/collective"))}
    results["overlap/all_gather"] = rr("overlap/all_gather", "overlap", {}, "skipped", "needs at least 2 ranks")
    results["overlap/all_to_all"] = rr("overlap/all_to_all", "overlap", {}, "skipped", "needs at least 2 ranks")
    results["power/collective"] = rr("power/collective", "power", {}, "skipped", "needs at least 2 ranks")
    p = parse_profile(build(results, env(world=1, local=1)))
    assert "crosses no link" in p.intra_node.all_reduce.bus_bandwidth.source
    assert p.overlap.compute_slowdown_with_collective.source.startswith("not measured (needs at least 2 ranks)")
    assert "placeholder = measured memory-bound power" in p.power.gpu.collective.source
    assert "skipped: " in p.provenance.notes


def test_parse_profile_rejects_missing_key_wrong_unit_and_unknown_version():
    good = build()
    missing = copy.deepcopy(good)
    del missing["host"]["cpu_adam"]
    with pytest.raises(ProfileError, match="host.cpu_adam"):
        parse_profile(missing, origin="x.json")
    wrong = copy.deepcopy(good)
    wrong["gpu"]["hbm_bandwidth"]["unit"] = "GB/s"
    with pytest.raises(ProfileError, match="hbm_bandwidth.*bytes/s"):
        parse_profile(wrong)
    version = copy.deepcopy(good)
    version["schema_version"] = 99
    with pytest.raises(ProfileError, match="schema_version 99"):
        parse_profile(version)
    extra = copy.deepcopy(good)
    extra["gpu"]["hbm_bandwith"] = extra["gpu"]["hbm_bandwidth"]
    with pytest.raises(ProfileError, match="hbm_bandwith"):
        parse_profile(extra)


def test_every_constant_has_a_source():
    p = parse_profile(build())

    def walk(node):
        if isinstance(node, dict):
            if "unit" in node and "value" in node:
                assert node["source"].strip()
            for v in node.values():
                walk(v)

    walk(p.model_dump())
    assert isinstance(p, HardwareProfile)


def _collectives_at(sizes, bus_bw_by_size):
    out = {}
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        for g in sizes:
            for n in (2**16, 2**20, 2**24, 2**28):
                t = ALPHA_S + bus_factor(op, g) * n / bus_bw_by_size[g]
                out[f"collective/{op}/intra/g{g}/{n}B"] = rr(
                    f"collective/{op}/intra/g{g}/{n}B", "collective",
                    {"op": op, "scope": "intra", "group_size": g, "bytes": n, "time_s": t,
                     "algbw_bytes_per_s": n / t, "backend": "nccl", "dtype": "bfloat16"})
    return out


def test_smaller_groups_measured_on_a_node_are_kept_by_group_size():
    results = {k: v for k, v in gpu_results(world=4).items() if not k.startswith("collective/")}
    results.update(_collectives_at((2, 4), {2: 270e9, 4: 350e9}))
    p = parse_profile(build(results, env(world=4, local=4)))
    ag = p.intra_node.all_gather
    assert ag.group_size_measured.value == 4 and ag.bus_bandwidth.value == pytest.approx(350e9, rel=1e-4)
    assert [c.group_size.value for c in ag.by_group_size] == [2, 4]
    alpha, bw = ag.constants_at([2, 3, 4, 8])
    assert bw[0] == pytest.approx(270e9, rel=1e-4) and bw[2] == pytest.approx(350e9, rel=1e-4)
    assert 270e9 < bw[1] < 350e9 and bw[3] == pytest.approx(350e9, rel=1e-4)  # held beyond the range
    assert p.inter_node.all_gather.by_group_size == []  # the single-node placeholder copies no sizes


def test_only_collectives_with_a_reference_fills_the_rest():
    results = _collectives_at((2, 4), {2: 270e9, 4: 350e9})
    ref = parse_profile(build(name="reference"))
    p = parse_profile(build(results, env(world=4, local=4), fill_from=ref))
    assert p.gpu.gemm_bf16.source.startswith("from profile 'reference'")
    assert p.intra_node.all_reduce.by_group_size[1].bus_bandwidth.value == pytest.approx(350e9, rel=1e-4)


def test_only_the_cpu_optimizer_with_a_reference_keeps_its_attention_head_dim_ratios():
    """`--only cpu_adam --fill-from h200` had dropped h200's head-dim ratios (absent keys are not
    filled), so attention at head dim 64 ran 1.3x too fast in the new profile; and keeps its optimizer step."""
    from models.profile import load_profile

    ref = load_profile("h200")
    results = {k: r for k, r in gpu_results().items() if r.family == "cpu_adam"}
    p = parse_profile(build(results, fill_from=ref))
    assert p.gpu.attention_fwd_head_dim_ratio.y == ref.gpu.attention_fwd_head_dim_ratio.y
    assert p.gpu.attention_bwd_head_dim_ratio.y == ref.gpu.attention_bwd_head_dim_ratio.y
    assert p.gpu.attention_fwd_head_dim_ratio.source.startswith("from profile 'h200'")
    # the optimizer step's work, which no family measures, likewise: the reference's fitted overheads assume it
    assert p.gpu.optimizer_step_bytes_per_param.value == ref.gpu.optimizer_step_bytes_per_param.value
    assert p.gpu.optimizer_step_bytes_per_param.source.startswith("from profile 'h200' (not measured by a calibration)")
    assert parse_profile(build()).gpu.optimizer_step_bytes_per_param is None  # no reference: the counted bytes


def test_the_profile_writer_counts_attention_as_the_cost_model_does(tmp_path):
    """A raw file written with another count (2.5x, before 2026-11-30) gives rates in the model's count."""
    from calibration.profile_writer import ProfileBuilder
    from models.flops import causal_attention_flops

    row = {"seq_len": 4096, "heads": 8, "head_dim": 128, "batch": 2, "fwd_time_s": 0.01, "bwd_time_s": 0.025,
           "fwd_flops": 1.0, "bwd_flops": 2.5, "fwd_flop_per_s": 1.0, "bwd_flop_per_s": 999.0}
    rates = ProfileBuilder.attention_rates([row])
    assert rates[0]["bwd_flop_per_s"] == pytest.approx(
        float(causal_attention_flops(2, 8, 4096, 128, backward=True)) / 0.025)


def test_a_full_calibration_measures_every_other_head_dim_where_128_is_measured():
    """Each head dim besides 128 needs sequences the reference was measured at to become a ratio point;
    Phi-2's 80 and Gemma's 256 were predicted off the curve's ends until they were measured."""
    from calibration.microbench.compute import OTHER_HEAD_DIMS, attention_cases

    cases = attention_cases(quick=False, cpu=False)
    ref_seqs = {c.seq_len for c in cases if c.head_dim == 128}
    for d in (80, 256):
        assert d in OTHER_HEAD_DIMS
    for d in OTHER_HEAD_DIMS:
        seqs = {c.seq_len for c in cases if c.head_dim == d}
        assert len(seqs) >= 3 and seqs <= ref_seqs, d
    assert all(4096 - c.head_dim < c.heads * c.head_dim <= 4096 for c in cases if c.head_dim != 128)  # about one width
