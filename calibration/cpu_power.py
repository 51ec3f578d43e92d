"""Host CPU energy: RAPL counters, Grace hwmon power meters, or a stated estimate.

Each meter is a cumulative counter in joules (`read_j`). RAPL counts microjoules and
wraps; Grace's ACPI power meters report an average power in microwatts, which a
background thread integrates. Where neither exists the energy is not measured: an
estimate is only ever produced by `CpuPowerEstimate`, and labelled as one.
"""
from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from calibration.sensors import CpuMeter, SensorUnavailable

POWERCAP_ROOT = Path("/sys/class/powercap")
HWMON_ROOT = Path("/sys/class/hwmon")

# Datasheet TDP per core of three server CPUs; the estimate's basis when no sensor exists.
# AMD EPYC 9554: 360 W / 64 cores = 5.6; Intel Xeon Platinum 8480+: 350 W / 56 = 6.25;
# NVIDIA Grace CPU Superchip: 500 W incl. LPDDR5X / 144 = 3.5. The median is used.
TDP_PER_CORE_W = 5.6
IDLE_FRACTION_OF_TDP = 0.3


class RaplMeter(CpuMeter):
    """Sum of RAPL package (and DRAM) domains, handling counter wrap-around."""

    kind = "rapl"

    def __init__(self, root: Path = POWERCAP_ROOT):
        domains = []
        for d in sorted(root.glob("intel-rapl:*")):
            name = (d / "name").read_text().strip() if (d / "name").exists() else ""
            # Top-level package domains, and DRAM (not inside the package count). Skip psys,
            # which already includes everything, and core/uncore, which are inside the package.
            top_level = d.name.count(":") == 1
            if (top_level and name.startswith("package")) or name == "dram":
                domains.append(d)
        if not domains:
            raise SensorUnavailable(f"no RAPL package domains under {root}")
        self._files, self._ranges_uj = [], []
        for d in domains:
            try:
                int((d / "energy_uj").read_text())
            except PermissionError as exc:
                raise SensorUnavailable(
                    f"{d}/energy_uj is not readable (root-only since CVE-2020-8694); run as root or "
                    f"`sudo chmod o+r {root}/intel-rapl:*/energy_uj {root}/intel-rapl:*/*/energy_uj`"
                ) from exc
            self._files.append(d / "energy_uj")
            rng = d / "max_energy_range_uj"
            self._ranges_uj.append(int(rng.read_text()) if rng.exists() else 2**32)
        self.domains = [d.name for d in domains]
        self._last_uj = [int(f.read_text()) for f in self._files]
        self._total_j = 0.0
        self._lock = threading.Lock()

    def read_j(self) -> float:
        with self._lock:
            for i, f in enumerate(self._files):
                now = int(f.read_text())
                delta = now - self._last_uj[i]
                if delta < 0:  # the counter wrapped
                    delta += self._ranges_uj[i]
                self._total_j += delta * 1e-6
                self._last_uj[i] = now
            return self._total_j


_GRACE_LABEL = re.compile(r"^(Module|Grace|CPU|SysIO) Power Socket (\d+)$")


def find_grace_sensors(root: Path = HWMON_ROOT) -> dict[str, dict[int, Path]]:
    """`{"Grace": {socket: path to power1_average}, "Module": {...}, ...}` from oem_info labels."""
    found: dict[str, dict[int, Path]] = {}
    for hw in sorted(root.glob("hwmon*")):
        for base in (hw, hw / "device"):
            label_file = base / "power1_oem_info"
            if not label_file.exists():
                continue
            m = _GRACE_LABEL.match(label_file.read_text().strip())
            if m and (base / "power1_average").exists():
                found.setdefault(m.group(1), {})[int(m.group(2))] = base / "power1_average"
    return found


class GraceHwmonMeter(CpuMeter):
    """Integrates the 'Grace Power Socket N' meters (CPU, LPDDR5X and SoC of each socket).

    'Module Power' also covers the GPU of a GH200, so it is read only to tell whether
    NVML's number includes the CPU (see `module_power_w`), never added to CPU energy.
    """

    kind = "grace-hwmon"

    def __init__(self, root: Path = HWMON_ROOT, sample_interval_s: float = 0.05):
        sensors = find_grace_sensors(root)
        if not sensors.get("Grace"):
            raise SensorUnavailable(f"no 'Grace Power Socket' hwmon meters under {root}")
        self._grace = [sensors["Grace"][s] for s in sorted(sensors["Grace"])]
        self._module = [sensors["Module"][s] for s in sorted(sensors.get("Module", {}))]
        for path in self._grace:
            try:
                int(path.read_text())
            except PermissionError as exc:
                raise SensorUnavailable(f"{path} is not readable; run as root or chmod o+r it") from exc
        self.sockets = len(self._grace)
        self._interval_s = sample_interval_s
        self._total_j = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._last_w = self._read_w(self._grace)
        self._last_t = time.monotonic()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    @staticmethod
    def _read_w(paths: list[Path]) -> float:
        return sum(int(p.read_text()) for p in paths) * 1e-6  # microwatts

    def _advance(self) -> None:
        now_t, now_w = time.monotonic(), self._read_w(self._grace)
        with self._lock:
            self._total_j += 0.5 * (now_w + self._last_w) * (now_t - self._last_t)
            self._last_t, self._last_w = now_t, now_w

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._advance()

    def read_j(self) -> float:
        self._advance()
        with self._lock:
            return self._total_j

    def module_power_w(self) -> float | None:
        return self._read_w(self._module) if self._module else None

    def cpu_power_w(self) -> float:
        return self._read_w(self._grace)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)


@dataclass(frozen=True)
class CpuPowerEstimate:
    """Host CPU power when no sensor exists: an estimate, with its basis spelled out."""

    idle_w: float
    busy_w: float
    basis: str

    def energy_j(self, time_s: float, utilization: float) -> float:
        u = min(max(utilization, 0.0), 1.0)
        return time_s * (self.idle_w + u * (self.busy_w - self.idle_w))


def estimate_cpu_power(cores: int, tdp_w: float | None = None, idle_w: float | None = None) -> CpuPowerEstimate:
    """Estimate from a given TDP, else from the core count and TDP_PER_CORE_W."""
    if tdp_w is None:
        busy = cores * TDP_PER_CORE_W
        basis = (
            f"estimate, not measured: {cores} cores x {TDP_PER_CORE_W} W/core (median datasheet TDP per core of "
            "EPYC 9554, Xeon 8480+, Grace CPU Superchip)"
        )
    else:
        busy = float(tdp_w)
        basis = f"estimate, not measured: user-given TDP {tdp_w} W"
    if idle_w is None:
        idle = IDLE_FRACTION_OF_TDP * busy
        basis += f"; idle = {IDLE_FRACTION_OF_TDP} x that (rule of thumb)"
    else:
        idle = float(idle_w)
        basis += f"; user-given idle {idle_w} W"
    return CpuPowerEstimate(idle_w=idle, busy_w=busy, basis=basis)


class CpuUtilization:
    """Whole-host CPU utilisation between two calls (psutil), for the estimate."""

    def __init__(self):
        import psutil

        self._psutil = psutil
        self._last = psutil.cpu_times()

    def since_last(self) -> float:
        now = self._psutil.cpu_times()
        total = sum(now) - sum(self._last)
        idle = (now.idle - self._last.idle) + (getattr(now, "iowait", 0.0) - getattr(self._last, "iowait", 0.0))
        self._last = now
        return 0.0 if total <= 0 else max(0.0, 1.0 - idle / total)
