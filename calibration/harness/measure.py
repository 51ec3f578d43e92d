"""Per-rank measurement around the harness's training window: energy, host memory, CPU time.

GPU energy comes from `calibration.meters.EnergyMonitor` (NVML); where that module or the
sensor is missing the result says "absent" and carries None. Host CPU energy is read on one rank
per node only (the sensor, or the meter's estimate, covers the whole host, so summing over ranks
would count it several times).
"""
from __future__ import annotations

import os
import platform
import socket
import time
import warnings
from pathlib import Path

import psutil

from calibration.harness import memory_cap


class _AbsentMonitor:
    """Stands in for EnergyMonitor when calibration.meters cannot be imported."""

    def __init__(self, why: str):
        self.gpu_meter_kind = f"absent ({why})"
        self.cpu_meter_kind = "absent"
        self._start: dict[str, float] = {}

    def begin_window(self, name: str) -> None:
        self._start[name] = time.perf_counter()

    def read_gpu_j(self) -> None:
        return None

    def end_window(self, name: str):
        from types import SimpleNamespace

        elapsed = time.perf_counter() - self._start.pop(name)
        return SimpleNamespace(
            name=name, time_s=elapsed, gpu_energy_j=None, cpu_energy_j=None,
            cpu_energy_estimated=False, gpu_power_avg_w=None,
        )


def energy_monitor(cuda_indices: list[int], sync):
    """The project's EnergyMonitor for these CUDA devices (it maps them to NVML itself), with a
    utilisation-based CPU estimate where the host has no power sensor; or an absent one that
    says why when calibration.meters cannot be imported."""
    try:
        from calibration.cpu_power import estimate_cpu_power
        from calibration.meters import EnergyMonitor
    except ImportError as exc:
        warnings.warn(f"calibration.meters is not importable ({exc}); energy will not be measured", stacklevel=2)
        return _AbsentMonitor(f"calibration.meters not importable: {exc}")
    estimate = estimate_cpu_power(psutil.cpu_count())
    monitor = EnergyMonitor(gpu_indices=cuda_indices, sync=sync, cpu_estimate=estimate)
    monitor.cpu_estimate_basis = estimate.basis
    return monitor


class HostMemoryPeak:
    """Peak resident memory of this process and its children (SuperOffload's CPU workers) since
    `reset`, read from the kernel's high-water marks (VmHWM in /proc/PID/status, reset by writing
    5 to /proc/PID/clear_refs).

    Nothing runs during the steps. A sampling thread did before: psutil's children() reads every
    process's /proc entry, and every tenth of a second that took the GIL from the thread that
    issues the kernels (host-bound steps: ZeRO-3, small models). The children's marks are added
    although their peaks need not coincide: a bound from above. Where the kernel offers no marks
    (not Linux) the peak is the largest of the totals read at `reset`, `sample` and `read`."""

    def __init__(self):
        self.peak_bytes = 0
        self.marks_reset = False  # False: the marks include start-up (model construction)
        self.sample()

    @staticmethod
    def _tree() -> list[psutil.Process]:
        proc = psutil.Process()
        return [proc, *proc.children(recursive=True)]

    @staticmethod
    def _high_water_bytes(proc: psutil.Process) -> int | None:
        try:
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def sample(self, tree: list[psutil.Process] | None = None) -> int:
        """Resident bytes of the tree now (it also raises the peak)."""
        total = 0
        for proc in tree or self._tree():
            try:
                total += proc.memory_info().rss
            except psutil.Error:
                pass
        self.peak_bytes = max(self.peak_bytes, total)
        return total

    def reset(self) -> None:
        """Forget the peak so far (start-up transients: compilers, model construction)."""
        tree = self._tree()
        self.marks_reset = True
        for proc in tree:
            try:
                Path(f"/proc/{proc.pid}/clear_refs").write_text("5")
            except OSError:
                self.marks_reset = False
        self.peak_bytes = 0
        self.sample(tree)

    def read(self) -> int:
        """The peak so far: the high-water marks where the kernel keeps them."""
        tree = self._tree()
        marks = [self._high_water_bytes(proc) for proc in tree]
        if all(m is not None for m in marks):
            self.peak_bytes = max(self.peak_bytes, sum(marks))
        self.sample(tree)
        return self.peak_bytes


def process_tree_cpu_s() -> float:
    """User + system CPU seconds of this process and its live children."""
    proc = psutil.Process()
    times = proc.cpu_times()
    total = times.user + times.system
    for child in proc.children(recursive=True):
        try:
            t = child.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def machine_info(device_kind: str) -> dict:
    """Host, accelerator and software versions, so a stored run says where it came from."""
    import deepspeed
    import torch

    info = {
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "deepspeed": deepspeed.__version__,
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "device": device_kind,
        # The caching allocator's settings decide how far torch's reserved pool exceeds its peak
        # allocation (expandable segments about halved the excess on H200): a run's reserved memory needs them.
        "cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        # calibration.harness.memory_cap: a pool capped below the GPU's memory (applied on a GPU only)
        "gpu_memory_cap_gib": memory_cap.cap_gib() if device_kind == "cuda" else None,
        # One boot of one machine (lent hosts are all named "vm"): runs.measured takes a host's speed
        # from all the runs of its boot.
        "boot_id": _boot_id(),
    }
    if device_kind == "cuda":
        info["cuda"] = torch.version.cuda
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_mem_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        # Which physical GPU: the same step drew 587-640 W on three lent H200s (machines BI, BJ, BK,
        # 2026-12-03), and whether a GPU repeats its own power needs its identity.
        info["gpu_uuid"] = str(torch.cuda.get_device_properties(0).uuid)
        from calibration.meters import open_gpu_meter

        meter = open_gpu_meter()
        info["driver"] = meter.driver_version() or f"unknown ({meter.kind} GPU meter)"
        meter.close()
    return info


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
