"""Fixtures for the fit tests: synthetic runs of a machine whose constants we chose."""
from __future__ import annotations

import pytest
from synthetic import base_profile, synthetic_runs

from models.fit import ProfileFit


@pytest.fixture(scope="session")
def base():
    return base_profile()


@pytest.fixture(scope="session")
def all_runs():
    """All 52 sweep runs, measured with 0.5% noise."""
    return synthetic_runs(noise=0.005, seed=1)


@pytest.fixture(scope="session")
def full_fit(all_runs, base):
    return ProfileFit().fit(all_runs, base)


@pytest.fixture(scope="session")
def small_runs(small_specs):
    return synthetic_runs(noise=0.01, seed=2, specs=small_specs)
