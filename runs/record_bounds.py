"""What a stored run record's figures can be: types are pydantic's to check (`RunRecord.from_dict`),
ranges are these.

A record edited by hand or written by something else can say a step took 1e-30 s, drew infinite or
negative energy, or ran ZeRO stage 5. One such run moves a fit's constants and a report's error by
orders of magnitude (a MAPE of 9e28 was printed), so it is refused, naming the field, rather than
used. The bounds are wide: the shipped runs lie far inside each (steps of 0.03-12 s, at most 13 kJ
and 135 GiB a GPU); outside them a figure is a broken meter or an edit, not a step.
"""
from __future__ import annotations

import math

from models.input_file import shown
from models.limits import MAX_COUNT, MAX_GPUS, MAX_LAYERS, MAX_PER_SAMPLE, MAX_SEQ

GPU_MEMORY_GIB = 4096.0  # no GPU holds more (the profiles' bound too)
HOST_MEMORY_GIB = 2.0**20  # summed over a job's ranks
STEP_S = (1e-5, 1e5)  # a step of 10 us to a day

# RunResult's numbers: (smallest, largest); None is always allowed (not measured).
RESULT_RANGES = {
    "step_time_s": STEP_S,
    "gpu_energy_j": (0.0, 1e10),
    "cpu_energy_j": (0.0, 1e10),
    "peak_gpu_mem_gib": (0.0, GPU_MEMORY_GIB),
    "peak_gpu_reserved_gib": (0.0, GPU_MEMORY_GIB),
    "gpu_alloc_retries": (0, 10**12),
    "peak_host_mem_gib": (0.0, HOST_MEMORY_GIB),
    "host_mem_baseline_gib": (0.0, HOST_MEMORY_GIB),
    "peak_host_mem_pss_gib": (0.0, HOST_MEMORY_GIB),
    "peak_host_mem_sampled_gib": (0.0, HOST_MEMORY_GIB),
    "tokens_per_s": (0.0, 1e13),
    "warmup_steps": (0, 10**9),
    "measured_steps": (0, 10**9),
    "window_s": (0.0, 1e7),
    "cpu_process_core_s": (0.0, 1e9),
    "world_size": (0, MAX_GPUS),
    "wall_s": (0.0, 1e7),
    "concurrent_runs": (1, 10**4),
    "cpu_threads_per_rank": (1, MAX_PER_SAMPLE),
}
# Lists and dicts of numbers: every element in range.
RESULT_ELEMENT_RANGES = {
    "step_times_s": STEP_S,
    "step_steal_cpu_s": (0.0, 1e7),
    "step_gc_s": (0.0, 1e7),
    "step_thread_cpu_s": (0.0, 1e7),
    "gpu_energy_window_j": (0.0, 1e12),
    "gpu_power_avg_w": (0.0, 1e4),
    "timeline_s": (0.0, 1e7),
}
# The host probe's issue times (us a layer) that the fit reads (runs.record.probed_issue_us).
PROBE_RANGE_US = (0.0, 1e7)
PROBE_KEYS = ("issue_us_per_layer", "issue_us_per_layer_window_start", "issue_us_per_layer_after")
CANDIDATE_RANGES = {"seq_len": (1, MAX_SEQ), "gpus": (1, MAX_GPUS), "images": (0, MAX_PER_SAMPLE),
                    "frames": (0, MAX_PER_SAMPLE), "image_size": (1, MAX_PER_SAMPLE), "sp": (1, MAX_COUNT),
                    "checkpoint_every": (0, MAX_LAYERS)}


def record_problems(record) -> list[str]:
    """Each field of a type-checked `RunRecord` whose value lies outside its range: 'where: what'."""
    r, c = record.result, record.candidate
    problems = []
    for name, bounds in RESULT_RANGES.items():
        problems += _out_of_range(f"result.{name}", getattr(r, name), bounds)
    for name, bounds in RESULT_ELEMENT_RANGES.items():
        values = getattr(r, name) or ()
        items = values.items() if isinstance(values, dict) else enumerate(values)
        for key, value in items:
            problems += _out_of_range(f"result.{name}.{key}", value, bounds)
    probe = r.host_probe or {}
    for key in PROBE_KEYS:
        problems += _out_of_range(f"result.host_probe.{key}", probe.get(key), PROBE_RANGE_US)
    in_window = probe.get("issue_us_per_layer_in_window") or []
    for i, value in enumerate(in_window if isinstance(in_window, list) else [in_window]):
        problems += _out_of_range(f"result.host_probe.issue_us_per_layer_in_window.{i}", value, PROBE_RANGE_US)
    problems += _out_of_range("result.machine.gpu_memory_cap_gib", r.machine.get("gpu_memory_cap_gib"),
                              (0.0, GPU_MEMORY_GIB))
    for name, bounds in CANDIDATE_RANGES.items():
        problems += _out_of_range(f"candidate.{name}", getattr(c, name), bounds)
    problems += _strategy_problems(c.strategy) + _zero_stage_problems(c.ds_config)
    return problems


def _out_of_range(where: str, value, bounds) -> list[str]:
    if value is None:
        return []
    low, high = bounds
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return [f"{where}: must be a number, got {shown(value)}"]
    if not (math.isfinite(value) and low <= value <= high):
        return [f"{where}: must lie in [{low:g}, {high:g}], got {shown(value)}"]
    return []


def _strategy_problems(strategy: dict | None) -> list[str]:
    if strategy is None:
        return []
    from models.strategy import strategy_from_dict

    try:
        strategy_from_dict(strategy)
    except (ValueError, TypeError) as exc:
        return [f"candidate.strategy: {exc}"]
    return []


def _zero_stage_problems(ds_config: dict) -> list[str]:
    """The one ds_config key a record reads itself (`Candidate.zero_stage`); the rest is read where the
    config becomes a strategy (models.ds_config, which names its keys)."""
    zero = ds_config.get("zero_optimization", {})
    if not isinstance(zero, dict):
        return [f"candidate.ds_config.zero_optimization: must be an object, got {shown(zero)}"]
    stage = zero.get("stage", 0)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        return [f"candidate.ds_config.zero_optimization.stage: must be 0-3, got {shown(stage)}"]
    return []
