"""What a GPU draws in the short idle gaps inside a training step (issue #12: energy).

The profile's `power.gpu.wait` is measured over seconds of idling; a step's waits (the host's
optimizer walk, DeepSpeed's per-step work, host-bound stretches) last milliseconds between bursts
of dense work. This runs cycles of a bf16 GEMM burst and a host sleep, for several gap lengths, and
reads NVML's energy counter over each series: the energy the gaps took is the series' energy less
the bursts' (at the continuous GEMM power measured first), per second of gap.
    python scripts/gap_power.py OUT.json
"""
from __future__ import annotations

import json
import sys
import time

import pynvml
import torch

BURST_S = 0.1
GAPS_S = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
SERIES_S = 4.0  # NVML's counter updates about every 100 ms: several seconds a series


def main(out_path: str) -> None:
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    energy_j = lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3  # noqa: E731
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn_like(a)
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(50):
        a @ b
    torch.cuda.synchronize()
    gemm_s = (time.perf_counter() - t0) / 50
    per_burst = max(1, round(BURST_S / gemm_s))

    def burst():
        for _ in range(per_burst):
            a @ b
        torch.cuda.synchronize()

    def series(gap_s: float) -> dict:
        burst()  # the GPU starts each series warm
        e0, t0, busy = energy_j(), time.perf_counter(), 0.0
        cycles = 0
        while time.perf_counter() - t0 < SERIES_S:
            tb = time.perf_counter()
            burst()
            busy += time.perf_counter() - tb
            if gap_s:
                time.sleep(gap_s)
            cycles += 1
        wall = time.perf_counter() - t0
        return {"gap_s": gap_s, "cycles": cycles, "wall_s": wall, "busy_s": busy, "energy_j": energy_j() - e0}

    continuous = series(0.0)
    busy_w = continuous["energy_j"] / continuous["wall_s"]
    rows = []
    for gap in GAPS_S:
        s = series(gap)
        idle_s = s["wall_s"] - s["busy_s"]
        s["gap_power_w"] = (s["energy_j"] - busy_w * s["busy_s"]) / idle_s
        s["average_power_w"] = s["energy_j"] / s["wall_s"]
        rows.append(s)
        print(f"gap {gap * 1e3:6.1f} ms: {s['cycles']:4d} cycles, average {s['average_power_w']:5.0f} W, "
              f"gap {s['gap_power_w']:5.0f} W", flush=True)
    time.sleep(2.0)
    e0, t0 = energy_j(), time.perf_counter()
    time.sleep(SERIES_S)
    idle_w = (energy_j() - e0) / (time.perf_counter() - t0)
    print(f"continuous GEMM {busy_w:.0f} W; idle after 2 s {idle_w:.0f} W", flush=True)
    with open(out_path, "w") as f:
        json.dump({"gemm_s": gemm_s, "burst_s": per_burst * gemm_s, "continuous_w": busy_w, "idle_w": idle_w,
                   "series": rows, "gpu": pynvml.nvmlDeviceGetName(handle),
                   "driver": pynvml.nvmlSystemGetDriverVersion(), "torch": torch.__version__,
                   "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
