"""A step pass by pass on the GPU's own clock: how long each pass (forward, backward, optimizer step of
every micro-step) held the GPU, how much of that the GPU was busy, and how long its call took on the host.

Why: the cost model takes each pass's time as a smooth max of the host's issue time and the GPU's work
(`models.timing`), and the fitted runs whose two are close were under-predicted at every ZeRO stage.
Whole-step times cannot say which pass holds the missing time; this does.

Set ADVISOR_PHASE_TRACE=1 for a harness run: after the measured window (its numbers are taken first),
every rank runs MARKED_STEPS more steps with a marker kernel launched between passes:
- the marked steps, unprofiled, give each pass's GPU span from CUDA events recorded at the markers (the
  GPU reaching one marker to reaching the next, waits included) and its call's host seconds;
- the last, under torch.profiler with device activity only (host tracing would slow the very issue
  time that is measured), gives each pass's busy seconds: the union of its kernels, copies and memsets
  between two markers; and its device seconds by kind of kernel (GEMM, attention, communication, copies,
  the rest) with its longest kernels by name, so a pass the model misses says in which of its parts;
- then, where the GPU has an energy meter, marked steps for about POWER_WINDOW_S while a thread polls
  the counter, the passes' edges taken on the GPU's clock: each kind of pass's power (`pass_power`).
Rank 0 writes `phase_trace.json`. The CPU path (no CUDA) has no device clock: spans and busy times are
reported absent (None), the host seconds are measured; without a meter the passes' power is absent.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from calibration.harness.pass_power import ChangeSampler, PassPower, fit_pass_power

ENV = "ADVISOR_PHASE_TRACE"
MARKED_STEPS = 3
MARKER_KERNEL = "spin_kernel"  # torch.cuda._sleep's kernel: training never launches it
MARKER_CYCLES = 100
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
# The kinds a pass's device seconds are split into, as the cost model splits a pass's GPU work
# (`models.timing.StepTiming.pass_parts_s`). A kernel is known by its name, the first kind whose words
# it holds (case aside): NCCL's collectives; SDPA's flash and cuDNN kernels; cuBLAS and cuBLASLt GEMMs
# (nvjet_*, sm90_xmma_gemm_*, cutlass_*, their split-K reductions). Copies are the profiler's memcpy
# category; everything else (elementwise, norms, reductions, the loss, memsets) is "other".
KERNEL_CLASSES = ("gemm", "attention", "communication", "copy", "other")
KERNEL_WORDS = (("communication", ("nccl",)), ("attention", ("flash", "fmha", "attention", "sdpa")),
                ("gemm", ("gemm", "nvjet", "xmma", "cutlass", "cublas", "splitk")))
TOP_KERNELS = 12  # the longest kernels a pass names
KERNEL_NAME_CHARS = 160  # templated kernel names run to thousands of characters
POWER_WINDOW_S = 12.0  # about 120 counter changes at its ~100 ms
POWER_STEPS = (8, 200)  # the fewest and most steps for the passes' power


def wanted() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


@dataclass(frozen=True)
class DeviceOp:
    """One operation on the device, as torch.profiler's Chrome trace gives it."""

    name: str
    category: str  # one of DEVICE_CATEGORIES
    start_us: float
    end_us: float


@dataclass(frozen=True)
class PassKernels:
    """A pass's device seconds by KERNEL_CLASSES (each operation's own duration: a copy beside a kernel
    counts in both, so they may sum past the busy time) and its TOP_KERNELS longest kernels by name
    ({"name", "calls", "seconds"}, longest first)."""

    by_class_s: dict[str, float]
    top: list[dict]


@dataclass(frozen=True)
class PassTime:
    """One pass of one micro-step; device seconds None where there is no device clock."""

    name: str  # forward | backward | step
    micro_step: int
    host_s: float  # the call's own seconds on the host
    gpu_span_s: float | None  # from the GPU reaching this pass's marker to reaching the next
    gpu_busy_s: float | None  # the union of the pass's device operations (one profiled step)
    kernels: PassKernels | None = None  # the same profiled step's operations by kind

    @property
    def gpu_idle_s(self) -> float | None:
        if self.gpu_span_s is None or self.gpu_busy_s is None:
            return None
        return self.gpu_span_s - self.gpu_busy_s


class Marker:
    """Marks the passes of a step: the host's clock and, on CUDA, a marker kernel and a timed event."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.host_s: list[float] = []
        self.events: list = []

    def __call__(self) -> None:
        self.host_s.append(time.perf_counter())
        if self.cuda:
            import torch

            torch.cuda._sleep(MARKER_CYCLES)
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.events.append(event)

    def host_gaps_s(self) -> list[float]:
        return [b - a for a, b in zip(self.host_s, self.host_s[1:])]

    def gpu_gaps_s(self) -> list[float] | None:
        """Seconds between consecutive markers on the GPU (after a synchronize); None without CUDA."""
        if not self.cuda:
            return None
        return [a.elapsed_time(b) / 1e3 for a, b in zip(self.events, self.events[1:])]


def pass_names(grad_accum: int) -> list[tuple[str, int]]:
    """The passes between consecutive markers, in order."""
    return [(name, i) for i in range(grad_accum) for name in ("forward", "backward", "step")]


def ops_between_markers(ops: list[DeviceOp]) -> list[list[DeviceOp]]:
    """The operations between each two consecutive marker kernels, by start; those before the first
    marker belong to no pass."""
    passes: list[list[DeviceOp]] = []
    current: list[DeviceOp] | None = None
    for op in sorted(ops, key=lambda o: o.start_us):
        if MARKER_KERNEL in op.name:
            if current is not None:
                passes.append(current)
            current = []
        elif current is not None:
            current.append(op)
    return passes


def busy_between_markers_s(ops: list[DeviceOp]) -> list[float]:
    """Busy seconds of the device between consecutive marker kernels: the union of the other operations'
    intervals there. Overlapping operations (copies beside kernels) count once."""
    return [_union_us([(op.start_us, op.end_us) for op in between]) / 1e6 for between in ops_between_markers(ops)]


def kernel_class(op: DeviceOp) -> str:
    """Which of KERNEL_CLASSES an operation is (KERNEL_WORDS)."""
    if op.category == "gpu_memcpy":
        return "copy"
    name = op.name.lower()
    for kind, words in KERNEL_WORDS:
        if any(word in name for word in words):
            return kind
    return "other"


def kernels_between_markers(ops: list[DeviceOp]) -> list[PassKernels]:
    """Each pass's device seconds by kind and its longest kernels by name."""
    out = []
    for between in ops_between_markers(ops):
        by_class = dict.fromkeys(KERNEL_CLASSES, 0.0)
        by_name: dict[str, list[float]] = {}
        for op in between:
            seconds = (op.end_us - op.start_us) / 1e6
            by_class[kernel_class(op)] += seconds
            by_name.setdefault(op.name[:KERNEL_NAME_CHARS], []).append(seconds)
        longest = sorted(by_name.items(), key=lambda item: -sum(item[1]))[:TOP_KERNELS]
        out.append(PassKernels(by_class, [{"name": name, "calls": len(s), "seconds": sum(s)} for name, s in longest]))
    return out


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def device_events_of_trace(trace: dict) -> list[DeviceOp]:
    """A Chrome trace's device operations (torch.profiler's export); host events are left out."""
    return [DeviceOp(e["name"], e["cat"], float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
            for e in trace.get("traceEvents", []) if e.get("cat") in DEVICE_CATEGORIES and "ts" in e]


def pass_times(names: list[tuple[str, int]], host_gaps: list[list[float]], gpu_gaps: list[list[float]] | None,
               busy: list[float] | None, kernels: list[PassKernels] | None = None) -> list[PassTime]:
    """Each pass's medians over the marked steps, and its busy seconds and kernels from the profiled one."""
    out = []
    for k, (name, micro) in enumerate(names):
        span = statistics.median(g[k] for g in gpu_gaps) if gpu_gaps else None
        out.append(PassTime(name, micro, statistics.median(g[k] for g in host_gaps), span,
                            busy[k] if busy is not None and k < len(busy) else None,
                            kernels[k] if kernels is not None and k < len(kernels) else None))
    return out


def power_steps(step_s: float, agree: Callable[[float, str], float]) -> int:
    """How many steps fill POWER_WINDOW_S, the same on every rank (they step together)."""
    low, high = POWER_STEPS
    return int(min(high, max(low, math.ceil(agree(POWER_WINDOW_S / max(step_s, 1e-6), "max")))))


def kinds_of_passes(step_kinds: list[str], steps: int) -> list[str]:
    """The kind of every interval between consecutive edges of `steps` steps (see measure_pass_power)."""
    kinds: list[str] = []
    for n in range(steps):
        kinds.extend(step_kinds + (["forward"] if n < steps - 1 else []))
    return kinds


def power_step_s(recorded: dict) -> float:
    """The power steps' mean seconds, from their recorded edges: beside the marked steps' `step_s`, how
    much idle time the passes' watts hold (synchronized edges, machines BK and BL)."""
    return (recorded["edges"][-1] - recorded["edges"][0]) / recorded["steps"]


def refit_pass_power(recorded: dict) -> PassPower | None:
    """The passes' power from a trace's recorded counter changes and edges, by the current fit; None for
    a trace that kept no changes (machine BJ's, before they were kept)."""
    if "counter_changes" not in recorded:
        return None
    return fit_pass_power([tuple(c) for c in recorded["counter_changes"]], recorded["edges"],
                          kinds_of_passes(recorded["step_kinds"], recorded["steps"]))


def gpu_edges(run_step: Callable[[Callable[[], None]], object], sync: Callable[[], None], steps: int) -> list[float]:
    """The passes' edges on the GPU's own clock, as host times: a marker event between passes and no
    synchronize, each timed from an event recorded on the idle GPU at a known host time. The counter
    integrates what the GPU draws, so its edges are the GPU's, not the host's."""
    import torch

    marker = Marker(cuda=True)
    sync()
    origin = torch.cuda.Event(enable_timing=True)
    start = time.perf_counter()
    origin.record()
    for _ in range(steps):
        run_step(marker)
    sync()
    return [start + origin.elapsed_time(event) / 1e3 for event in marker.events]


def host_edges(run_step: Callable[[Callable[[], None]], object], sync: Callable[[], None], steps: int) -> list[float]:
    """The passes' edges as the host sees them after a synchronize at each (the path without CUDA events).
    On a GPU this costs: each pass then starts on an idle GPU while the host issues its first kernels,
    and such steps ran 3-16% longer than marked ones where the GPU is busy, 35% where the host is
    (machines BK and BL, whose traces were taken this way)."""
    edges: list[float] = []

    def mark() -> None:
        sync()
        edges.append(time.perf_counter())

    for _ in range(steps):
        run_step(mark)
    return edges


def measure_pass_power(run_step: Callable[[Callable[[], None]], object], sync: Callable[[], None],
                       grad_accum: int, steps: int, read_gpu_j: Callable[[], float | None],
                       cuda: bool) -> dict | None:
    """`steps` steps while the counter is polled; each kind of pass's power (`pass_power.fit_pass_power`),
    and the counter's changes and the edges it was fitted to (for other readings of the counter, and
    `power_step_s`). The host's moment from one step's
    end to the next one's start counts to the forward: as a kind of its own its fraction of a millisecond
    let the fit put kilowatts there (machine BJ). None where the counter is absent or too few of its
    changes fell within."""
    if read_gpu_j() is None:
        return None
    # A micro-step's step call before the last only accumulates: a kind of its own.
    names = [name if name != "step" or micro == grad_accum - 1 else "accumulate"
             for name, micro in pass_names(grad_accum)]
    with ChangeSampler(read_gpu_j) as sampler:
        edges = (gpu_edges if cuda else host_edges)(run_step, sync, steps)
    fitted = fit_pass_power(sampler.changes, edges, kinds_of_passes(names, steps))
    if fitted is None:
        return None
    return {"steps": steps, "edges_on": "gpu" if cuda else "host", **fitted.to_dict(), "step_kinds": names,
            "edges": edges, "counter_changes": sampler.changes}


def trace_passes(run_step: Callable[[Callable[[], None]], object], sync: Callable[[], None], grad_accum: int,
                 writing: bool, path: str | Path, cuda: bool,
                 read_gpu_j: Callable[[], float | None] = lambda: None,
                 agree: Callable[[float, str], float] = lambda value, op: value) -> None:
    """MARKED_STEPS marked steps, one profiled and the power steps on every rank; the writing rank
    writes the passes. `run_step(mark)` runs one step calling `mark()` before each pass and once after
    the last; `read_gpu_j` reads this rank's GPU energy counter (None without one); `agree` reduces a
    number over the ranks."""
    host_gaps, gpu_gaps, step_s = [], [], []
    for _ in range(MARKED_STEPS):
        marker = Marker(cuda)
        sync()
        start = time.perf_counter()
        run_step(marker)
        sync()
        step_s.append(time.perf_counter() - start)
        host_gaps.append(marker.host_gaps_s())
        gaps = marker.gpu_gaps_s()
        if gaps is not None:
            gpu_gaps.append(gaps)
    busy = kernels = None
    if cuda:
        import torch

        sync()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            run_step(Marker(cuda))
            sync()
        if writing:
            trace_path = Path(path).with_suffix(".trace.json")
            prof.export_chrome_trace(str(trace_path))
            ops = device_events_of_trace(json.loads(trace_path.read_text()))
            busy, kernels = busy_between_markers_s(ops), kernels_between_markers(ops)
            trace_path.unlink()
    power = measure_pass_power(run_step, sync, grad_accum, power_steps(statistics.median(step_s), agree),
                               read_gpu_j, cuda)
    if not writing:
        return
    passes = pass_times(pass_names(grad_accum), host_gaps, gpu_gaps or None, busy, kernels)
    summary = {"device": "cuda" if cuda else "cpu", "marked_steps": MARKED_STEPS,
               "step_s": statistics.median(step_s),
               "passes": [{**asdict(p), "gpu_idle_s": p.gpu_idle_s} for p in passes], "pass_power": power}
    Path(path).write_text(json.dumps(summary, indent=1))
