"""Helpers for the cost-model tests: shipped profiles with chosen constants replaced."""
from __future__ import annotations

import pytest

from models.profile import HardwareProfile, load_profile, parse_profile


def profile_with(values: dict[str, object], base: str = "gh200") -> HardwareProfile:
    """The shipped profile with dotted paths replaced: a Quantity's value, or any other field."""
    data = load_profile(base).model_dump()
    for path, value in values.items():
        node = data
        keys = path.split(".")
        for k in keys[:-1]:
            node = node[k]
        last = keys[-1]
        if isinstance(node[last], dict) and "value" in node[last]:
            node[last]["value"] = value
        else:
            node[last] = value
    return parse_profile(data, origin="test")


@pytest.fixture(scope="session")
def gh200() -> HardwareProfile:
    return load_profile("gh200")
