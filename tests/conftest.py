"""Fixtures every test package shares: synthetic measured runs (tests/synthetic.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from synthetic import sweep_specs  # noqa: E402

# Two workloads (qwen2.5-1.5b at 8k, qwen2.5-0.5b at 4k), 16 runs: every ZeRO stage, sync and
# asynchronous optimizer offload, parameter offload, one and two GPUs. Cheap to refit.
SMALL = (0, 6, 7, 8, 1, 2, 3, 4, 5, 21, 22, 25, 30, 35, 36, 41)


@pytest.fixture(scope="session")
def specs():
    return sweep_specs()


@pytest.fixture(scope="session")
def small_specs(specs):
    return [specs[i] for i in SMALL]
