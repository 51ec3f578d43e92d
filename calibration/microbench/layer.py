"""One decoder layer's memory-bound work as training runs it: the time of every kernel of a harness
decoder block's forward and backward that is neither a GEMM nor the attention core (norms, RoPE, the
activation, residuals, casts and layout copies). The same for one block of the vision tower (ViT:
LayerNorms, GELU, residuals, the QKV split's layout copies), family vision_elementwise.

Why measured and not counted: these are many small unfused kernels, several of them strided or in
fp32 (RMSNorm and RoPE upcast, as Hugging Face's do), so their time is not the counted bytes over the
copy bandwidth. On H200 (2026-12-01, benchmarks/layer_kernels.py) they took 5-7x the counted bytes'
time, a third of a 7B layer at 16k tokens, and a single fitted efficiency had been absorbing it by
slowing the GEMMs to 0.68 of their measured rate. The profile keeps the fit of these times as
effective bytes per token and layer for each element of the hidden size, the KV width and the FFN
width (`calibration.profile_writer`), which `models.flops` uses at the profile's HBM bandwidth. A ViT
block has no KV width of its own (fused QKV over all heads): its fit has two widths, hidden and FFN.

Kernels are timed by torch.profiler on the device (CUDA activity); on the CPU path its CPU operators'
own times stand in, classified by name the same way.
"""
from __future__ import annotations

import dataclasses

import torch

from calibration.microbench.common import BenchContext, BenchItem

# 896-4096 hidden, GQA and MHA; Qwen3's heads are wider than its hidden size and have q/k norms. A
# layer with q/k norms is timed also without them and also with Gemma 3's sandwich norms added (its
# variants, by name suffix), so that the heads' and each kind of norm's widths separate.
PRESETS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "tinyllama-1.1b", "llama-2-7b", "qwen3-0.6b", "qwen3-4b")
WITHOUT_QK_NORM = "/no-qk-norm"
WITH_SANDWICH_NORMS = "/sandwich-norms"
VARIANTS = {WITHOUT_QK_NORM: {"qk_norm": False}, WITH_SANDWICH_NORMS: {"sandwich_norms": True}}
ITERATIONS = 3


def kernel_class(name: str) -> str:
    """"gemm", "attention" or "other" for a device kernel's (or a CPU operator's) name. Attention
    first: the memory-efficient SDPA kernels are named fmha_cutlass*."""
    n = name.lower()
    if any(s in n for s in ("sdpa", "flash", "fmha", "attention")):
        return "attention"
    if any(s in n for s in ("nvjet", "gemm", "cutlass", "xmma", "aten::mm", "aten::addmm", "aten::bmm")):
        return "gemm"
    return "other"


# The CPU path's tiny layers (hidden, heads, KV heads, FFN, head dim where it is not hidden / heads):
# with the Qwen3 one's variants six, so that six widths can be fitted.
CPU_SHAPES = {"qwen2.5-0.5b": (64, 4, 1, 320, None), "qwen2.5-1.5b": (96, 4, 2, 256, None),
              "llama-2-7b": (128, 4, 4, 352, None), "qwen3-0.6b": (64, 4, 2, 192, 32)}


# ViT blocks (hidden, heads, FFN): the presets' towers (qwen2.5-vl-mini's ViT-B, llava-1.5's ViT-L,
# qwen2.5-vl's) and two with half the FFN, so that the two widths separate (the towers' FFN is 3.7-4x
# their hidden size in every preset). Each image is a group of 1024 patches (448 pixels, patch 14).
VISION_SHAPES = {"vit-768": (768, 12, 3072), "vit-1024": (1024, 16, 4096), "vit-1152": (1152, 16, 4304),
                 "vit-768-half-ffn": (768, 12, 1536), "vit-1152-half-ffn": (1152, 16, 2152)}
CPU_VISION_SHAPES = {"vit-64": (64, 4, 256), "vit-96": (96, 4, 192), "vit-128": (128, 4, 512)}
PATCHES_PER_GROUP = 1024


def cases(quick: bool, cpu: bool) -> list[tuple[str, int]]:
    """(layer, tokens): each preset's layer, and a layer with q/k norms also in its `VARIANTS` (named by
    their suffix); on the CPU path a tiny layer in each preset's place."""
    from models.architecture import load_architecture

    presets = tuple(CPU_SHAPES) if cpu else PRESETS
    layers = [name for p in presets
              for name in ((p, *(p + suffix for suffix in VARIANTS)) if load_architecture(p).qk_norm else (p,))]
    tokens = (64,) if cpu else (8192,) if quick else (4096, 16384)
    return [(layer, t) for layer in layers for t in tokens]


def architecture(layer: str, cpu: bool):
    """The Architecture of a layer named by `cases`."""
    from models.architecture import load_architecture

    preset, variant = next(((layer.removesuffix(s), changes) for s, changes in VARIANTS.items() if layer.endswith(s)),
                           (layer, {}))
    arch = load_architecture(preset)
    if cpu:
        hidden, heads, kv_heads, ffn, head_dim = CPU_SHAPES[preset]
        arch = dataclasses.replace(arch, hidden_size=hidden, num_heads=heads, num_kv_heads=kv_heads,
                                   intermediate_size=ffn, config_head_dim=head_dim)
    return dataclasses.replace(arch, **variant)


def bench_layer(ctx: BenchContext, layer: str, tokens: int) -> dict:
    """Seconds of one block's forward and backward in each kernel class, averaged over iterations."""
    from calibration.harness.model import DecoderBlock, rope_tables

    arch = architecture(layer, not ctx.is_cuda)
    dtype = torch.bfloat16 if ctx.is_cuda else torch.float32
    block = ctx.build(lambda: DecoderBlock(arch, None), dtype)
    cos, sin = rope_tables(torch.arange(tokens, device=ctx.device), arch.head_dim)
    x = torch.randn(1, tokens, arch.hidden_size, device=ctx.device, dtype=dtype, requires_grad=True)
    grad = torch.ones(1, tokens, arch.hidden_size, device=ctx.device, dtype=dtype)

    seconds = _kernel_seconds(ctx, lambda: block(x, cos, sin).backward(grad))
    return {"preset": layer, "hidden": arch.hidden_size, "attention_dim": arch.attention_dim, "kv_dim": arch.kv_dim,
            "ffn": arch.intermediate_size, "qk_norm_dim": arch.qk_norm_dim, "sandwich_norm_dim": arch.sandwich_norm_dim,
            "tokens": tokens, "gemm_s": seconds["gemm"], "attention_s": seconds["attention"], "other_s": seconds["other"]}


def vision_cases(quick: bool, cpu: bool) -> list[tuple[str, int]]:
    """(ViT shape, images); on the CPU path tiny blocks of 16-patch images."""
    if cpu:
        return [(name, 2) for name in CPU_VISION_SHAPES]
    groups = (8,) if quick else (4, 16)
    return [(name, g) for name in VISION_SHAPES for g in groups]


def _kernel_seconds(ctx: BenchContext, step) -> dict[str, float]:
    """Seconds of one call of `step` in each kernel class, averaged over ITERATIONS after a warm-up."""
    for _ in range(3):
        step()
    ctx.sync()
    activity = torch.profiler.ProfilerActivity.CUDA if ctx.is_cuda else torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[activity]) as prof:
        for _ in range(ITERATIONS):
            step()
        ctx.sync()
    seconds = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
    for event in prof.key_averages():
        if ctx.is_cuda:  # device kernels only: the aten operators that launched them would count twice
            if event.key.startswith(("aten::", "Memset")):
                continue
            own_us = event.self_device_time_total
        else:
            own_us = event.self_cpu_time_total
        seconds[kernel_class(event.key)] += own_us / 1e6 / ITERATIONS
    return seconds


def bench_vision_block(ctx: BenchContext, shape: str, groups: int) -> dict:
    """Seconds of one ViT block's forward and backward in each kernel class, and of its forward alone
    (a frozen tower runs forward only, without autograd)."""
    from calibration.harness.model import VisionBlock
    from models.architecture import VisionEncoder

    hidden, heads, ffn = (CPU_VISION_SHAPES if not ctx.is_cuda else VISION_SHAPES)[shape]
    patches = PATCHES_PER_GROUP if ctx.is_cuda else 16
    encoder = VisionEncoder(hidden_size=hidden, num_layers=1, num_heads=heads, intermediate_size=ffn, patch_size=14,
                            image_size=448, projector_hidden_size=hidden)
    dtype = torch.bfloat16 if ctx.is_cuda else torch.float32
    block = ctx.build(lambda: VisionBlock(encoder), dtype)
    x = torch.randn(groups, patches, hidden, device=ctx.device, dtype=dtype, requires_grad=True)
    grad = torch.ones(groups, patches, hidden, device=ctx.device, dtype=dtype)

    def forward_only():
        with torch.no_grad():
            block(x)

    both = _kernel_seconds(ctx, lambda: block(x).backward(grad))
    forward = _kernel_seconds(ctx, forward_only)
    return {"shape": shape, "hidden": hidden, "ffn": ffn, "tokens": groups * patches, "gemm_s": both["gemm"],
            "attention_s": both["attention"], "other_s": both["other"], "other_forward_s": forward["other"]}


def items(ctx: BenchContext) -> list[BenchItem]:
    cpu = not ctx.is_cuda
    decoder = [BenchItem(f"layer/{layer}/t{tokens}", "layer_elementwise",
                         lambda c, n=layer, t=tokens: bench_layer(c, n, t),
                         label=f"decoder layer {layer} at {tokens} tokens")
               for layer, tokens in cases(ctx.sizes.quick, cpu)]
    vision = [BenchItem(f"vision/{shape}/g{groups}", "vision_elementwise",
                        lambda c, s=shape, g=groups: bench_vision_block(c, s, g),
                        label=f"vision block {shape}, {groups} images")
              for shape, groups in vision_cases(ctx.sizes.quick, cpu)]
    return decoder + vision
