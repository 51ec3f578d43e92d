"""Host CPU: the offloaded optimizer step (params/s on all cores, and against threads), memory
bandwidth, and the host's issue time per layer (its single-thread speed: what host-bound steps wait on).

ZeRO-Offload runs DeepSpeedCPUAdam on the host; its throughput bounds the step when the
optimizer is offloaded. DeepSpeedCPUAdam is JIT-compiled with the host compiler at first
use (about a minute and a half); when it cannot be built, torch.optim.AdamW(foreach) on
the CPU is measured instead and the result says which optimizer ran and why.
Only local rank 0 runs these, with all the host's cores: the node's ranks share the CPU.
"""
from __future__ import annotations

import contextlib
import os
import statistics
import time
from dataclasses import dataclass

import torch

from calibration.microbench.common import BenchContext, BenchItem


def host_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def deepspeed_cpu_adam_built() -> bool:
    """True if DeepSpeedCPUAdam is prebuilt or already JIT-built (loading it costs no compile)."""
    try:
        from deepspeed.git_version_info import installed_ops
        from deepspeed.ops.op_builder import CPUAdamBuilder
        from torch.utils.cpp_extension import _get_build_directory
    except Exception:
        return False
    if installed_ops.get("cpu_adam"):
        return True
    build_dir = _get_build_directory(CPUAdamBuilder.NAME, verbose=False)
    return os.path.exists(os.path.join(build_dir, f"{CPUAdamBuilder.NAME}.so"))


def choose_optimizer(ctx: BenchContext) -> tuple[str, str]:
    """("deepspeed" | "torch", why)."""
    if ctx.cpu_adam == "torch":
        return "torch", "asked for with --cpu-adam torch"
    if ctx.cpu_adam == "deepspeed":
        return "deepspeed", "asked for with --cpu-adam deepspeed"
    if ctx.is_cuda or deepspeed_cpu_adam_built():
        return "deepspeed", "default"
    return "torch", ("DeepSpeedCPUAdam is not built yet and the CPU path skips its ~1.5 min JIT build "
                     "(use --cpu-adam deepspeed to build and measure it)")


def ramp(n: int, top: float = 1.0) -> torch.Tensor:
    """n fp32 values from -top to top: what the optimizer and cast benchmarks work on. Filled on every
    thread (randn of 256M values took 2-3 s of each item's 6 on one thread, on a lent H100 host); the
    kernels timed here do the same work whatever the values."""
    return torch.linspace(-top, top, n, dtype=torch.float32)


def adam_params(quick: bool, cpu: bool) -> int:
    if cpu:
        return 2**22
    return 2**26 if quick else 2**28  # 64M params = 1 GiB of fp32 state each; 256M = 4 GiB


def _make_optimizer(kind: str, params):
    if kind == "deepspeed":
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(params, lr=1e-4, adamw_mode=True)
    return torch.optim.AdamW(params, lr=1e-4, foreach=True)


def thread_counts(cores: int) -> list[int]:
    """1, 2, 4, ... and all the cores: where a rank's CPU optimizer may run (torchrun's default is 1)."""
    counts, t = [], 1
    while t < cores:
        counts.append(t)
        t *= 2
    return counts + [cores]


@dataclass
class _AdamState:
    """The parameters and optimizer the CPU Adam items share. Allocated and first touched by each item
    anew, 4 GiB of them cost 1.5-3.5 s an item (more at fewer threads): the two families took 20.6 s on a
    lent H100 host, and 9.9 s sharing them (2026-12-06). What is timed, a step over the same memory, is the same."""

    optimizer: object
    kind: str
    why: str
    params: int


_SHARED_ADAM: dict[tuple[int, str], _AdamState] = {}


def _adam_state(ctx: BenchContext, n: int) -> _AdamState:
    """The shared state for `n` parameters, built on all the host's cores at first use."""
    key = (n, ctx.cpu_adam)
    if key not in _SHARED_ADAM:
        kind, why = choose_optimizer(ctx)
        p = torch.nn.Parameter(ramp(n))
        p.grad = ramp(n, 1e-3)
        try:
            opt = _make_optimizer(kind, [p])
            opt.step()
        except Exception as exc:  # compile failure, missing compiler, ...
            if kind != "deepspeed":
                raise
            why = f"DeepSpeedCPUAdam failed ({type(exc).__name__}: {str(exc)[:200]}); fell back"
            kind = "torch"
            opt = _make_optimizer(kind, [p])
            opt.step()
        _SHARED_ADAM[key] = _AdamState(opt, kind, why, n)
    return _SHARED_ADAM[key]


def release_adam_state() -> None:
    """Frees the shared state (the last CPU Adam item does: the DeepSpeed steps need the host memory)."""
    _SHARED_ADAM.clear()


def bench_cpu_adam(ctx: BenchContext, threads: int | None = None, last: bool = False) -> dict:
    """One process's optimizer step on `threads` threads (all the host's cores when None); `last`
    frees the state the items share."""
    if ctx.local_rank != 0:
        return {"ran": False}
    cores = threads or host_cores()
    old_threads = torch.get_num_threads()
    try:
        torch.set_num_threads(host_cores())
        state = _adam_state(ctx, adam_params(ctx.sizes.quick, not ctx.is_cuda))
        torch.set_num_threads(cores)  # DeepSpeedCPUAdam's OpenMP loops and torch share this runtime
        state.optimizer.step()  # this thread count's first step: OpenMP's workers start
        times = []
        for _ in range(3 if not ctx.sizes.quick else 2):
            t0 = time.perf_counter()
            state.optimizer.step()
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(old_threads)
        if last:
            release_adam_state()
    t = statistics.median(times)
    name = "DeepSpeedCPUAdam" if state.kind == "deepspeed" else "torch.optim.AdamW(foreach=True)"
    return {"ran": True, "optimizer": name, "why": state.why, "params": state.params, "threads": cores,
            "step_time_s": t, "params_per_s": state.params / t}


ISSUE_PROBE_LAYERS = 16
ISSUE_PROBE_WIDTH = 64
ISSUE_PROBE_REPEATS = 20


@contextlib.contextmanager
def torch_own_linear():
    """torch.nn.functional.linear as torch ships it, for the duration.

    deepspeed.zero.Init replaces it for good with its ZeRO-3 linear (an autograd Function in Python;
    partition_parameters.py: "This will persist unless manually reset"). A probe taken after a ZeRO-3
    model was built would time that wrapper, not the host: it read 2.3x slower on this CPU and 1.55x
    on lent H200 hosts (2026-12-02, data/runs/README.md)."""
    patched = torch.nn.functional.linear
    torch.nn.functional.linear = torch._C._nn.linear
    try:
        yield
    finally:
        torch.nn.functional.linear = patched


ISSUE_PROBE_ROUNDS = 5


def issue_us_per_layer(device, sync, rounds: int = ISSUE_PROBE_ROUNDS) -> float:
    """Host microseconds to issue one tiny linear layer's forward and backward (median of
    `rounds` rounds).

    The layers are tiny, so the GPU waits on the host throughout: this is Python dispatch, autograd
    and kernel launch, the work that bounds small or short-context steps and ZeRO-3's hooks. The
    layers run torch's own linear whatever a library put in its place (`torch_own_linear`)."""
    return statistics.median(issue_rounds_us_per_layer(device, sync, rounds))


def issue_rounds_us_per_layer(device, sync, rounds: int) -> list[float]:
    """Each round's issue time a layer, in order: how a probe's rounds scatter (lab/probe_drift.py)."""
    with torch_own_linear():
        width = ISSUE_PROBE_WIDTH
        net = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(ISSUE_PROBE_LAYERS)]).to(device)
        x = torch.randn(8, width, device=device)

        def once():
            net(x).sum().backward()

        for _ in range(3):
            once()
        sync()
        times_s = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(ISSUE_PROBE_REPEATS):
                once()
            times_s.append(time.perf_counter() - t0)  # the host's issue time: nothing waits for the GPU here
            sync()
    return [t / (ISSUE_PROBE_REPEATS * ISSUE_PROBE_LAYERS) * 1e6 for t in times_s]


def bench_host_issue(ctx: BenchContext) -> dict:
    """The host probe's issue time, as every real run records it (calibration/harness/host_probe.py)."""
    if ctx.local_rank != 0:
        return {"ran": False}
    return {"ran": True, "threads": torch.get_num_threads(), "us_per_layer": issue_us_per_layer(ctx.device, ctx.sync)}


def host_memory_bytes(quick: bool, cpu: bool) -> int:
    return 64 * 2**20 if cpu else (2**30 if quick else 4 * 2**30)


def bench_host_memory(ctx: BenchContext) -> dict:
    """Multi-threaded host copy; bandwidth counts bytes read plus bytes written."""
    if ctx.local_rank != 0:
        return {"ran": False}
    nbytes = host_memory_bytes(ctx.sizes.quick, not ctx.is_cuda)
    cores = host_cores()
    old_threads = torch.get_num_threads()
    torch.set_num_threads(cores)
    try:
        src = torch.ones(nbytes // 4, dtype=torch.float32)
        dst = torch.empty_like(src)
        dst.copy_(src)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(old_threads)
    t = statistics.median(times)
    return {"ran": True, "bytes": nbytes, "bytes_moved": 2 * nbytes, "threads": cores,
            "time_s": t, "bytes_per_s": 2 * nbytes / t}


def host_issue_item(when: str = "") -> BenchItem:
    """The host probe as a calibration item; `when` names a later reading of the same probe."""
    return BenchItem("cpu/host_issue" + (f"/{when}" if when else ""), "host_issue", bench_host_issue,
                     label="host issue time per layer" + (f" ({when})" if when else ""))


def items(ctx: BenchContext) -> list[BenchItem]:
    counts = thread_counts(host_cores())
    by_threads = [BenchItem(f"cpu/adam/threads-{t}", "cpu_adam_threads",
                            lambda c, t=t: bench_cpu_adam(c, t, last=t == counts[-1]),
                            label=f"CPU Adam step, {t} thread{'s' * (t > 1)}")
                  for t in counts]
    return [
        BenchItem("cpu/host_memory", "host_memory", bench_host_memory, label="host memory copy, all cores"),
        host_issue_item(),
        BenchItem("cpu/adam", "cpu_adam", bench_cpu_adam, label="CPU Adam step, all cores"),
        *by_threads,
    ]
