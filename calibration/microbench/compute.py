"""Compute rates: bf16 GEMMs at transformer shapes, causal SDPA, and memory-bound copies.

A GEMM of 8k tokens by 2k hidden does not run at the 8k-cube rate, so the GEMM curve is
built from the shapes transformer layers produce (QKV, output projection, FFN up and
down, weight gradients with the token dimension as K, logits), small to large.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from calibration.fitting import gemm_flops
from models.flops import causal_attention_flops
from calibration.microbench.common import BenchContext, BenchItem, time_per_call

MAX_OPERAND_BYTES = 4 * 2**30  # skip shapes whose largest operand exceeds this


@dataclass(frozen=True)
class GemmShape:
    """out[m, n] = a[m, k] @ b[k, n]; `a_transposed` stores a as [k, m] (weight gradients)."""

    op: str
    m: int
    n: int
    k: int
    a_transposed: bool = False

    @property
    def key(self) -> str:
        return f"gemm/{self.op}/m{self.m}_n{self.n}_k{self.k}" + ("_tn" if self.a_transposed else "")


def _ffn(hidden: int) -> int:
    return int(round(3.5 * hidden / 256) * 256)


def gemm_shapes(quick: bool, cpu: bool) -> list[GemmShape]:
    if cpu:
        tokens, hiddens, vocabs = (64, 256), (128, 256), (1024,)
    elif quick:
        tokens, hiddens, vocabs = (1024, 8192), (2048, 8192), (32000,)
    else:
        tokens, hiddens, vocabs = (512, 2048, 8192, 32768), (1024, 2048, 4096, 8192), (32000, 151936)
    shapes = []
    for t in tokens:
        for h in hiddens:
            f = _ffn(h)
            shapes += [
                GemmShape("qkv", t, 3 * h, h),
                GemmShape("ffn_up", t, f, h),
                GemmShape("ffn_down", t, h, f),
            ]
            if not quick:
                shapes += [GemmShape("attn_out", t, h, h), GemmShape("ffn_up_wgrad", h, f, t, a_transposed=True)]
            shapes += [GemmShape("logits", t, v, h) for v in vocabs]
    return [s for s in shapes if 2 * max(s.m * s.k, s.k * s.n, s.m * s.n) <= MAX_OPERAND_BYTES]


def bench_gemm(ctx: BenchContext, s: GemmShape) -> dict:
    dt = torch.bfloat16
    a = torch.randn(s.k, s.m, dtype=dt, device=ctx.device).t() if s.a_transposed else torch.randn(
        s.m, s.k, dtype=dt, device=ctx.device)
    b = torch.randn(s.k, s.n, dtype=dt, device=ctx.device)
    out = torch.empty(s.m, s.n, dtype=dt, device=ctx.device)
    t = time_per_call(ctx, lambda: torch.matmul(a, b, out=out))
    flops = gemm_flops(s.m, s.n, s.k)
    return {"op": s.op, "m": s.m, "n": s.n, "k": s.k, "a_transposed": s.a_transposed,
            "flops": flops, "time_s": t, "flop_per_s": flops / t}


@dataclass(frozen=True)
class AttentionCase:
    seq_len: int
    heads: int
    head_dim: int
    batch: int

    @property
    def key(self) -> str:
        return f"attention/s{self.seq_len}_h{self.heads}_d{self.head_dim}_b{self.batch}"


# Head dims besides 128 that models use: 64 (TinyLlama, Qwen2.5-0.5B, CLIP ViT-L), 72 (the shipped
# Qwen2.5-VL towers), 80 (Phi-2), 96 (Phi-3), 256 (Gemma). Flash kernels tile the head dim, so the rate
# per FLOP at 80 need not lie between 64's and 128's, nor 256's be 128's (a curve clamps at its ends).
OTHER_HEAD_DIMS = (64, 72, 80, 96, 256)


def attention_cases(quick: bool, cpu: bool) -> list[AttentionCase]:
    if cpu:
        return [AttentionCase(s, 4, 32, 1) for s in (64, 128, 256)]
    seqs = (1024, 4096, 16384) if quick else (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
    tokens = 16384  # batch * seq per call, so short sequences still fill the GPU
    cases = [AttentionCase(s, 32, 128, max(1, tokens // s)) for s in seqs]
    if not quick:  # the other head dims models use, each over 128's rate at the same sequences
        cases += [AttentionCase(s, 4096 // d, d, max(1, tokens // s))
                  for d in OTHER_HEAD_DIMS for s in (2048, 8192, 32768)]
    return cases


def bench_attention(ctx: BenchContext, c: AttentionCase) -> dict:
    """Causal SDPA forward, and backward alone (autograd.grad on a retained graph)."""
    shape = (c.batch, c.heads, c.seq_len, c.head_dim)
    q, k, v = (torch.randn(shape, dtype=torch.bfloat16, device=ctx.device, requires_grad=True) for _ in range(3))
    t_fwd = time_per_call(ctx, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    grad = torch.randn_like(out)
    t_bwd = time_per_call(ctx, lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True))
    f_fwd = float(causal_attention_flops(c.batch, c.heads, c.seq_len, c.head_dim, backward=False))
    f_bwd = float(causal_attention_flops(c.batch, c.heads, c.seq_len, c.head_dim, backward=True))
    return {"seq_len": c.seq_len, "heads": c.heads, "head_dim": c.head_dim, "batch": c.batch,
            "fwd_time_s": t_fwd, "bwd_time_s": t_bwd, "fwd_flops": f_fwd, "bwd_flops": f_bwd,
            "fwd_flop_per_s": f_fwd / t_fwd, "bwd_flop_per_s": f_bwd / t_bwd}


def memory_sizes(quick: bool, cpu: bool) -> list[int]:
    if cpu:
        return [16 * 2**20, 64 * 2**20]
    return [2**30] if quick else [256 * 2**20, 2**30, 4 * 2**30]


def bench_memory_copy(ctx: BenchContext, nbytes: int) -> dict:
    """Device-to-device copy; bandwidth counts bytes read plus bytes written."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=ctx.device).normal_()
    dst = torch.empty_like(src)
    t = time_per_call(ctx, lambda: dst.copy_(src))
    return {"bytes": nbytes, "bytes_moved": 2 * nbytes, "time_s": t, "bytes_per_s": 2 * nbytes / t}


def items(ctx: BenchContext) -> list[BenchItem]:
    q, cpu = ctx.sizes.quick, not ctx.is_cuda
    out = [BenchItem(s.key, "gemm", lambda c, s=s: bench_gemm(c, s), label=f"GEMM {s.op} {s.m}x{s.n}x{s.k}")
           for s in gemm_shapes(q, cpu)]
    out += [BenchItem(a.key, "attention", lambda c, a=a: bench_attention(c, a),
                      label=f"SDPA causal seq {a.seq_len} d{a.head_dim}") for a in attention_cases(q, cpu)]
    out += [BenchItem(f"hbm/copy/{n}B", "hbm", lambda c, n=n: bench_memory_copy(c, n),
                      label=f"memory-bound copy {n >> 20} MiB") for n in memory_sizes(q, cpu)]
    return out
