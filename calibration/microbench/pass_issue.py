"""The host's time to issue a decoder layer's forward, its backward, and its backward when the layer is
checkpointed (the recompute issued inside the backward), apart.

Why measured: a GPU cannot run ahead into work the host has not issued yet, so whether a step waits on
the host is decided pass by pass (`models.timing`), and that needs each pass's share of the host's
time. The backward launches about two kernels for each of the forward's (the input's and the weight's
gradient of every GEMM), and autograd visits every node; a checkpointed layer's backward first runs its
forward again through DeepSpeed's checkpoint function. The profile keeps the two ratios to the
forward's time (`overheads.backward_issue_ratio`, `overheads.recompute_issue_ratio`); the fit keeps
the forward's time per layer (`overheads.layer_pass`) and the rest.

A stack of harness decoder blocks runs at a few tokens, so that the GPU waits on the host throughout:
a call's wall time is then the host's issue time (the backward call returns once autograd has issued
its last kernel). On the CPU path the kernels run on the host as they are issued; the ratios are still
measured there, and only the GPU's matter.
"""
from __future__ import annotations

import statistics
import time
from functools import partial
from typing import Callable

import torch

from calibration.microbench.common import BenchContext, BenchItem

PRESETS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "tinyllama-1.1b", "llama-2-7b")  # GQA 7:1, 6:1, 8:1 and MHA
LAYERS = 8
TOKENS = 16  # the GPU's work per kernel is a few microseconds: the host bounds every pass
ROUNDS = 7


def _checkpoint_fn():
    """DeepSpeed's activation checkpointing, as the harness's training runs wrap their blocks."""
    import deepspeed

    return deepspeed.checkpointing.checkpoint


PASSES = ("forward", "backward", "checkpointed_forward", "checkpointed_backward")  # a Round's order
Round = tuple[tuple[float, float], tuple[float, float]]  # (forward s, backward s): plain, then checkpointed


def interleaved_pass_rounds(forward: Callable[[bool], torch.Tensor], backward: Callable[[torch.Tensor], None],
                            sync: Callable[[], None], after: Callable[[], None] = lambda: None) -> list[Round]:
    """The host's seconds in the forward call (`forward(checkpointed)` returns the loss) and in the
    backward call, each started on an idle GPU, plain and checkpointed, over ROUNDS rounds after a
    warm-up. `after` runs untimed once the backward's work is done (an optimizer step, say).

    Plain and checkpointed alternate within a round: a host that drifts between rounds (lent hosts
    do, by tens of percent within minutes) moves both alike."""
    def timed(checkpointed: bool) -> tuple[float, float]:
        sync()
        t0 = time.perf_counter()
        loss = forward(checkpointed)
        t1 = time.perf_counter()
        sync()  # the backward starts as the forward's does, on an idle GPU
        t2 = time.perf_counter()
        backward(loss)
        t3 = time.perf_counter()
        sync()
        after()
        sync()
        return t1 - t0, t3 - t2

    for _ in range(3):
        timed(False), timed(True)
    return [(timed(False), timed(True)) for _ in range(ROUNDS)]


def median_s_per_layer(rounds: list[Round]) -> dict[str, float]:
    """The rounds' median seconds per layer of each pass (`PASSES`)."""
    medians = [statistics.median(r[which][part] for r in rounds) / LAYERS for which in (0, 1) for part in (0, 1)]
    return dict(zip(PASSES, medians))


def bench_pass_issue(ctx: BenchContext, preset: str) -> dict:
    """Median host seconds per layer of the forward and the backward, plain and checkpointed, and each
    pass's ratio to the plain forward (the profile's `host.pass_issue`)."""
    from calibration.harness.model import DecoderBlock, rope_tables
    from calibration.microbench.layer import architecture

    if ctx.local_rank != 0:
        return {"ran": False}
    arch = architecture(preset, not ctx.is_cuda)
    dtype = torch.bfloat16 if ctx.is_cuda else torch.float32
    blocks = ctx.build(lambda: torch.nn.ModuleList(DecoderBlock(arch, None) for _ in range(LAYERS)), dtype)
    cos, sin = rope_tables(torch.arange(TOKENS, device=ctx.device), arch.head_dim)
    x = torch.randn(1, TOKENS, arch.hidden_size, device=ctx.device, dtype=dtype, requires_grad=True)
    checkpoint = _checkpoint_fn()

    def forward(checkpointed: bool):
        h = x
        for block in blocks:
            h = checkpoint(partial(block, cos=cos, sin=sin), h) if checkpointed else block(h, cos, sin)
        return h.float().sum()

    threads = torch.get_num_threads()
    torch.set_num_threads(ctx.issue_threads)
    try:
        rounds = interleaved_pass_rounds(forward, lambda loss: loss.backward(), ctx.sync)
    finally:
        torch.set_num_threads(threads)
    return {"ran": True, "threads": ctx.issue_threads, "preset": preset, "layers": LAYERS, "tokens": TOKENS,
            **{f"{name}_s_per_layer": s for name, s in median_s_per_layer(rounds).items()},
            "backward_ratio": statistics.median(r[0][1] / r[0][0] for r in rounds),
            "checkpointed_forward_ratio": statistics.median(r[1][0] / r[0][0] for r in rounds),
            "recompute_ratio": recompute_ratio(rounds)}


def recompute_ratio(rounds: list[Round]) -> float:
    """What checkpointing adds to the backward's issue time, over the plain forward's: the rounds'
    median. A difference of two timings, so on a busy host it can come out at zero or below, which is
    no measurement of the recompute: an error then, and the profile takes none."""
    ratio = statistics.median((r[1][1] - r[0][1]) / r[0][0] for r in rounds)
    if not ratio > 0:
        raise RuntimeError(f"checkpointing added {ratio:+.2f} of a forward's issue time to the backward: the host's "
                           "noise outweighed the recompute; calibrate again on a quieter host")
    return ratio


def items(ctx: BenchContext) -> list[BenchItem]:
    from calibration.microbench.layer import CPU_SHAPES

    presets = PRESETS if ctx.is_cuda else tuple(CPU_SHAPES)  # the CPU path's tiny layers stand in
    return [BenchItem(f"cpu/pass_issue/{preset}", "pass_issue", lambda c, p=preset: bench_pass_issue(c, p),
                      label=f"host issue per pass, {preset} layers") for preset in presets]
