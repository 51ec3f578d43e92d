"""How the GPU's power falls after dense work stops: what a training step's short waits draw.

`power.gpu.wait` is seconds of idling. A step's waits last milliseconds to seconds after dense
work (DeepSpeed's walk over the tensors at the step, the CPU optimizer), and the GPU's power does
not drop at once: on H200 gaps of 5-10 ms after a GEMM burst drew what it drew busy, of 100 ms about
290 W, against 126 W idle (data/calibration/README.md, 2026-12-01). This runs cycles of a bf16 GEMM burst and a
host sleep, one energy window per sleep length (the first with none: the bursts' own power), and
records each window's energy and its busy and idle seconds; the profile writer fits the decay
(`calibration.fitting.fit_wait_decay`). Local rank 0 only: it measures its own GPU.
"""
from __future__ import annotations

import time

from calibration.microbench import overlap
from calibration.microbench.common import BenchContext, BenchItem, Skip, time_per_call

BURST_S = 0.1
# Gaps of 5 and 10 ms are not timed: their windows took 13.6 of the family's 34 s, and the decay fitted
# without them moved by at most 0.2% on each of the five calibrations stored (H200 and H100, 30-33 ms;
# those windows weigh least in the fit, their gaps' power being the window's less the bursts').
GAPS_S = (0.0, 0.02, 0.05, 0.1, 0.2, 0.5)
# A short gap's power is the window's energy less the bursts', over little idle time: each window
# lasts until its gaps add up to this much (at most MAX_WINDOW_S), so the bursts' error stays small.
MIN_IDLE_S = 0.5
MAX_WINDOW_S = 8.0


def bench_wait_decay(ctx: BenchContext) -> dict:
    if ctx.local_rank != 0:
        return {"ran": False}
    if not ctx.is_cuda or ctx.monitor is None or ctx.monitor.gpu_meter_kind == "absent":
        raise Skip("needs a GPU energy meter (NVML)")
    gemm, _ = overlap.gemm_call(ctx)
    calls = max(1, round(BURST_S / time_per_call(ctx, gemm)))

    def burst() -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            gemm()
        ctx.sync()
        return time.perf_counter() - t0

    series = []
    for gap_s in GAPS_S:
        burst()  # each window starts hot
        ctx.monitor.begin_window(f"wait-decay-{gap_s}")
        busy_s, cycles, t0 = 0.0, 0, time.perf_counter()
        window_s = ctx.sizes.power_window_s
        if gap_s > 0:
            window_s = min(MAX_WINDOW_S, max(window_s, MIN_IDLE_S * (BURST_S + gap_s) / gap_s))
        while time.perf_counter() - t0 < window_s:
            busy_s += burst()
            time.sleep(gap_s)
            cycles += 1
        m = ctx.monitor.end_window(f"wait-decay-{gap_s}")
        if not m.gpu_energy_j:
            raise Skip("the GPU energy meter read nothing")
        series.append({"gap_s": gap_s, "cycles": cycles, "time_s": m.time_s, "busy_s": busy_s,
                       "gpu_energy_j": sum(m.gpu_energy_j.values()) / len(m.gpu_energy_j)})
    return {"ran": True, "burst_s": BURST_S, "series": series}


def items(ctx: BenchContext) -> list[BenchItem]:
    return [BenchItem("wait_decay", "wait_decay", bench_wait_decay, label="power: waits after dense work")]
