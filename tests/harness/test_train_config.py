"""What the harness reads from, and changes in, a DeepSpeed config."""
from __future__ import annotations

import pytest

from calibration.harness.train import classify_failure, prepare_config


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
