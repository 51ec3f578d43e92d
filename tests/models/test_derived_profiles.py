"""The shipped derived profile (GH200): strictly parsed, every number sourced, derived from h200 by one recipe
(calibration.derive) and its datasheet; the recipe on H100's datasheet, beside the H100 that was measured."""
from __future__ import annotations

import json

import pytest

from calibration.derive import derive_profile, load_datasheet
from models.predict import predict
from models.profile import Curve, Quantity, load_profile, profile_path
from models.strategy import Strategy
from models.workload import Workload
from models.architecture import load_architecture

DERIVED = ("gh200",)


def _walk(node, path=""):
    if isinstance(node, (Quantity, Curve)):
        yield path, node
        return
    for name in getattr(type(node), "model_fields", {}):
        yield from _walk(getattr(node, name), f"{path}.{name}" if path else name)


@pytest.mark.parametrize("name", DERIVED)
def test_every_constant_names_its_source(name):
    p = load_profile(name)
    found = list(_walk(p))
    assert len(found) > 40
    for path, q in found:
        assert len(q.source) > 20, f"{path} has no real source"


@pytest.mark.parametrize("name", DERIVED)
def test_the_shipped_file_is_what_the_recipe_writes_from_the_shipped_h200(name):
    """Refitting h200 without deriving the others again fails here: run the command in the profile's notes."""
    shipped = json.loads(profile_path(name).read_text())
    again = derive_profile(load_profile("h200"), load_datasheet("h200"), load_datasheet(name),
                           shipped["provenance"]["date"])
    assert json.loads(again.to_json()) == shipped


def test_gh200_datasheet_figures():
    p = load_profile("gh200")
    assert p.provenance.kind == "derived"
    assert p.gpus_per_node.value == 4
    assert p.gpu.memory_gib.value == 96.0
    assert p.host.link == "c2c"
    assert p.host.cores.value == 4 * 72
    # intra-node NVLink (150 GB/s) beats one NDR200 link per GPU (25 GB/s)
    assert p.intra_node.all_gather.bus_bandwidth.value > 5 * p.inter_node.all_gather.bus_bandwidth.value
    assert p.power.nvml_scope == "module" and not p.power.cpu.measured


def test_the_recipe_makes_h100_the_h200_with_its_memory_and_hbm():
    """The same die and bf16 peak, 80 GB of HBM3 at 3.35 TB/s against 141 GB of HBM3e at 4.8: the GEMMs as
    measured on H200, the memory-bound work slower, the same host; so a GEMM-bound step barely moves,
    an elementwise-heavy one slows, and a step that fits in 140 GiB but not in 80 does not fit. (The
    shipped h100 is measured; the recipe stays for machines nobody has calibrated.)"""
    h200 = load_profile("h200")
    h100 = derive_profile(h200, load_datasheet("h200"), load_datasheet("h100"), "2026-12-06")
    assert h100.provenance.kind == "derived" and h100.trust().startswith("h100: derived")
    assert h100.gpu.memory_gib.value == 79.6 and h100.host.link == "pcie" and h100.power.nvml_scope == "gpu"
    assert h100.gpu.gemm_bf16.y == pytest.approx(h200.gpu.gemm_bf16.y)
    assert h100.gpu.hbm_bandwidth.value == pytest.approx(h200.gpu.hbm_bandwidth.value * 3.35 / 4.8)
    # the same workplace's hosts (the datasheet's host_as_reference): their measured figures, curves too
    assert h100.host.cpu_adam.value == h200.host.cpu_adam.value
    assert h100.host.cpu_adam_threads.y == h200.host.cpu_adam_threads.y
    assert h100.host.memory_bandwidth.value == h200.host.memory_bandwidth.value
    one = Strategy(zero_stage=2, checkpoint_every=1)
    wide = Workload(load_architecture("llama-2-7b"), 4096)
    narrow = Workload(load_architecture("qwen2.5-0.5b"), 16384)
    slow_wide = predict(wide, Strategy(gpus=2, gpus_per_node=2, zero_stage=3, checkpoint_every=1), h100).step_time_s \
        / predict(wide, Strategy(gpus=2, gpus_per_node=2, zero_stage=3, checkpoint_every=1), h200).step_time_s
    slow_narrow = predict(narrow, one, h100).step_time_s / predict(narrow, one, h200).step_time_s
    assert 1.0 < slow_wide < slow_narrow < 3.35 / 4.8 * 2  # never past the HBM ratio's inverse (1.43)
    big = Workload(load_architecture("qwen2.5-3b"), 32768)
    assert predict(big, one, h200).feasible and not predict(big, one, h100).feasible


def test_the_shipped_h100_is_measured_on_one_gpu_and_plans_on_one():
    """Calibrated on a lent H100 with its DeepSpeed steps and fitted to the 29 runs of four leases there
    (data/calibration/h100, data/runs/h100): a one-GPU calibration timed no collective, so a plan on two
    GPUs is refused, not priced on a placeholder."""
    from models.term_basis import network_refusal

    h100 = load_profile("h100")
    assert h100.provenance.kind == "fitted" and "H100" in h100.provenance.gpu
    assert h100.gpus_per_node.value == 1 and h100.fit is not None and len(h100.fit.run_ids) == 29
    assert network_refusal(h100, 1) is None and network_refusal(h100, 2) is not None
