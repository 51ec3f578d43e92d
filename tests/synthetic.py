"""Synthetic measured runs: predictions of a profile whose constants we set, with noise.

The strategies are those of the shipped H200 sweep files (data/sweeps/h200-x*.jsonl), so the
fit sees the same mix of families, sizes and GPU counts it will see on real runs.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from models.architecture import load_architecture
from models.fit import RunEvaluator
from models.measured_run import MeasuredRun
from models.profile_values import with_values
from models.profile import HardwareProfile, load_profile
from models.strategy import Strategy
from models.workload import Workload

REPO = Path(__file__).resolve().parents[1]
SWEEPS = (REPO / "data/sweeps/h200-x1.jsonl", REPO / "data/sweeps/h200-x2.jsonl")

# The "true" constants of the synthetic machine; the base profile (gh200) starts elsewhere.
TRUE_VALUES = {
    "overheads.compute_efficiency": 0.85,
    "overheads.step": 0.08,
    "overheads.layer_pass": 0.002,
    "overheads.super_offload_step_per_gparam": 0.9,
    "overheads.zero3_module_pass": 3e-4,
    "overheads.zero3_host_serial": 0.3,
    "overheads.offload_step_per_gparam": 0.6,
    "overlap.compute_slowdown_with_collective": 0.25,
    "power.gpu.compute": 640.0,
    "power.gpu.wait": 150.0,
    "power.gpu.collective": 380.0,
}


NEUTRAL_OVERHEADS = {f"overheads.{k}": 0.0 for k in (
    "step", "micro_step", "layer_pass", "zero3_module_pass", "zero12_grad_hook", "zero12_step_per_tensor", "step_per_tensor",
    "zero3_host_serial",
    "offload_step_per_gparam", "super_offload_step_per_gparam")}
# Where every fit starts, whatever the shipped gh200 holds: efficiencies 1, early overlap figures,
# datasheet-era powers (W).
START_VALUES = {
    **NEUTRAL_OVERHEADS,
    "overheads.compute_efficiency": 1.0,
    "overlap.compute_slowdown_with_collective": 0.188,
    "overlap.collective_slowdown_with_compute": 0.65,
    "power.gpu.idle": 120.0,
    "power.gpu.wait": 205.0,
    "power.gpu.compute": 680.0,
    "power.gpu.memory_bound": 590.0,
    "power.gpu.collective": 410.0,
    "power.gpu.host_copy": 216.0,
    "power.gpu.overlap": 680.0,
    "memory.host_process_per_rank": 0.0,
}


def base_profile() -> HardwareProfile:
    """gh200 with a GPU-only meter (GPU energy is GPU power alone, as on H200, idle 120 W) and the
    START_VALUES, so every fit starts from neutral values, away from the synthetic truth; its host is the
    one the issue constants hold at (no issue speed of its own: the synthetic runs probe none)."""
    p = with_values(load_profile("gh200"), START_VALUES)
    return p.model_copy(update={"power": p.power.model_copy(update={"nvml_scope": "gpu"}),
                                "host": p.host.model_copy(update={"issue_per_layer": None})})


def true_profile(values: dict[str, float] = TRUE_VALUES) -> HardwareProfile:
    return with_values(base_profile(), values)


def sweep_specs() -> list[dict]:
    return [json.loads(line) for path in SWEEPS for line in path.read_text().splitlines() if line.strip()]


def _workload(spec: dict) -> Workload:
    model = spec["model"]
    model = str(REPO / model) if model.endswith(".json") else model
    return Workload(load_architecture(model), spec["seq"], images=spec.get("images", 0), frames=spec.get("frames", 0),
                    train_vision=not spec.get("freeze_vision", False))


def synthetic_runs(profile: HardwareProfile | None = None, noise: float = 0.01, seed: int = 0,
                   specs: list[dict] | None = None) -> list[MeasuredRun]:
    """One run per sweep line, measured as `profile` predicts it times lognormal noise."""
    profile = profile or true_profile()
    specs = specs if specs is not None else sweep_specs()
    rng = np.random.default_rng(seed)
    skeleton = [MeasuredRun(_workload(s), Strategy(**s["strategy"]), 1.0, 1.0, 1.0, run_id=f"syn{i}",
                            label=s.get("label", "")) for i, s in enumerate(specs)]
    pred = RunEvaluator(skeleton)(profile)
    n = len(skeleton)
    t = pred.step_time_s * np.exp(noise * rng.standard_normal(n))
    e = pred.gpu_energy_j * np.exp(noise * rng.standard_normal(n))
    m = pred.allocated_gpu_mem_gib * np.exp(noise * rng.standard_normal(n))
    return [MeasuredRun(r.workload, r.strategy, float(t[i]), float(e[i]), float(m[i]), float(m[i] * 1.12),
                        run_id=r.run_id, label=r.label) for i, r in enumerate(skeleton)]


def synthetic_records(specs: list[dict], profile: HardwareProfile | None = None, noise: float = 0.01, seed: int = 0,
                      failed: tuple[str, ...] = ()) -> list:
    """RunRecords (as data/runs/*.jsonl holds them) measured as `profile` predicts, and one failed
    record per status in `failed` (on the first spec's workload, with the first specs' strategies)."""
    from advisor.validate import candidate_from_strategy
    from runs.record import RunRecord, RunResult

    runs = synthetic_runs(profile, noise, seed, specs)
    records = []
    for i, (spec, run) in enumerate(zip(specs, runs)):
        model = str(REPO / spec["model"]) if spec["model"].endswith(".json") else spec["model"]
        c = candidate_from_strategy(model, spec["seq"], spec["strategy"], frames=spec.get("frames", 0),
                                    images=spec.get("images", 0), freeze_vision=spec.get("freeze_vision", False))
        result = RunResult(status="ok", step_time_s=run.step_time_s, gpu_energy_j=run.gpu_energy_j,
                           peak_gpu_mem_gib=run.peak_gpu_mem_gib, peak_gpu_reserved_gib=run.peak_gpu_reserved_gib,
                           measured_steps=3, gpu_meter="nvml")
        records.append(RunRecord(c.key(), f"2026-11-29T10:{i:02d}:00+00:00", c, result))
    for j, status in enumerate(failed):
        spec = specs[j % len(specs)]
        strategy = {**spec["strategy"], "micro_batch": 64}  # another candidate, so another key
        c = candidate_from_strategy(spec["model"], spec["seq"], strategy)
        records.append(RunRecord(c.key(), f"2026-11-29T11:{j:02d}:00+00:00", c,
                                 RunResult(status=status, reason=f"synthetic {status}")))
    return records


def write_jsonl(records, path) -> None:
    Path(path).write_text("".join(r.to_json_line() for r in records))
