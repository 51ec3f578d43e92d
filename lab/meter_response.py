"""How the GPU's power readings follow a known load: a square wave of GEMM bursts and idle gaps.

Why: the phase trace fits each pass's power from NVML's energy counter (`calibration/harness/pass_power.py`),
taking the counter as the integral of the power, delayed. On machine BJ (2026-12-03) that fit left 55-97 W
of residual and a delay anywhere from 0 to 220 ms: the counter may follow a running mean of the power
instead. A square wave whose edges the host knows tells what each reading is: the energy counter, NVML's
power (`nvmlDeviceGetPowerUsage`) and its instantaneous power field where the driver has one, each
polled on a thread of its own and kept at every change with its host time.

    python lab/meter_response.py OUT.json [--periods 0.2,0.5,2] [--seconds 8]

Writes the waves' edges (host times the bursts began and ended, after a synchronize) and each
reading's changes. Without a GPU the waves run tiny matmuls on the CPU and every reading is absent.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from calibration.harness.pass_power import ChangeSampler  # noqa: E402
from calibration.meters import NullGpuMeter, open_gpu_meter  # noqa: E402

GPU = torch.cuda.is_available()
GEMM_SIZE = 8192 if GPU else 64


def sync() -> None:
    if GPU:
        torch.cuda.synchronize()


def square_wave(period_s: float, seconds: float) -> list[tuple[float, float]]:
    """Bursts of back-to-back GEMMs for half of each period, idle for the other half; each burst's
    (start, end) host times, the end after a synchronize."""
    a = torch.randn(GEMM_SIZE, GEMM_SIZE, device="cuda" if GPU else "cpu", dtype=torch.bfloat16)
    bursts, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds:
        on = time.perf_counter()
        while time.perf_counter() - on < period_s / 2:
            for _ in range(4):
                a @ a
            sync()
        off = time.perf_counter()
        bursts.append((on, off))
        time.sleep(max(0.0, on + period_s - time.perf_counter()))
    return bursts


def main(out: Path, periods_s: list[float], seconds: float) -> None:
    sensor = open_gpu_meter() if GPU else NullGpuMeter("no GPU")
    index = sensor.meter_indices([0])[0] if sensor.present else 0

    def counter_j():
        readings = sensor.read_j([index])
        return None if readings is None else readings[index]

    reads = {"energy_counter_j": counter_j, "power_w": lambda: sensor.power_w(index),
             "instant_power_w": lambda: sensor.instant_power_w(index)}
    waves = []
    with ExitStack() as stack:
        samplers = {name: stack.enter_context(ChangeSampler(read)) for name, read in reads.items()}
        time.sleep(1.0 if GPU else 0.01)  # idle before the first wave
        for period in periods_s:
            waves.append({"period_s": period, "bursts": square_wave(period, seconds)})
            time.sleep(2.0 if GPU else 0.01)
    changes = {name: sampler.changes for name, sampler in samplers.items()}
    out.write_text(json.dumps({"meter": sensor.kind, "gemm_size": GEMM_SIZE, "waves": waves, "readings": changes}))
    counts = ", ".join(f"{name} {len(c)} changes" for name, c in changes.items())
    print(f"{len(waves)} waves -> {out} ({sensor.kind}: {counts})")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--periods", default="0.2,0.5,2", help="square waves' periods in seconds (default 0.2,0.5,2)")
    p.add_argument("--seconds", type=float, default=8.0, help="how long each wave runs (default 8)")
    args = p.parse_args(argv)
    try:
        args.periods = [float(v) for v in args.periods.split(",")]
    except ValueError:
        p.error(f"--periods: not a list of seconds: {args.periods!r}")
    if not args.periods or min(args.periods) <= 0 or args.seconds <= 0:
        p.error("--periods and --seconds must be positive")
    return args


if __name__ == "__main__":
    a = parse_args(sys.argv[1:])
    main(a.out, a.periods, a.seconds)
