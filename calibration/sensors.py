"""What a power sensor is, and which ones the advisor knows (as Zeus keeps one file per vendor).

A new GPU sensor (an AMD GPU through amdsmi, say) is one file with a `GpuMeter` subclass and one
line in `GPU_METERS`; a new CPU sensor is one `CpuMeter` subclass and one line in `CPU_METERS`.
Everything else (the energy windows, calibration, the harness, provenance) asks the interface.
Sensors are tried in order; the first that opens is used, and none becomes a null meter that says
why (`calibration.meters`). Vendor units become joules and watts once, inside the sensor.
"""
from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass

# "module:Class", tried in this order.
GPU_METERS = ("calibration.gpu_nvml:NvmlGpuMeter",)
CPU_METERS = ("calibration.cpu_power:GraceHwmonMeter", "calibration.cpu_power:RaplMeter")


@dataclass(frozen=True)
class GpuState:
    """One GPU's state before a calibration, to warn when it is busy or hot."""

    index: int  # the sensor's own device index
    name: str
    uuid: str
    temperature_c: float | None
    power_w: float | None
    power_limit_w: float | None
    utilization_pct: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    process_pids: tuple[int, ...] | None  # compute processes on the GPU; None if NVML cannot say
    process_memory_bytes: tuple[int | None, ...] | None  # their memory, in the same order


class SensorUnavailable(RuntimeError):
    """The sensor cannot be used here; the message says why and how to fix it."""


class GpuMeter(ABC):
    """Cumulative energy per GPU, in joules, keyed by the sensor's own device index."""

    kind: str
    present = True  # a real sensor (the null meter says False)

    @property
    @abstractmethod
    def device_count(self) -> int: ...

    @abstractmethod
    def read_j(self, indices: list[int]) -> dict[int, float] | None: ...

    def meter_indices(self, cuda_indices: list[int]) -> list[int]:
        """The sensor's indices of these CUDA devices (the same, unless a vendor numbers them apart)."""
        return list(cuda_indices)

    def power_w(self, i: int) -> float | None:
        return None

    def instant_power_w(self, i: int) -> float | None:
        """The power right now where the sensor has such a reading (power_w may be a running mean)."""
        return None

    def state(self, i: int) -> GpuState | None:
        """The device's state before a calibration (busy, hot), or None where the sensor cannot say."""
        return None

    def driver_version(self) -> str | None:
        return None

    def close(self) -> None:
        """Stop any sampling thread."""


class CpuMeter(ABC):
    """Cumulative host CPU energy, in joules."""

    kind: str
    present = True

    @abstractmethod
    def read_j(self) -> float | None: ...

    def module_power_w(self) -> float | None:
        """Power of the whole superchip module (CPU + GPU), where the platform meters it."""
        return None

    def cpu_power_w(self) -> float | None:
        """Power of the CPU side alone, where metered beside the module."""
        return None

    def close(self) -> None:
        """Stop any sampling thread."""


def open_first(specs: tuple[str, ...]):
    """The first sensor of `specs` that opens; SensorUnavailable with every reason otherwise."""
    reasons = []
    for spec in specs:
        module, name = spec.split(":")
        try:
            return getattr(importlib.import_module(module), name)()
        except (SensorUnavailable, OSError, ValueError) as exc:
            reasons.append(str(exc))
    raise SensorUnavailable("; ".join(reasons))
