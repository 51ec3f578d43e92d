"""Fixtures for the harness tests: tiny models written as config.json files."""
from __future__ import annotations

import json

import pytest
from harness_helpers import TINY, TINY_VL


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "tiny.json"
    path.write_text(json.dumps(TINY))
    return str(path)


@pytest.fixture(scope="session")
def tiny_vl_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "tiny-vl.json"
    path.write_text(json.dumps(TINY_VL))
    return str(path)
