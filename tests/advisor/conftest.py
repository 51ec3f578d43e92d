"""Shared fixtures: a tiny synthetic cost model whose optimum is known by hand; the environment for
the advisor's CLI in a process of its own (tests/advisor_process.py), with a cache of the test's own."""
from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from advisor.search import Problem
from advisor.space import build_space
from models.architecture import load_architecture
from models.strategy import static_reasons

CAPACITY_GIB = 64.0


class HandModel:
    """Step time, energy and memory from a few additive terms (see test_search for the table).

    ZeRO-0 is fastest and cheapest but never fits in 64 GiB, so a search that ignored the
    memory constraint would pick it."""

    def __init__(self, arch):
        self.arch = arch
        self.calls = 0

    def __call__(self, batch):
        self.calls += 1
        z3 = batch.zero_stage == 3
        cpu = batch.offload_optimizer == 1
        ckpt = batch.checkpoint_every > 0
        mb2 = batch.micro_batch == 2
        time_s = 1.0 + 0.3 * z3 + 1.0 * cpu + 0.4 * ckpt - 0.2 * mb2
        energy_j = 1000.0 * time_s - 1000.0 * cpu
        states = np.where(batch.zero_stage == 0, 80.0, np.where(cpu, 20.0, 40.0))
        mem = states + np.where(ckpt, 5.0, 30.0) * batch.micro_batch
        static = [static_reasons(batch.strategy(i), self.arch) for i in range(len(batch))]
        feasible = (mem <= CAPACITY_GIB) & np.array([not r for r in static])

        def reasons(i):
            out = list(static[i])
            if mem[i] > CAPACITY_GIB:
                out.append(f"needs {mem[i]:.1f} GiB of GPU memory, has {CAPACITY_GIB:.1f}")
            return out

        zeros = np.zeros(len(batch))
        return SimpleNamespace(step_time_s=time_s, energy_j=energy_j, gpu_energy_j=energy_j, cpu_energy_j=zeros,
                               peak_gpu_mem_gib=mem, reserved_gpu_mem_gib=mem - 2.0, peak_host_mem_gib=zeros + 10.0,
                               feasible=feasible,
                               host_share=zeros, reasons=reasons)


@pytest.fixture(scope="session")
def arch7b():
    return load_architecture("7B")


@pytest.fixture
def tiny_problem(arch7b):
    """12 valid points on 4 GPUs: ZeRO 0/3, offload none/cpu, checkpointing none/full, mb 1/2."""
    space = build_space(arch7b, [4], gpus_per_node=4, global_batch=8, zero_stages=(0, 3), offload=("none", "cpu"),
                        checkpoint_every=(1,), overlap_comm=(True,), max_micro_batch=2)
    space = type(space)(**{**space.__dict__, "sp": (1,), "checkpointing": ("none", "full")})
    model = HandModel(arch7b)
    return Problem(space=space, arch=arch7b, seq_len=4096, tokens=8 * 4096 * 100, evaluate=model,
                   gpu_memory_gib=CAPACITY_GIB, host_memory_gib=512.0, key="tiny")


@pytest.fixture
def cpu_env(tmp_path):
    """The environment for `advisor`: the repository importable, a run store of the test's own."""
    return {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
