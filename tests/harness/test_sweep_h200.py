"""The H200 sweep files: every line runs (valid strategy, DeepSpeed accepts its config), the
two machines' lists are disjoint and fit their hosts, and together they span the space the
cost model is fitted on."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from advisor.validate import candidates_from_sweep
from calibration.harness import sweep_h200
from models.architecture import load_architecture

REPO = Path(__file__).resolve().parents[2]
FILES = {m: REPO / "data" / "sweeps" / f"h200-{m}.jsonl" for m in ("x1", "x2")}


@pytest.fixture(scope="module")
def candidates():
    return {m: candidates_from_sweep(path) for m, path in FILES.items()}


def test_shipped_files_are_what_the_generator_writes(tmp_path):
    sweep_h200.main(["--out", str(tmp_path)])
    for path in FILES.values():
        assert (tmp_path / path.name).read_text() == path.read_text(), f"regenerate {path.name}"
    assert json.loads((REPO / sweep_h200.VL_MINI).read_text()) == sweep_h200.VL_MINI_CONFIG


def test_machines_get_disjoint_lists_that_fit(candidates):
    keys = {m: {c.key() for c in cs} for m, cs in candidates.items()}
    assert not keys["x1"] & keys["x2"]
    assert all(c.gpus == 1 for c in candidates["x1"])
    assert max(c.gpus for c in candidates["x2"]) == 2
    for run in sweep_h200.split(sweep_h200.runs(), "x1"):
        assert run.host_gib_needed <= sweep_h200.HOST_GIB["x1"] / 2


def test_together_they_span_the_strategy_space(candidates):
    every = candidates["x1"] + candidates["x2"]
    text = [c for c in every if not (c.frames or c.images)]
    vision = [c for c in every if c.frames or c.images]
    assert len(text) >= 40 and len(vision) >= 12
    s = [c.strategy for c in every]
    assert {x["zero_stage"] for x in s} == {0, 1, 2, 3}
    assert any(x["offload_optimizer"] == "cpu" and not x["super_offload"] for x in s)
    assert any(x["super_offload"] for x in s) and any(x["offload_param"] == "cpu" for x in s)
    assert {x["checkpoint_every"] > 0 for x in s} == {True, False}
    assert {x["sp"] for x in s} == {1, 2} and {x["micro_batch"] for x in s} >= {1, 2, 4}
    sizes = {load_architecture(c.model).llm_params // 10**8 for c in text}
    assert min(sizes) <= 6 and any(10 <= n <= 16 for n in sizes) and max(sizes) >= 60  # 0.5B, 1.1-1.5B, 7B
    assert min(c.seq_len for c in text) == 2048 and max(c.seq_len for c in text) == 32768
    assert {c.freeze_vision for c in vision} == {True, False}
    assert len({c.frames for c in vision if c.frames}) >= 3
    assert any(c.sp == 2 for c in vision) and any(c.strategy["offload_optimizer"] == "cpu" for c in vision)


def test_the_first_runs_cover_each_family(candidates):
    """Most valuable first: a sweep cut after 8 runs on each machine still has every family."""
    head = candidates["x1"][:8] + candidates["x2"][:8]
    s = [c.strategy for c in head]
    assert {x["zero_stage"] for x in s} >= {0, 2, 3}
    assert any(x["super_offload"] for x in s) and any(x["offload_param"] == "cpu" for x in s)
    assert any(x["sp"] == 2 for x in s) and any(c.frames for c in head)


def test_deepspeed_accepts_every_config(candidates):
    from deepspeed.runtime.config import DeepSpeedConfig

    for c in candidates["x1"] + candidates["x2"]:
        # Without a process group DeepSpeed assumes one rank: let it derive the global batch.
        cfg = {k: v for k, v in c.ds_config.items() if k != "train_batch_size"}
        assert DeepSpeedConfig(cfg).zero_optimization_stage == c.strategy["zero_stage"]
