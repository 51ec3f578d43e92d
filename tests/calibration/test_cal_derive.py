"""A profile derived from a measured one by datasheet ratios (calibration.derive)."""
from __future__ import annotations

import json

import pytest

from calibration.derive import DeriveError, Datasheet, derive_profile, load_datasheet, main
from models.profile import load_profile

GIB = 2**30


@pytest.fixture(scope="module")
def derived():
    return derive_profile(load_profile("h200"), load_datasheet("h200"), load_datasheet("gh200"), "2026-11-30")


def test_datasheet_figures_scale_the_measurements(derived):
    h200 = load_profile("h200")
    # HBM 4.0 against 4.8 TB/s: the measured H200 copy rate times 5/6
    assert derived.gpu.hbm_bandwidth.value == pytest.approx(h200.gpu.hbm_bandwidth.value * 4.0 / 4.8)
    # NVLink-C2C 450 GB/s against PCIe Gen5 x16's 64 GB/s, at every copy size
    for size in (2**16, 2**24, GIB):
        assert float(derived.host.h2d(size)) == pytest.approx(float(h200.host.h2d(size)) * 450 / 64)
    # NVLink 150 against 450 GB/s per GPU, at every measured group size; latencies as measured
    ag, ref = derived.intra_node.all_gather, h200.intra_node.all_gather
    assert [p.bus_bandwidth.value for p in ag.by_group_size] == pytest.approx(
        [p.bus_bandwidth.value / 3 for p in ref.by_group_size])
    assert ag.alpha.value == ref.alpha.value
    # the same bf16 peak: the measured GEMM and attention rates carry over unchanged
    assert derived.gpu.gemm_bf16.y == pytest.approx(h200.gpu.gemm_bf16.y)


def test_what_no_datasheet_states_is_the_reference_s(derived):
    h200 = load_profile("h200")
    assert derived.overheads.compute_efficiency.value == h200.overheads.compute_efficiency.value
    for name in ("compute_slowdown_with_collective", "collective_slowdown_with_compute"):
        q = getattr(derived.overlap, name)
        assert q.value == getattr(h200.overlap, name).value
        assert q.source.startswith("from the h200 profile") and "no datasheet figure" in q.source
    assert derived.memory.fragmentation_checkpointed.value == h200.memory.fragmentation_checkpointed.value
    assert derived.memory.fragmentation_offload.value == h200.memory.fragmentation_offload.value
    assert (derived.memory.fragmentation_offload_checkpointed.value
            == h200.memory.fragmentation_offload_checkpointed.value)
    assert derived.fit is None and derived.provenance.kind == "derived"
    # a layer's elementwise kernels: their time as the HBM ratio to the measured exponent, not the ratio itself
    from calibration.derive import ELEMENTWISE_HBM_EXPONENT

    ratio = 4.0e12 / 4.8e12  # the two datasheets' HBM bandwidths
    factor = derived.gpu.layer_elementwise.per_hidden.value / h200.gpu.layer_elementwise.per_hidden.value
    assert factor == pytest.approx(ratio ** (1 - ELEMENTWISE_HBM_EXPONENT))
    assert "the exponent an H100 calibration measured" in derived.gpu.layer_elementwise.per_ffn.source
    # so is the optimizer step's work per parameter
    assert derived.gpu.optimizer_step_bytes_per_param.value == h200.gpu.optimizer_step_bytes_per_param.value
    assert "no datasheet figure" in derived.gpu.optimizer_step_bytes_per_param.source
    # each pass's share of the host's issue time: the same Python, no datasheet figure
    assert derived.host.pass_issue.backward.value == h200.host.pass_issue.backward.value
    assert "no datasheet figure" in derived.host.pass_issue.recompute.source
    assert derived.host.zero3_hook_pass.checkpointed_forward.value == h200.host.zero3_hook_pass.checkpointed_forward.value
    assert "no datasheet figure" in derived.host.zero3_hook_pass.recompute.source
    # and the host's issue speed the reference predicts at: its issue constants scale alike, so a
    # host-bound step is not predicted on a faster host than the reference's own (until 2026-12-05 it was:
    # no speed, so the constants' fitted-at host, 1.27x faster than h200's typical lent one)
    assert derived.host.issue_per_layer.value == h200.host.issue_per_layer.value
    assert "no datasheet figure" in derived.host.issue_per_layer.source
    assert derived.host_issue_scale == pytest.approx(h200.host_issue_scale) and h200.host_issue_scale > 1.2


def test_a_host_of_the_references_kind_keeps_its_measurements_and_another_is_rebuilt(derived):
    """GH200's Grace is another host: its CPUAdam comes from its datasheet's memory bandwidth, with no thread
    curve. A sheet that says its host is the reference's kind (`host_as_reference`) keeps the measured
    figures and curves, and needs no host memory bandwidth of its own."""
    h200 = load_profile("h200")
    assert derived.host.cpu_adam_threads is None and derived.host.param_cast_threads is None
    assert derived.host.cpu_adam.value != h200.host.cpu_adam.value
    same = load_datasheet("gh200").model_copy(update={"host_as_reference": True, "host_memory_bandwidth": None})
    kept = derive_profile(h200, load_datasheet("h200"), same, "2026-11-30")
    assert kept.host.cpu_adam.value == h200.host.cpu_adam.value
    assert kept.host.cpu_adam_threads.y == h200.host.cpu_adam_threads.y
    assert kept.host.param_direct_upload_threads.y == h200.host.param_direct_upload_threads.y
    assert kept.host.memory_bandwidth.value == h200.host.memory_bandwidth.value
    assert "no datasheet figure" in kept.host.cpu_adam_threads.source
    assert kept.host.cores.value == 4 * 72  # the sheet's counts still hold
    with pytest.raises(DeriveError, match="lacks host_memory_bandwidth"):
        derive_profile(h200, load_datasheet("h200"), same.model_copy(update={"host_as_reference": False}), "2026-11-30")


def test_module_power_adds_the_cpu_idle_and_stays_under_the_cap(derived):
    h200, sheet = load_profile("h200"), load_datasheet("gh200")
    extra = sheet.module_host_idle.value
    assert derived.power.gpu.idle.value == pytest.approx(h200.power.gpu.idle.value + extra)
    assert derived.power.gpu.collective.value == pytest.approx(h200.power.gpu.collective.value + extra)
    assert derived.power.gpu.compute.value == sheet.power_cap.value  # 700 + 80 W capped at the module's 680
    assert "capped at 680 W" in derived.power.gpu.compute.source


def test_the_trust_line_says_derived_not_measured(derived):
    assert derived.trust().startswith("gh200: derived from another machine's measurements")


def test_a_target_sheet_missing_a_figure_is_one_line():
    sheet = load_datasheet("gh200").model_copy(update={"host_cores": None})
    with pytest.raises(DeriveError, match="lacks host_cores"):
        derive_profile(load_profile("h200"), load_datasheet("h200"), sheet, "2026-11-30")


def test_command_writes_and_refuses(tmp_path, capsys):
    out = tmp_path / "gh200.json"
    main(["--reference", "h200", "--datasheet", "gh200", "--date", "2026-11-30", "--out", str(out)])
    assert json.loads(out.read_text())["provenance"]["kind"] == "derived"
    with pytest.raises(SystemExit, match="error: .*gh200.* derived profile: derive from a measured one"):
        main(["--reference", "gh200", "--datasheet", "gh200", "--date", "2026-11-30", "--out", str(out)])
    with pytest.raises(SystemExit, match="error: datasheet not found"):
        main(["--reference", "h200", "--datasheet", "no-such", "--date", "2026-11-30", "--out", str(out)])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "x"}))
    with pytest.raises(SystemExit, match="error: .*not a datasheet"):
        main(["--reference", "h200", "--datasheet", str(bad), "--date", "2026-11-30", "--out", str(out)])


def test_datasheets_shipped_parse():
    assert isinstance(load_datasheet("gh200"), Datasheet) and isinstance(load_datasheet("h200"), Datasheet)


def test_the_elementwise_exponent_is_what_an_h100_calibration_measured_against_h200():
    """calibration.derive.ELEMENTWISE_HBM_EXPONENT from the two calibrations it cites: the elementwise
    widths' time ratio, H100 over H200 (bytes over each one's measured HBM rate), as a power of their HBM ratio."""
    from pathlib import Path

    import numpy as np

    from calibration.derive import ELEMENTWISE_HBM_EXPONENT
    from models.profile import load_profile

    h200 = load_profile("h200")
    h100 = load_profile(Path(__file__).resolve().parents[2] / "data/calibration/h100/h100-calibrated-2026-12-06.json")
    hbm_ratio = h100.gpu.hbm_bandwidth.value / h200.gpu.hbm_bandwidth.value
    bytes_ratios = [getattr(getattr(h100.gpu, block), k).value / q.value
                    for block in ("layer_elementwise", "vision_elementwise")
                    for k, q in getattr(h200.gpu, block) if hasattr(q, "value") and getattr(getattr(h100.gpu, block), k)]
    time_ratio = float(np.median(bytes_ratios)) / hbm_ratio
    assert len(bytes_ratios) == 8
    assert np.log(time_ratio) / np.log(1 / hbm_ratio) == pytest.approx(ELEMENTWISE_HBM_EXPONENT, abs=0.01)
