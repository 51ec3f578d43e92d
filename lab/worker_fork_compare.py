"""Does a step served by the calibration's DeepSpeed worker run as it would in a process of its own?

ZeRO-3 of qwen3-0.6b at 2k took 0.762 s in the worker that served every request itself, against 0.587 s
in a process of its own, on two leases of one H100 (at different host probes, so the host may explain
it). This times the calibration's own steps on one lease, in the order the calibration runs them (the
ZeRO-3 hook benchmark first), twice: the worker serving each request itself (`ADVISOR_WORKER_FORK=0`),
then forking a child per request (the default). One JSON line per request, with the step's time and
its host probe. On the CPU (no GPU) the same requests run on the calibration's CPU path: tiny sizes.

    python lab/worker_fork_compare.py OUT.jsonl
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch

from calibration.calibrate import _worker
from calibration.ds_worker import FORK_ENV
from calibration.microbench import ds_steps
from calibration.microbench.common import BenchContext, sizes_for
from calibration.microbench.layer import CPU_SHAPES
from calibration.microbench.zero3_hooks import WORKER_TIMEOUT_S, ZERO3_PRESETS

ORDER = ("zero3_hooks", "z3", "z2-offload", "z3")


def one_mode(fork: bool, out) -> None:
    os.environ[FORK_ENV] = "1" if fork else "0"
    cuda = torch.cuda.is_available()
    ctx = BenchContext(device=torch.device("cuda", 0) if cuda else torch.device("cpu"), sizes=sizes_for(False, not cuda))
    preset = ZERO3_PRESETS[-1] if cuda else tuple(CPU_SHAPES)[0]
    ctx.worker = _worker(ctx)
    try:
        started = time.monotonic()
        warm = ctx.worker.request(ds_steps.warm_request(ctx), ds_steps.WARM_TIMEOUT_S)
        out.write(json.dumps({"fork": fork, "request": "warm", "wall_s": time.monotonic() - started, **warm}) + "\n")
        for position, name in enumerate(ORDER):
            started = time.monotonic()
            row = {"fork": fork, "request": name, "position": position}
            try:
                if name == "zero3_hooks":
                    data = ctx.worker.request({"op": "zero3_hooks", "preset": preset}, WORKER_TIMEOUT_S)
                    row["forward_ratio_checkpointed"] = data.get("checkpointed_forward_ratio")
                else:
                    result = ds_steps.bench_step(ctx, next(c for c in ds_steps.CASES if c.name == name))["result"]
                    probe = result["host_probe"]
                    row.update(step_time_s=result["step_time_s"], step_times_s=result["step_times_s"],
                               issue_us_per_layer=probe["issue_us_per_layer"],
                               cpu_adam_params_per_s=probe["cpu_adam_params_per_s"],
                               peak_gpu_reserved_gib=result["peak_gpu_reserved_gib"],
                               config_adjustments=result["config_adjustments"])
            except Exception as exc:  # noqa: BLE001 - one line per failed request, the rest goes on
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            row["wall_s"] = time.monotonic() - started
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(row.get("request"), "fork" if fork else "shared", row.get("step_time_s"), row.get("error", ""),
                  f"{row['wall_s']:.1f} s", flush=True)
    finally:
        ctx.worker.close()


def main(path: str) -> int:
    with open(path, "a") as out:
        for fork in (False, True):
            one_mode(fork, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
