"""The shipped GH200 datasheet profile: strictly parsed, every number sourced, datasheet figures kept."""
from __future__ import annotations

from models.profile import Curve, Quantity, load_profile


def _walk(node, path=""):
    if isinstance(node, (Quantity, Curve)):
        yield path, node
        return
    for name in getattr(type(node), "model_fields", {}):
        yield from _walk(getattr(node, name), f"{path}.{name}" if path else name)


def test_every_constant_names_its_source():
    p = load_profile("gh200")
    found = list(_walk(p))
    assert len(found) > 40
    for path, q in found:
        assert len(q.source) > 20, f"{path} has no real source"


def test_datasheet_figures():
    p = load_profile("gh200")
    assert p.provenance.kind == "datasheet"
    assert p.gpus_per_node.value == 4
    assert p.gpu.memory_gib.value == 96.0
    assert p.gpu.hbm_bandwidth.value == 4.0e12
    assert p.host.link == "c2c"
    assert p.host.cores.value == 4 * 72
    # C2C at 450 GB/s each way is about 7x the PCIe rate measured on the H200 hosts (55 GB/s)
    assert 6 < float(p.host.h2d(2**30)) / 55e9 < 8.5
    # the GEMM curve passes through the H200 measurement: 8192^3 at 654 TFLOP/s, below the 989 peak
    assert abs(float(p.gpu.gemm_bf16(2 * 8192**3)) / 654e12 - 1) < 1e-3
    assert all(y < 989e12 for y in p.gpu.gemm_bf16.y)
    # intra-node NVLink (150 GB/s) beats one NDR200 link per GPU (25 GB/s)
    assert p.intra_node.all_gather.bus_bandwidth.value > 5 * p.inter_node.all_gather.bus_bandwidth.value
    assert p.power.nvml_scope == "module" and not p.power.cpu.measured
    assert "ASSUMPTION" in p.host.cpu_adam.source
