"""Fixtures for the fit tests: synthetic runs of a machine whose constants we chose."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from synthetic import base_profile, sweep_specs, synthetic_runs

from models.fit import ProfileFit

# Two workloads (qwen2.5-1.5b at 8k, qwen2.5-0.5b at 4k), 16 runs: every ZeRO stage, sync and
# asynchronous optimizer offload, parameter offload, one and two GPUs. Cheap to refit.
SMALL = (0, 6, 7, 8, 1, 2, 3, 4, 5, 21, 22, 25, 30, 35, 36, 41)


@pytest.fixture(scope="session")
def base():
    return base_profile()


@pytest.fixture(scope="session")
def specs():
    return sweep_specs()


@pytest.fixture(scope="session")
def small_specs(specs):
    return [specs[i] for i in SMALL]


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
