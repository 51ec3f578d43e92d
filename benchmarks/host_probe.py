"""How repeatable the harness's host probe is on this machine, and what moves it.

    python benchmarks/host_probe.py [--rounds 10] [--out results.json]

Each row probes `rounds` times in one process and prints the median, the spread (max/min) and the
coefficient of variation: the issue time of a tiny layer alone, at 1 and at all cores' torch
threads, and right after a CPUAdam step on all cores (as the harness probes an offload run), and
CPUAdam itself at 1 thread and all cores. A probe worth recording varies less between rounds than
hosts differ (2026-12-01: the same host-bound step 1.2-1.5x apart between lent hosts).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from calibration.harness.host_probe import cpu_adam_params_per_s, issue_us_per_layer  # noqa: E402
from calibration.microbench.cpu import deepspeed_cpu_adam_built, host_cores  # noqa: E402


def summary(name: str, unit: str, values: list[float]) -> dict:
    med = statistics.median(values)
    return {"probe": name, "unit": unit, "rounds": len(values), "median": med, "max_over_min": max(values) / min(values),
            "cv": statistics.pstdev(values) / statistics.mean(values)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--out", default=None, help="write the rows as JSON too")
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    cores = host_cores()
    adam = cuda or deepspeed_cpu_adam_built()  # the CPU path skips CPUAdam's minute-long build
    rows = []

    def issue_rounds(threads: int, after_adam: bool) -> list[float]:
        torch.set_num_threads(threads)
        out = []
        for _ in range(args.rounds):
            if after_adam:
                cpu_adam_params_per_s(cores)
            out.append(issue_us_per_layer(device, sync))
        return out

    rows.append(summary("issue, 1 torch thread", "us/layer", issue_rounds(1, False)))
    rows.append(summary(f"issue, {cores} torch threads", "us/layer", issue_rounds(cores, False)))
    if adam:
        rows.append(summary(f"issue after CPUAdam on {cores} threads", "us/layer", issue_rounds(cores, True)))
        for threads in (1, cores):
            rates = [cpu_adam_params_per_s(threads) / 1e9 for _ in range(args.rounds)]
            rows.append(summary(f"CPUAdam, {threads} thread{'s' * (threads > 1)}", "G params/s", rates))
    print(f"host probe repeatability on {'GPU ' + torch.cuda.get_device_name(0) if cuda else 'the CPU'}, "
          f"{cores} cores, {args.rounds} rounds a row{'' if adam else ' (CPUAdam not built: skipped)'}")
    print(f"{'probe':40s} {'median':>10s} {'unit':>11s} {'max/min':>8s} {'cv':>6s}")
    for r in rows:
        print(f"{r['probe']:40s} {r['median']:10.3f} {r['unit']:>11s} {r['max_over_min']:8.2f} {r['cv']:6.1%}")
    if args.out:
        Path(args.out).write_text(json.dumps({"cores": cores, "cuda": cuda, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
