"""The calibration's own DeepSpeed steps fit the overheads it carried, on a lent H100's stored calibration
(data/calibration/h100): carried terms the steps inform become fitted, the rest stay carried and say so."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibration.carried import carried_overheads
from calibration.rawlog import read_raw
from calibration.step_fit import fit_to_steps, step_records
from models.fit import ISSUE_ANCHOR, default_parameters
from models.profile import HardwareProfile, load_profile
from models.term_basis import basis_of
from runs.measured import to_measured_run

H100 = Path(__file__).resolve().parents[2] / "data" / "calibration" / "h100"
PROFILE, RAW = H100 / "h100-steps-calibrated-2026-12-06.json", H100 / "h100-steps-calibrated-2026-12-06.raw.jsonl"


@pytest.fixture(scope="module")
def carried_and_fit():
    """The stored calibration with its carried overheads put back, and the step fit of it."""
    data = json.loads(PROFILE.read_text())
    profile = HardwareProfile.model_validate(data)
    data["overheads"].update(carried_overheads(profile.host, profile.gpus_per_node.value, load_profile("h200")))
    _, results = read_raw(RAW)
    return data, results, fit_to_steps(data, results)


def test_the_nine_steps_are_runs_of_nine_families(carried_and_fit):
    _, results, _ = carried_and_fit
    records = step_records(results)
    assert len(records) == 9
    assert len({json.dumps(r.candidate.strategy, sort_keys=True) for r in records}) == 9


def test_informed_carried_terms_become_fitted_and_the_rest_stay_carried(carried_and_fit):
    before, _, fit = carried_and_fit
    after = HardwareProfile.model_validate(fit.profile)
    assert {"overheads.offload_step_per_gparam", "overheads.super_offload_step_per_gparam",
            "overheads.zero3_module_pass", "overheads.layer_pass"} <= set(fit.fitted)
    for name in fit.fitted:
        source = after.overheads.model_dump()[name.split(".")[1]]["source"] if name.startswith("overheads.") else ""
        assert basis_of(source) == "fitted" and "DeepSpeed steps of this calibration" in source
    # one GPU holds no collective: ZeRO-3's host-serial share and the overlaps no step informs stay carried
    assert "overheads.zero3_host_serial" in fit.kept
    assert basis_of(after.overheads.zero3_host_serial.source) == "carried"
    assert after.fit is None and after.provenance.kind == "measured"  # still a calibration: a refit starts here


def test_the_fit_moves_no_issue_anchor_when_every_step_probed_its_host(carried_and_fit):
    _, _, fit = carried_and_fit
    assert ISSUE_ANCHOR.name not in fit.fitted and ISSUE_ANCHOR.name not in fit.kept


def test_the_fit_brings_the_steps_closer_than_the_carried_terms(carried_and_fit):
    _, _, fit = carried_and_fit
    carried = sum(abs(s.carried_s / s.measured_s - 1) for s in fit.steps)
    fitted = sum(abs(s.fitted_s / s.measured_s - 1) for s in fit.steps)
    assert fitted < carried


def test_the_anchor_is_a_parameter_only_where_some_run_has_no_probe(carried_and_fit):
    _, results, _ = carried_and_fit
    profile = load_profile("h200")
    runs = [to_measured_run(r) for r in step_records(results)]
    assert ISSUE_ANCHOR in default_parameters(profile)
    assert ISSUE_ANCHOR not in default_parameters(profile, runs)
    unprobed = [runs[0].__class__(**{**runs[0].__dict__, "host_issue_per_layer_s": None}), *runs[1:]]
    assert ISSUE_ANCHOR in default_parameters(profile, unprobed)
