"""Each CPU's speed on a lent machine, in rounds: is a host-bound step's spread between runs of one
lease the CPU its main thread lands on, or the host drifting over time?

    python3 lab/host_cpus.py ROUNDS > cpus.jsonl

One line per CPU and round: the issue probe (calibration.microbench.cpu.issue_us_per_layer, what
every run records) and a pure-Python loop, with this thread pinned to that CPU. A CPU that is slow
in every round is the CPU; a round that is slow on every CPU is the host.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PY_LOOP_ITERATIONS = 2_000_000  # about 0.1 s of bytecode


def python_loop_s() -> float:
    """The best of three runs of a bare Python loop: the interpreter's speed on this CPU."""
    best = float("inf")
    for _ in range(3):
        start, total = time.perf_counter(), 0
        for i in range(PY_LOOP_ITERATIONS):
            total += i
        best = min(best, time.perf_counter() - start)
    return best


def main(rounds: int) -> None:
    import torch

    from calibration.microbench.cpu import issue_us_per_layer

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    cpus = sorted(os.sched_getaffinity(0))
    torch.set_num_threads(1)  # one CPU: OpenMP workers would only contend with this thread
    for round_ in range(rounds):
        for cpu in cpus:
            os.sched_setaffinity(0, {cpu})
            row = {"round": round_, "cpu": cpu, "t_s": time.time(), "python_loop_s": python_loop_s(),
                   "issue_us_per_layer": issue_us_per_layer(device, sync)}
            print(json.dumps(row), flush=True)
    os.sched_setaffinity(0, cpus)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("rounds", nargs="?", type=int, default=3, help="passes over every CPU (default 3)")
    main(parser.parse_args().rounds)
