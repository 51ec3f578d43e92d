"""Where one optimizer step's time goes: the host's Python functions (cProfile) and the device's
kernels and copies (torch.profiler). The cost model's phases are checked against this.

Set ADVISOR_STEP_PROFILE=1 for a harness run: after the measured window (its numbers are taken
first, so the profilers cost them nothing), every rank runs two more steps and rank 0 profiles
them, one under each profiler, and writes `step_profile.json`: the wall time of each profiled
step, DeepSpeed's functions by cumulative time, builtins (copies, casts, norms, the CPU Adam
kernel) by own time with their heaviest callers, and device operations (kernels, memcpy by kind)
by device time.
"""
from __future__ import annotations

import cProfile
import json
import os
import pstats
import time
from pathlib import Path
from typing import Callable

ENV = "ADVISOR_STEP_PROFILE"
TOP_FUNCTIONS = 40
TOP_BUILTINS = 30
TOP_DEVICE_OPS = 30
TOP_CALLERS = 3


def wanted() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def _name(key: tuple) -> str:
    filename, line, func = key
    if filename == "~":  # a builtin: cProfile names it in the function slot
        return func
    parts = Path(filename).parts
    short = "/".join(parts[parts.index("deepspeed"):]) if "deepspeed" in parts else Path(filename).name
    return f"{short}:{line} {func}"


def summarize_host(stats: dict) -> dict:
    """pstats' raw table -> the slowest DeepSpeed functions and builtins, in seconds."""
    functions, builtins = [], []
    for key, (_, calls, own_s, cumulative_s, callers) in stats.items():
        row = {"function": _name(key), "calls": calls, "own_s": round(own_s, 4), "cumulative_s": round(cumulative_s, 4)}
        if key[0] == "~":
            heaviest = sorted(callers.items(), key=lambda kv: -kv[1][2])[:TOP_CALLERS]
            row["callers"] = [{"function": _name(k), "own_s": round(v[2], 4)} for k, v in heaviest]
            builtins.append(row)
        elif "deepspeed" in Path(key[0]).parts:
            functions.append(row)
    functions.sort(key=lambda r: -r["cumulative_s"])
    builtins.sort(key=lambda r: -r["own_s"])
    return {"deepspeed_functions": functions[:TOP_FUNCTIONS], "builtins": builtins[:TOP_BUILTINS]}


def summarize_device(key_averages) -> list[dict]:
    """torch.profiler's averages -> operations by their own device time (kernels, memcpy kinds)."""
    rows = []
    for evt in key_averages:
        device_us = getattr(evt, "self_device_time_total", None)
        if device_us is None:
            device_us = getattr(evt, "self_cuda_time_total", 0.0)
        rows.append({"op": evt.key, "count": evt.count, "device_s": round(device_us / 1e6, 4),
                     "host_own_s": round(evt.self_cpu_time_total / 1e6, 4)})
    rows.sort(key=lambda r: (-r["device_s"], -r["host_own_s"]))
    return rows[:TOP_DEVICE_OPS]


def profile_steps(step: Callable[[], object], sync: Callable[[], None], profiling: bool, path: str | Path,
                  cuda: bool) -> None:
    """Two more steps on every rank; the profiling rank writes what they spent to `path`."""
    if not profiling:
        step()
        step()
        return
    import torch

    sync()
    host = cProfile.Profile()
    start = time.perf_counter()
    host.enable()
    step()
    sync()
    host.disable()
    host_step_s = time.perf_counter() - start

    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    start = time.perf_counter()
    with torch.profiler.profile(activities=activities) as device:
        step()
        sync()
    device_step_s = time.perf_counter() - start

    summary = {"cprofile_step_s": round(host_step_s, 4), "torch_profiler_step_s": round(device_step_s, 4),
               **summarize_host(pstats.Stats(host).stats), "device_ops": summarize_device(device.key_averages())}
    Path(path).write_text(json.dumps(summary, indent=1))
