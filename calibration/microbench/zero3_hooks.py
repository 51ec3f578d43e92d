"""ZeRO-3's fetch and release hooks on the host, pass by pass: what they cost in the backward, in a
checkpointed layer's first forward and in its recompute, each over what they cost in a plain forward.

Why measured: ZeRO-3 runs a Python hook before and after every module's forward and backward, on the
thread that issues the kernels, and host-bound ZeRO-3 steps wait on it (`models.timing`). A
checkpointed layer's first forward runs without autograd, so its hooks register no backward hooks on
its outputs; its recompute runs them again inside the backward. Real steps showed it: charged one
forward's hooks for every pass, host-bound ZeRO-3 steps with checkpointing were over-predicted where
those without were under-predicted. The profile keeps the three ratios (`host.zero3_hook_pass`); the
fit keeps a forward's hooks per module (`overheads.zero3_module_pass`).

A stack of harness decoder blocks runs inside a DeepSpeed engine at a few tokens, so the GPU waits on
the host throughout, once under ZeRO-0 and once under ZeRO-3: a pass's hooks are the difference. The
engine needs a process group of its own (one rank), so the presets run in the calibration's DeepSpeed
worker (calibration.ds_worker), which pays DeepSpeed's start-up once for them and the calibration's
steps. On the CPU path (gloo) tiny layers stand in; the ratios are measured
there too, and only the GPU's matter.
"""
from __future__ import annotations

from functools import partial

import torch

from calibration.microbench.common import BenchContext, BenchItem, Skip
from calibration.microbench.pass_issue import (LAYERS, PASSES, TOKENS, interleaved_pass_rounds,
                                              median_s_per_layer)

# One of pass_issue's layers. Four took 122 s of a calibration meant to last 5 minutes; two (with
# qwen2.5-1.5b) lay within 3% of the four's median (lent H100, 2026-12-06). TinyLlama's alone, in place of
# the two's mean, moved three stored H100 calibrations' time error on 29 runs by -0.3 to +0.5 points (the same
# preset's ratios differ up to 2.6x between leases); the other preset's alone moved it by up to +2.9.
ZERO3_PRESETS = ("tinyllama-1.1b",)
WORKER_TIMEOUT_S = 900  # a first DeepSpeed import and two engines; minutes on a cold host


class Stack(torch.nn.Module):
    """Harness decoder blocks, every one checkpointed (DeepSpeed's checkpoint) when `checkpointed`."""

    def __init__(self, arch):
        from calibration.harness.model import DecoderBlock

        super().__init__()
        self.layers = torch.nn.ModuleList(DecoderBlock(arch, None) for _ in range(LAYERS))
        self.checkpointed = False

    def forward(self, x, cos, sin):
        import deepspeed

        for layer in self.layers:
            x = (deepspeed.checkpointing.checkpoint(partial(layer, cos=cos, sin=sin), x) if self.checkpointed
                 else layer(x, cos, sin))
        return x.float().sum()


def _engine(stage: int, arch, device: torch.device):
    import deepspeed

    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
           "bf16": {"enabled": device.type == "cuda"}, "zero_optimization": {"stage": stage},
           "optimizer": {"type": "Adam", "params": {"lr": 1e-5, "torch_adam": True}}}
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        if stage == 3:
            with deepspeed.zero.Init(config_dict_or_path=cfg):
                model = Stack(arch)
        else:
            with device:  # initialised where it runs (on the host, one thread, it took seconds a preset)
                model = Stack(arch)
    finally:
        torch.set_default_dtype(default)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return engine, dtype


def passes_s_per_layer(stage: int, arch, device: torch.device, sync) -> dict[str, float]:
    """The host's median seconds per layer in each pass (`PASSES`) under this ZeRO stage."""
    from calibration.harness.model import rope_tables

    engine, dtype = _engine(stage, arch, device)
    cos, sin = rope_tables(torch.arange(TOKENS, device=device), arch.head_dim)
    x = torch.randn(1, TOKENS, arch.hidden_size, device=device, dtype=dtype, requires_grad=True)

    def forward(checkpointed: bool) -> torch.Tensor:
        engine.module.checkpointed = checkpointed
        return engine(x, cos, sin)

    rounds = interleaved_pass_rounds(forward, engine.backward, sync, after=engine.step)
    engine.destroy()
    return median_s_per_layer(rounds)


def hook_ratios(zero0: dict[str, float], zero3: dict[str, float]) -> dict[str, float]:
    """Each pass's hooks (ZeRO-3's time less ZeRO-0's) over the plain forward's; the recompute's are
    what checkpointing adds to the backward's."""
    hooks = {p: zero3[p] - zero0[p] for p in PASSES}
    hooks["recompute"] = hooks["checkpointed_backward"] - hooks["backward"]
    unresolved = [p for p in ("forward", "backward", "checkpointed_forward", "recompute") if not hooks[p] > 0]
    if unresolved:
        # A time difference of two medians: on a busy host (a loaded CPU path) the noise can outweigh
        # the hooks, and a ratio of zero or below is no measurement of them (the profile takes none).
        seen = ", ".join(f"{p} {hooks[p] * 1e3:+.3f} ms" for p in unresolved)
        raise RuntimeError(f"ZeRO-3's hooks did not come out above the host's noise ({seen} a layer over "
                           f"ZeRO-0): no hooks to measure; calibrate again on a quieter host")
    forward = hooks["forward"]
    return {"backward_ratio": hooks["backward"] / forward,
            "checkpointed_forward_ratio": hooks["checkpointed_forward"] / forward,
            "recompute_ratio": hooks["recompute"] / forward}


def measure(preset: str) -> dict:
    """Both stages in this process, one rank with its own process group (the child's work)."""
    import deepspeed

    from calibration.microbench.layer import architecture

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    arch = architecture(preset, not cuda)
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    zero0, zero3 = (passes_s_per_layer(stage, arch, device, sync) for stage in (0, 3))
    return {"ran": True, "preset": preset, "layers": LAYERS, "tokens": TOKENS, "threads": torch.get_num_threads(),
            **{f"zero0_{p}_s_per_layer": v for p, v in zero0.items()},
            **{f"zero3_{p}_s_per_layer": v for p, v in zero3.items()}, **hook_ratios(zero0, zero3)}


def bench_zero3_hooks(ctx: BenchContext, preset: str) -> dict:
    """Runs `measure` in the DeepSpeed worker on this rank's GPU (local rank 0 only)."""
    if ctx.local_rank != 0:
        return {"ran": False}
    if ctx.worker is None:
        raise Skip("no DeepSpeed worker in this calibration")
    return ctx.worker.request({"op": "zero3_hooks", "preset": preset}, WORKER_TIMEOUT_S)


def items(ctx: BenchContext) -> list[BenchItem]:
    from calibration.microbench.layer import CPU_SHAPES

    presets = ZERO3_PRESETS if ctx.is_cuda else tuple(CPU_SHAPES)[:1]  # the CPU path: one tiny preset stands in
    return [BenchItem(f"cpu/zero3_hooks/{preset}", "zero3_hooks", lambda c, p=preset: bench_zero3_hooks(c, p),
                      label=f"ZeRO-3 hooks per pass, {preset} layers") for preset in presets]
