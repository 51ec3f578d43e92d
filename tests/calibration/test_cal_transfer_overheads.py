"""Transferring fitted DeepSpeed overheads into a datasheet profile."""
import json

import pytest

from calibration.transfer_overheads import TRANSFERRED, main, transferred_profile
from models.profile import load_profile, parse_profile


def test_gh200_takes_the_h200_fit_labelled_and_keeps_its_own_efficiencies(tmp_path):
    target = tmp_path / "gh200.json"
    target.write_text(load_profile("gh200").model_dump_json())
    main(["--from", "h200", "--into", str(target)])
    out = parse_profile(json.loads(target.read_text()))
    h200, gh200 = load_profile("h200"), load_profile("gh200")
    for name in TRANSFERRED:
        section, key = name.split(".")
        q = getattr(getattr(out, section), key)
        assert q.value == getattr(getattr(h200, section), key).value
        assert q.source.startswith("transferred from the h200 profile's fit") and "not measured" in q.source
    assert out.overheads.compute_efficiency == gh200.overheads.compute_efficiency
    assert out.provenance.notes.count("DeepSpeed overhead terms (") == 1  # a rerun replaces the note


def test_only_a_fitted_profile_can_be_transferred():
    with pytest.raises(ValueError, match="not fitted"):
        transferred_profile("gh200", "h200")
