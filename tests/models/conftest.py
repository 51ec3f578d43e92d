"""Fixtures for the cost-model tests."""
from __future__ import annotations

import pytest

from models.profile import HardwareProfile, load_profile


@pytest.fixture(scope="session")
def gh200() -> HardwareProfile:
    return load_profile("gh200")


@pytest.fixture(scope="session")
def arch7b():
    from models.architecture import load_architecture

    return load_architecture("7B")
