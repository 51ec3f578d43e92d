"""Facts about the machine for the profile's provenance, and the busy/hot check before measuring."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
from importlib import metadata

from calibration.sensors import GpuState

BUSY_UTILIZATION_PCT = 10.0
HOT_TEMPERATURE_C = 60.0
HOT_POWER_FRACTION = 0.3  # of the power limit; an idle H200 draws ~0.12-0.18 of its 700 W
BUSY_MEMORY_BYTES = 2 * 2**30


def host_cpu_name() -> str:
    try:
        import cpuinfo  # py-cpuinfo, a DeepSpeed dependency

        brand = cpuinfo.get_cpu_info().get("brand_raw")
        if brand:
            return brand
    except Exception:
        pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_memory_gib() -> float | None:
    try:
        import psutil

        return psutil.virtual_memory().total / 2**30
    except ImportError:
        return None


def host_memory_available_gib() -> float | None:
    """The host memory a new process may take now (psutil's `available`: free plus reclaimable cache)."""
    try:
        import psutil

        return psutil.virtual_memory().available / 2**30
    except ImportError:
        return None


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def host_link(gpu_name: str | None, is_cuda: bool) -> str:
    """c2c on Grace Hopper (the GPU is named GH200, or an NVIDIA GPU on an aarch64 host), else pcie."""
    if not is_cuda:
        return "none"
    if gpu_name and "GH200" in gpu_name.upper():
        return "c2c"
    return "c2c" if platform.machine() in ("aarch64", "arm64") else "pcie"


def collect(gpu_meter=None, meter_index: int = 0) -> dict:
    """Everything provenance needs, gathered without importing DeepSpeed (slow, noisy)."""
    import torch

    is_cuda = torch.cuda.is_available()
    gpu_name = torch.cuda.get_device_name(0) if is_cuda else None
    driver = None
    power_limit_w = None
    if gpu_meter is not None and gpu_meter.present:
        driver = gpu_meter.driver_version()
        state = gpu_meter.state(meter_index)
        power_limit_w = state.power_limit_w if state else None
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": socket.gethostname(),
        "arch": platform.machine(),
        "gpu": gpu_name,
        "gpu_memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30 if is_cuda else None,
        "gpu_power_limit_w": power_limit_w,
        "driver": driver,
        "cuda": torch.version.cuda if is_cuda else None,
        "torch": torch.__version__,
        "deepspeed": package_version("deepspeed"),
        "host_cpu": host_cpu_name(),
        "host_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "host_memory_gib": host_memory_gib(),
        "link": host_link(gpu_name, is_cuda),
        "python": platform.python_version(),
    }


def busy_or_hot(states: list[GpuState], own_pids: set[int] = frozenset()) -> list[str]:
    """Warnings for GPUs that would spoil the measurements: busy, shared, hot or drawing power.

    Processes in `own_pids` (this calibration's ranks) are not counted as other jobs.
    """
    out = []
    for s in states:
        tag = f"GPU {s.index} ({s.name})"
        others = [p for p in (s.process_pids or ()) if p not in own_pids]
        if s.utilization_pct is not None and s.utilization_pct >= BUSY_UTILIZATION_PCT:
            out.append(f"{tag} is {s.utilization_pct:.0f}% utilised: another job is running")
        if others:
            out.append(f"{tag} runs other compute processes (pids {', '.join(map(str, others))}): "
                       "timings and power will be shared")
        if s.process_pids is None and s.memory_used_bytes is not None and s.memory_used_bytes >= BUSY_MEMORY_BYTES:
            # Only when NVML cannot list processes: otherwise this run's own contexts would count.
            out.append(f"{tag} has {s.memory_used_bytes / 2**30:.1f} GiB in use")
        if s.temperature_c is not None and s.temperature_c >= HOT_TEMPERATURE_C:
            out.append(f"{tag} is at {s.temperature_c:.0f} C: idle power will read high; let it cool first")
        if s.power_w is not None and s.power_limit_w and s.power_w >= HOT_POWER_FRACTION * s.power_limit_w:
            out.append(f"{tag} draws {s.power_w:.0f} W of {s.power_limit_w:.0f} W: well above idle")
    return out
