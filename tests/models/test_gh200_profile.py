"""The shipped GH200 profile: strictly parsed, every number sourced, derived from h200 by one recipe."""
from __future__ import annotations

import json

from calibration.derive import derive_profile, load_datasheet
from models.profile import Curve, Quantity, load_profile, profile_path


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


def test_the_shipped_file_is_what_the_recipe_writes_from_the_shipped_h200():
    """Refitting h200 without deriving gh200 again fails here: run the command in the profile's notes."""
    shipped = json.loads(profile_path("gh200").read_text())
    again = derive_profile(load_profile("h200"), load_datasheet("h200"), load_datasheet("gh200"),
                           shipped["provenance"]["date"])
    assert json.loads(again.to_json()) == shipped


def test_datasheet_figures():
    p = load_profile("gh200")
    assert p.provenance.kind == "derived"
    assert p.gpus_per_node.value == 4
    assert p.gpu.memory_gib.value == 96.0
    assert p.host.link == "c2c"
    assert p.host.cores.value == 4 * 72
    # intra-node NVLink (150 GB/s) beats one NDR200 link per GPU (25 GB/s)
    assert p.intra_node.all_gather.bus_bandwidth.value > 5 * p.inter_node.all_gather.bus_bandwidth.value
    assert p.power.nvml_scope == "module" and not p.power.cpu.measured
