"""What the harness reads from, and changes in, a DeepSpeed config."""
from __future__ import annotations

import pytest

from advisor.ds_config import parse_ds_config, to_ds_config
from calibration.harness.train import checkpoint_every_from_config, classify_failure, prepare_config
from models.architecture import load_architecture
from models.strategy import Strategy


@pytest.mark.parametrize("every", range(0, 23))
def test_checkpoint_spacing_follows_advisor_ds_config(every):
    arch = load_architecture("tinyllama-1.1b")  # 22 layers: many k give the same count
    cfg = to_ds_config(Strategy(checkpoint_every=every), arch)
    assert checkpoint_every_from_config(cfg, arch.num_layers) == parse_ds_config(cfg, arch).fields["checkpoint_every"]


def test_a_section_without_a_count_checkpoints_every_block():
    assert checkpoint_every_from_config({"activation_checkpointing": {}}, 24) == 1
    assert checkpoint_every_from_config({}, 24) == 0


def test_cpu_runs_get_torch_adam_and_fp32_and_say_so():
    cfg = {"bf16": {"enabled": True}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
    out, changes = prepare_config(cfg, "cpu")
    assert out["optimizer"]["params"]["torch_adam"] is True and out["bf16"]["enabled"] is False
    assert len(changes) == 2 and cfg["bf16"]["enabled"] is True  # the caller's dict is untouched
    assert prepare_config(cfg, "cuda") == (cfg, [])  # on a GPU the config runs as given


def test_a_config_without_an_optimizer_gets_adamw():
    out, changes = prepare_config({"zero_optimization": {"stage": 1}}, "cuda")
    assert out["optimizer"]["type"] == "AdamW" and "optimizer" in changes[0]


@pytest.mark.parametrize("exc, status", [
    (RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB"), "oom"),
    (MemoryError(), "oom"),
    (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 10 bytes"), "oom"),
    (ValueError("bad key"), "crash"),
])
def test_failures_are_classified(exc, status):
    assert classify_failure(exc) == status
