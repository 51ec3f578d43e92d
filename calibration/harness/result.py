"""What one real training run measured, as written by the harness and read by the runner and store.

Per-step quantities are averages over the measured window; energies sum over every GPU of the
job, like `models.predict.Prediction`. `None` means not measured (no sensor, or the run failed),
never zero.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

STATUSES = ("ok", "oom", "crash", "timeout")


@dataclass(frozen=True)
class RunResult:
    status: str  # ok | oom | crash | timeout
    reason: str = ""  # why it failed; empty when ok
    step_time_s: float | None = None  # wall time of one optimizer step, GPU synchronized
    gpu_energy_j: float | None = None  # per step, summed over the job's GPUs
    cpu_energy_j: float | None = None  # per step, host CPU
    cpu_energy_estimated: bool = False  # True when cpu_energy_j is a model, not a sensor
    peak_gpu_mem_gib: float | None = None  # torch max_memory_allocated, max over ranks
    peak_gpu_reserved_gib: float | None = None  # torch max_memory_reserved, max over ranks
    peak_host_mem_gib: float | None = None  # peak RSS of each rank's process tree, summed over ranks
    host_mem_baseline_gib: float | None = None  # the same before the model was built (runtime, libraries)
    tokens_per_s: float | None = None  # sequences x context length per second, whole job
    warmup_steps: int = 0
    measured_steps: int = 0
    window_s: float | None = None  # length of the measured window
    step_times_s: list[float] = field(default_factory=list)  # each measured step, rank 0
    gpu_energy_window_j: dict[str, float] | None = None  # per global rank, whole window
    gpu_power_avg_w: dict[str, float] | None = None  # per global rank, over the window
    cpu_process_core_s: float | None = None  # CPU seconds used by the ranks' process trees, per step
    loss_first: float | None = None
    loss_last: float | None = None
    gpu_meter: str = "absent"  # nvml | absent (and why)
    cpu_meter: str = "absent"  # rapl | grace-hwmon | absent
    world_size: int = 0
    config_adjustments: list[str] = field(default_factory=list)  # what the harness changed in ds_config
    machine: dict = field(default_factory=dict)  # host, GPU, versions
    layout: dict = field(default_factory=dict)  # as run: ZeRO stage, sp, dp, checkpointing, optimizer class
    timeline_s: dict[str, float] = field(default_factory=dict)  # rank 0: seconds since its start at each stage
    wall_s: float | None = None  # whole run including start-up, filled in by the runner
    concurrent_runs: int = 1  # most runs sharing the machine meanwhile (host CPU energy is whole-host)
    # The harness itself could not start (a missing module or file, a bad argument): says nothing about
    # the candidate, so the sweep records no result for it and stops.
    harness_error: bool = False

    def __post_init__(self):
        assert self.status in STATUSES, f"unknown status {self.status!r}"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "RunResult":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def write(self, path: str | Path) -> None:
        """Atomic: a reader never sees half a file."""
        path = Path(path)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1, sort_keys=True))
        tmp.replace(path)

    @classmethod
    def read(cls, path: str | Path) -> "RunResult":
        return cls.from_dict(json.loads(Path(path).read_text()))
