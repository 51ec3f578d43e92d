"""A few seconds' measure of the host a run lands on, taken on every rank before the model is built.

Lent machines of one kind differ: on 2026-12-01 the same CPU-offload step took 9.9 s on one
2x H200 host and 5.4 s on another. A run's step time is only comparable with the model's when
the host's speed is known, so each run records two host rates beside its result:
- `issue_us_per_layer`: the host's time to issue one small layer's forward and backward from
  Python (dispatch, autograd, kernel launch): what bounds small or short-context steps and
  ZeRO-3's hooks. The layers are tiny, so the GPU waits on the host throughout.
- `cpu_adam_params_per_s`: DeepSpeedCPUAdam at the rank's threads, where the run offloads the
  optimizer or the op is already built (building it costs a minute; a run that does not use
  it does not pay for it). Taken after the issue time: OpenMP workers that still spin after a
  CPUAdam step slowed the issue time by up to 20% (benchmarks/host_probe.py).
All ranks probe together, as they would contend in training. The issue time is taken again right
before the measured window and right after it (`reprobe_issue`): a lent host drifts within minutes
(one ran the same step 0.11-0.21 s in eleven minutes, 2026-12-02), and a host-bound step follows
the probes on both sides of its window, not the one taken before its model was built.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

ADAM_PROBE_PARAMS = 2**26  # 64M fp32 parameters (1 GiB with the states): 0.1 s a step on one thread


@dataclass(frozen=True)
class HostProbe:
    issue_us_per_layer: float | None  # None: the probe failed (see `failed`)
    cpu_adam_params_per_s: float | None  # None: not measured (no offload and the op not built, or no GPU)
    threads: int
    failed: str = ""  # why a probe that should have run did not: the run goes on without it

    def to_dict(self) -> dict:
        return asdict(self)


def cpu_adam_params_per_s(threads: int) -> float:
    """DeepSpeedCPUAdam's step rate over ADAM_PROBE_PARAMS parameters on `threads` threads."""
    import torch
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        p = torch.nn.Parameter(torch.zeros(ADAM_PROBE_PARAMS))
        p.grad = torch.full_like(p, 1e-3)
        opt = DeepSpeedCPUAdam([p], lr=1e-4, adamw_mode=True)
        opt.step()
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(old)
    return ADAM_PROBE_PARAMS / statistics.median(times)


def probe(device, sync, offloads_optimizer: bool) -> HostProbe:
    """This rank's probe at its own thread count (what the launch set: OMP_NUM_THREADS)."""
    import torch

    from calibration.microbench.cpu import deepspeed_cpu_adam_built

    threads = torch.get_num_threads()
    issue, why = _issue_us(device, sync)  # first: OpenMP threads spinning after CPUAdam slow it by ~20%
    adam, failed = None, [why] if why else []
    if device.type == "cuda" and (offloads_optimizer or deepspeed_cpu_adam_built()):
        try:
            adam = cpu_adam_params_per_s(threads)
        except Exception as exc:  # noqa: BLE001 - e.g. the op does not build; the run reports its own failure
            failed.append(f"cpu_adam: {type(exc).__name__}: {exc}"[:200])
    return HostProbe(issue_us_per_layer=issue, cpu_adam_params_per_s=adam, threads=threads, failed="; ".join(failed))


def _issue_us(device, sync, rounds: int | None = None) -> tuple[float | None, str]:
    """The issue time (the median of `rounds` rounds; None: the probe's own count), or None and why it
    failed: a probe never costs the run."""
    from calibration.microbench.cpu import ISSUE_PROBE_ROUNDS, issue_us_per_layer

    try:
        return issue_us_per_layer(device, sync, rounds or ISSUE_PROBE_ROUNDS), ""
    except Exception as exc:  # noqa: BLE001
        return None, f"issue: {type(exc).__name__}: {exc}"[:200]


def reprobe_issue(device, sync) -> float | None:
    """This rank's issue time again, beside the measured window; None where it fails (the run keeps
    the probe taken before its model)."""
    return _issue_us(device, sync)[0]


def issue_between_steps(device, sync) -> float | None:
    """This rank's issue time in one round (about 50 ms on a lent H200 slice), for a probe within the
    measured window (`MeasuredWindow.between_steps`): several such, each between two stretches of
    steps, read the host the steps ran on; None where it fails."""
    return _issue_us(device, sync, rounds=1)[0]


def _slowest(issue_per_rank: list[float | None] | None) -> float | None:
    """The slowest rank's issue time (a step waits for it); None unless every rank took it."""
    issue = issue_per_rank or [None]
    return None if any(i is None for i in issue) else max(issue)


def combine(per_rank: list[dict], issue_after_per_rank: list[float | None] | None = None,
            issue_window_start_per_rank: list[float | None] | None = None,
            issue_in_window_per_rank: list[list[float | None]] | None = None) -> dict:
    """The job's host probe: the slowest rank's rates (a step waits for it), and each rank's; a rate
    that any rank could not measure is None. `issue_us_per_layer_window_start` and
    `issue_us_per_layer_after` are the slowest rank's issue time right before and right after the
    measured window, where every rank took it; `issue_us_per_layer_in_window` the slowest rank's at
    each probe within the window (every rank probes after the same steps)."""
    adam = [r["cpu_adam_params_per_s"] for r in per_rank]
    in_window = [_slowest(list(each)) for each in zip(*issue_in_window_per_rank)] if issue_in_window_per_rank else []
    return {
        "issue_us_per_layer": _slowest([r["issue_us_per_layer"] for r in per_rank]),
        "issue_us_per_layer_window_start": _slowest(issue_window_start_per_rank),
        "issue_us_per_layer_after": _slowest(issue_after_per_rank),
        "issue_us_per_layer_in_window": in_window,
        # Probes time torch's own linear, not the one deepspeed.zero.Init leaves behind
        # (calibration.microbench.cpu.torch_own_linear); records without this took ZeRO-3's after-probe
        # through DeepSpeed's wrapper.
        "issue_probe_linear": "torch",
        "cpu_adam_params_per_s": None if any(a is None for a in adam) else min(adam),
        "threads": per_rank[0]["threads"],
        "per_rank": per_rank,
    }
