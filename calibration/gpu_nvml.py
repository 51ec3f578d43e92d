"""NVIDIA GPUs through NVML (nvidia-ml-py): the energy counter and the state checks.

Vendor units become SI once, here: NVML's energy counter is mJ, its power mW.
The counter (`nvmlDeviceGetTotalEnergyConsumption`, Volta and newer) updates about every
100 ms, so callers measure windows of seconds and synchronise the GPU at both ends.
"""
from __future__ import annotations

import os
import threading
import time

from calibration.sensors import GpuMeter, GpuState, SensorUnavailable


class NvmlUnavailable(SensorUnavailable):
    """NVML cannot be used here; the message says why and how to fix it."""


def _pynvml():
    try:
        import pynvml  # provided by the nvidia-ml-py package
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise NvmlUnavailable("pynvml is not installed: pip install nvidia-ml-py") from exc
    return pynvml


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlGpuMeter(GpuMeter):
    """Cumulative GPU energy per NVML index, in joules.

    Uses the hardware energy counter where the GPU has one, else integrates
    `nvmlDeviceGetPowerUsage` sampled by a background thread (then `counter` says so).
    """

    kind = "nvml"

    def __init__(self, sample_interval_s: float = 0.05):
        self._nvml = _pynvml()
        try:
            self._nvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            raise NvmlUnavailable(f"NVML failed to initialise ({exc}); is the NVIDIA driver loaded?") from exc
        self._count = self._nvml.nvmlDeviceGetCount()
        self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(self._count)]
        self._has_counter = [self._probe_counter(h) for h in self._handles]
        self.counter = "energy counter" if all(self._has_counter) else "sampled power"
        self._sampled_j = [0.0] * self._count
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        if not all(self._has_counter):
            self._interval_s = sample_interval_s
            self._thread = threading.Thread(target=self._sample_loop, daemon=True)
            self._thread.start()

    def _probe_counter(self, handle) -> bool:
        try:
            self._nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
            return True
        except self._nvml.NVMLError:
            return False

    def _sample_loop(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self._interval_s):
            now = time.monotonic()
            for i, handle in enumerate(self._handles):
                if self._has_counter[i]:
                    continue
                try:
                    watts = self._nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
                except self._nvml.NVMLError:
                    continue
                with self._lock:
                    self._sampled_j[i] += watts * (now - last)
            last = now

    @property
    def device_count(self) -> int:
        return self._count

    def read_j(self, nvml_indices: list[int]) -> dict[int, float]:
        out = {}
        for i in nvml_indices:
            if self._has_counter[i]:
                out[i] = self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handles[i]) / 1000.0
            else:
                with self._lock:
                    out[i] = self._sampled_j[i]
        return out

    def index_of_uuid(self, uuid: str) -> int:
        """NVML index of a GPU by UUID (torch's `get_device_properties(i).uuid`)."""
        want = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
        for i, handle in enumerate(self._handles):
            if _text(self._nvml.nvmlDeviceGetUUID(handle)) == want:
                return i
        raise KeyError(f"no GPU with UUID {want} visible to NVML")

    def meter_indices(self, cuda_indices: list[int]) -> list[int]:
        """Map CUDA indices to NVML indices through CUDA_VISIBLE_DEVICES (ints or UUIDs)."""
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if not visible:
            return list(cuda_indices)
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        out = []
        for c in cuda_indices:
            entry = entries[c]
            out.append(int(entry) if entry.isdigit() else self.index_of_uuid(entry))
        return out

    def state(self, i: int) -> GpuState:
        nv, h = self._nvml, self._handles[i]

        def attempt(fn, scale=1.0):
            try:
                return fn() * scale
            except nv.NVMLError:
                return None

        util = attempt(lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu)
        try:
            info = nv.nvmlDeviceGetMemoryInfo(h)
            mem_used, mem_total = int(info.used), int(info.total)
        except nv.NVMLError:
            mem_used = mem_total = None
        try:
            running = nv.nvmlDeviceGetComputeRunningProcesses(h)
            procs = tuple(int(p.pid) for p in running)
            proc_mem = tuple(getattr(p, "usedGpuMemory", None) for p in running)
        except nv.NVMLError:
            procs = proc_mem = None
        return GpuState(
            index=i,
            name=_text(nv.nvmlDeviceGetName(h)),
            uuid=_text(nv.nvmlDeviceGetUUID(h)),
            temperature_c=attempt(lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            power_w=attempt(lambda: nv.nvmlDeviceGetPowerUsage(h), 1e-3),
            power_limit_w=attempt(lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h), 1e-3),
            utilization_pct=util,
            memory_used_bytes=mem_used,
            memory_total_bytes=mem_total,
            process_pids=procs,
            process_memory_bytes=proc_mem,
        )

    def power_w(self, i: int) -> float:
        return self._nvml.nvmlDeviceGetPowerUsage(self._handles[i]) / 1000.0

    def instant_power_w(self, i: int) -> float | None:
        """NVML's instantaneous power field (Hopper and newer drivers); None where the GPU lacks it."""
        nv = self._nvml
        try:
            value = nv.nvmlDeviceGetFieldValues(self._handles[i], [nv.NVML_FI_DEV_POWER_INSTANT])[0]
        except (nv.NVMLError, AttributeError):
            return None
        return value.value.uiVal / 1000.0 if value.nvmlReturn == nv.NVML_SUCCESS else None

    def driver_version(self) -> str:
        return _text(self._nvml.nvmlSystemGetDriverVersion())

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
