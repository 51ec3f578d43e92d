"""Energy measurement windows (Zeus style): begin_window(name) / end_window(name) -> Measurement.

GPU energy comes from NVML, host CPU energy from RAPL or Grace hwmon meters. Missing
hardware becomes a null meter that warns once with how to fix it, and the Measurement's
fields are None: not measured, never 0. Replay meters feed recorded counters through the
same interface, so tests and the CPU path run without a GPU.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable

from calibration.cpu_power import CpuPowerEstimate, CpuUtilization
from calibration.sensors import CPU_METERS, GPU_METERS, CpuMeter, GpuMeter, SensorUnavailable, open_first

_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


@dataclass(frozen=True)
class Measurement:
    """One measured window. Energies in joules, power in watts, time in seconds.

    `gpu_energy_j` and `gpu_power_avg_w` are keyed by the GPU index the monitor was given;
    None means not measured. `cpu_energy_j` is None when there is neither a sensor nor an
    estimate; `cpu_energy_estimated` is True when it is an estimate, not a reading.
    """

    name: str
    time_s: float
    gpu_energy_j: dict[int, float] | None
    cpu_energy_j: float | None
    cpu_energy_estimated: bool
    gpu_power_avg_w: dict[int, float] | None

    @classmethod
    def summed(cls, parts: list["Measurement"]) -> "Measurement":
        """One window measured in stretches (the harness pauses it to probe the host): times and
        energies added, power over the stretches' time; a figure any stretch lacks is lacking."""
        if len(parts) == 1:
            return parts[0]
        time_s = sum(m.time_s for m in parts)
        gpu = None
        if all(m.gpu_energy_j is not None for m in parts):
            gpu = {i: sum(m.gpu_energy_j[i] for m in parts) for i in parts[0].gpu_energy_j}
        cpu = sum(m.cpu_energy_j for m in parts) if all(m.cpu_energy_j is not None for m in parts) else None
        power = {i: j / time_s for i, j in gpu.items()} if gpu is not None and time_s > 0 else None
        return cls(parts[0].name, time_s, gpu, cpu, any(m.cpu_energy_estimated for m in parts), power)


class NullGpuMeter(GpuMeter):
    """No GPU energy meter: reads are None, and the first use warns how to fix it."""

    kind = "absent"
    present = False
    device_count = 0

    def __init__(self, reason: str):
        self.reason = reason

    def read_j(self, indices: list[int]) -> None:
        _warn_once(
            f"GPU energy is not measured ({self.reason}). Fix: `pip install nvidia-ml-py` on a machine with "
            "an NVIDIA driver (nvidia-smi must work)."
        )
        return None


class NullCpuMeter(CpuMeter):
    """No CPU power sensor: reads are None, and the first use warns how to fix it."""

    kind = "absent"
    present = False

    def __init__(self, reason: str):
        self.reason = reason

    def read_j(self) -> None:
        _warn_once(
            f"Host CPU energy is not measured ({self.reason}). Fix: on x86 make "
            "/sys/class/powercap/intel-rapl:*/energy_uj readable (run as root); on Grace load the "
            "acpi_power_meter driver. Otherwise CPU energy is estimated and marked as such."
        )
        return None


class ReplayGpuMeter(GpuMeter):
    """Recorded cumulative GPU energy (J) per index, returned one reading per call."""

    kind = "replay"

    def __init__(self, readings_j: dict[int, list[float]]):
        self._readings = {i: list(v) for i, v in readings_j.items()}
        self._pos = 0

    @property
    def device_count(self) -> int:
        return len(self._readings)

    def read_j(self, indices: list[int]) -> dict[int, float]:
        out = {i: self._readings[i][self._pos] for i in indices}
        self._pos += 1
        return out


class ReplayCpuMeter(CpuMeter):
    """Recorded cumulative CPU energy (J), one reading per call."""

    kind = "replay"

    def __init__(self, readings_j: Iterable[float]):
        self._readings = iter(list(readings_j))

    def read_j(self) -> float:
        return next(self._readings)


def open_gpu_meter() -> GpuMeter:
    """The first GPU sensor of `calibration.sensors.GPU_METERS` that sees a GPU, else a null
    meter carrying every reason."""
    try:
        meter = open_first(GPU_METERS)
    except SensorUnavailable as exc:
        return NullGpuMeter(str(exc))
    if meter.device_count == 0:
        return NullGpuMeter(f"{meter.kind} sees no GPUs")
    return meter


def open_host_meter() -> CpuMeter:
    """The first CPU sensor of `calibration.sensors.CPU_METERS` that reads, else a null meter
    carrying every reason."""
    try:
        return open_first(CPU_METERS)
    except SensorUnavailable as exc:
        return NullCpuMeter(str(exc))


class EnergyMonitor:
    """Measure time and energy over named windows (windows may nest or overlap).

    `gpu_indices` are CUDA indices (mapped to NVML through CUDA_VISIBLE_DEVICES); None
    means every GPU the meter sees. `sync` is called at both ends of a window (e.g.
    torch.cuda.synchronize), because queued kernels would otherwise land in the wrong
    window. `cpu_estimate` turns host utilisation into an estimated CPU energy when no
    sensor exists; without it CPU energy is then None.
    """

    def __init__(
        self,
        gpu_indices: list[int] | None = None,
        sync: Callable[[], None] | None = None,
        *,
        gpu_meter=None,
        cpu_meter=None,
        cpu_estimate: CpuPowerEstimate | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._gpu = gpu_meter if gpu_meter is not None else open_gpu_meter()
        self._cpu = cpu_meter if cpu_meter is not None else open_host_meter()
        self._sync = sync or (lambda: None)
        self._clock = clock
        self._estimate = cpu_estimate if self._cpu.kind == "absent" else None
        self._util = CpuUtilization() if self._estimate is not None else None
        if gpu_indices is None:
            count = getattr(self._gpu, "device_count", 0)
            gpu_indices = list(range(count))
        self.gpu_indices = list(gpu_indices)
        self._meter_indices = self._gpu.meter_indices(self.gpu_indices)
        self._windows: dict[str, tuple] = {}

    def close(self) -> None:
        """Stop the meters' sampling threads (a thread left running at exit can abort the process)."""
        self._gpu.close()
        self._cpu.close()

    @property
    def gpu_meter_kind(self) -> str:
        return self._gpu.kind

    @property
    def cpu_meter_kind(self) -> str:
        return self._cpu.kind

    @property
    def gpu_meter(self):
        return self._gpu

    @property
    def cpu_meter(self):
        return self._cpu

    def read_gpu_j(self) -> dict[int, float] | None:
        """Each GPU's cumulative joules by CUDA index; None where not measured."""
        if not self._gpu.present:
            return self._gpu.read_j([])  # warns once how to fix it
        if not self.gpu_indices:
            return None
        raw = self._gpu.read_j(self._meter_indices)
        if raw is None:
            return None
        return {c: raw[m] for c, m in zip(self.gpu_indices, self._meter_indices)}

    def begin_window(self, name: str) -> None:
        if name in self._windows:
            raise ValueError(f"window '{name}' is already open")
        self._sync()
        if self._util is not None:
            self._util.since_last()
        self._windows[name] = (self._clock(), self.read_gpu_j(), self._cpu.read_j())

    def end_window(self, name: str) -> Measurement:
        if name not in self._windows:
            raise KeyError(f"window '{name}' was never begun")
        self._sync()
        t1, gpu1, cpu1 = self._clock(), self.read_gpu_j(), self._cpu.read_j()
        t0, gpu0, cpu0 = self._windows.pop(name)
        elapsed = t1 - t0
        gpu_j = power = None
        if gpu0 is not None and gpu1 is not None:
            gpu_j = {i: gpu1[i] - gpu0[i] for i in gpu0}
            power = {i: e / elapsed for i, e in gpu_j.items()} if elapsed > 0 else None
        cpu_j, estimated = None, False
        if cpu0 is not None and cpu1 is not None:
            cpu_j = cpu1 - cpu0
        elif self._estimate is not None:
            cpu_j, estimated = self._estimate.energy_j(elapsed, self._util.since_last()), True
        return Measurement(name, elapsed, gpu_j, cpu_j, estimated, power)

    def nvml_scope(self) -> tuple[str, str]:
        """("module" | "gpu", basis): does the GPU meter's power include the CPU (GH200)?

        Decided by measurement where the host meters its module: the GPU meter's summed power is
        compared with module power and with module minus CPU-side power.
        """
        cpu, gpu = self._cpu, self._gpu
        module_w = cpu.module_power_w()
        gpu_w = [gpu.power_w(i) for i in range(gpu.device_count)]
        if module_w is None or not gpu_w or None in gpu_w:
            return "gpu", "no module power meter to compare with; the GPU meter taken as GPU-only"
        meter_w = sum(gpu_w)
        gpu_only_w = module_w - cpu.cpu_power_w()
        scope = "module" if abs(meter_w - module_w) < abs(meter_w - gpu_only_w) else "gpu"
        return scope, (
            f"{gpu.kind} {meter_w:.0f} W vs module {module_w:.0f} W and module minus CPU "
            f"{gpu_only_w:.0f} W: closer to {'module' if scope == 'module' else 'GPU-only'}"
        )
