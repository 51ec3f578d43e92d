"""What one GPU draws running training-sized kernels: back to back, and with host gaps between them.

The energy model charges every compute phase the dense power and every wait between kernels the
idle power. Machine X (data/calibration/README.md) showed both are wrong at the extremes: 1024^3
GEMMs drew ~310 W back to back, and 1-2 ms gaps after dense bursts drew the busy power. This
measures where between the extremes a training step's kernels fall:
  - `gemm`: bf16 GEMMs of decoder shapes (tokens x hidden x FFN), back to back;
  - `attention`: causal SDPA forward and backward, back to back;
  - `copy`: device copies (memory-bound kernels) of several sizes;
  - `gapped`: one kernel, then the host waits until it ends and spins for a gap before the next,
    as when the host's issue time outlasts the GPU's work.
One JSON line a window to the file named by argv[1]: time, calls, busy seconds, energy, power.
NVML's energy counter (mJ) on GPU 0; each window at least WINDOW_S after a warm-up. Without a GPU
it runs the same windows at tiny sizes on the CPU, its meter reported absent (energy and power null).
"""
from __future__ import annotations

import json
import sys
import time

import torch
import torch.nn.functional as F

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
WINDOW_S = 1.5 if GPU else 0.05
WARM_S = 0.3 if GPU else 0.01
# (tokens, (hidden, FFN) pairs, attention sequences, copy bytes, gapped GEMM shapes, gaps)
SIZES = ((512, 1024, 2048, 4096, 8192, 16384), ((896, 4864), (2048, 5632), (2048, 11008), (4096, 11008)),
         (512, 1024, 2048, 4096, 8192, 16384), (2**20, 8 * 2**20, 64 * 2**20, 512 * 2**20),
         (("small", (1024, 6144, 2048)), ("medium", (4096, 11008, 2048)), ("large", (8192, 11008, 4096))),
         (0.0, 5e-5, 2e-4, 5e-4, 1e-3, 3e-3)) if GPU else \
        ((16,), ((32, 64),), (16,), (2**12,), (("small", (16, 32, 16)),), (0.0, 1e-4))


def sync() -> None:
    if GPU:
        torch.cuda.synchronize()


def energy_j(handle) -> float | None:
    if handle is None:
        return None
    import pynvml

    return pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3


def window(handle, wall_s: float, e0: float | None) -> dict:
    """Energy and mean power of a window that began at energy counter `e0`; null without a meter."""
    e = energy_j(handle)
    energy = None if e is None or e0 is None else e - e0
    return {"wall_s": wall_s, "energy_j": energy, "avg_w": None if energy is None else energy / wall_s}


def per_call_s(fn) -> float:
    fn()
    sync()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < WINDOW_S / 15:
        fn()
        n += 1
    sync()
    return (time.perf_counter() - t0) / n


def back_to_back(handle, fn) -> dict:
    t = per_call_s(fn)
    calls = max(1, int(WINDOW_S / t))
    for _ in range(max(1, int(WARM_S / t))):
        fn()
    sync()
    e0, t0 = energy_j(handle), time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    wall = time.perf_counter() - t0
    return {"call_s": t, "calls": calls, "busy_s": wall, **window(handle, wall, e0)}


def gapped(handle, fn, gap_s: float) -> dict:
    t = per_call_s(fn)
    for _ in range(max(1, int(WARM_S / t))):
        fn()
    sync()
    calls, e0, t0 = 0, energy_j(handle), time.perf_counter()
    while time.perf_counter() - t0 < WINDOW_S:
        fn()
        sync()
        end = time.perf_counter() + gap_s
        while time.perf_counter() < end:
            pass
        calls += 1
    wall = time.perf_counter() - t0
    return {"call_s": t, "gap_s": gap_s, "calls": calls, "busy_s": calls * t, **window(handle, wall, e0)}


def gemm(m: int, n: int, k: int):
    a = torch.randn(m, k, dtype=torch.bfloat16, device=DEVICE)
    b = torch.randn(k, n, dtype=torch.bfloat16, device=DEVICE)
    out = torch.empty(m, n, dtype=torch.bfloat16, device=DEVICE)
    return (lambda: torch.matmul(a, b, out=out)), 2.0 * m * n * k


def idle(handle, name: str) -> dict:
    e0, t0 = energy_j(handle), time.perf_counter()
    time.sleep(2.0 if GPU else 0.01)
    return {"kind": name, **window(handle, time.perf_counter() - t0, e0)}


def main(path: str) -> None:
    handle = None
    if GPU:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    tokens_list, widths, seqs, copies, gapped_shapes, gaps = SIZES
    out = open(path, "a")

    def emit(row: dict) -> None:
        row["meter"] = "nvml" if handle is not None else "absent"
        out.write(json.dumps(row) + "\n")
        out.flush()
        print(json.dumps(row), flush=True)

    time.sleep(2.0 if GPU else 0.0)
    emit(idle(handle, "idle"))
    for tokens in tokens_list:
        for hidden, ffn in widths:
            for op, (m, n, k) in (("qkv", (tokens, 3 * hidden, hidden)), ("ffn_up", (tokens, ffn, hidden)),
                                  ("ffn_down", (tokens, hidden, ffn))):
                fn, flops = gemm(m, n, k)
                emit({"kind": "gemm", "op": op, "m": m, "n": n, "k": k, "flops": flops, **back_to_back(handle, fn)})
    heads, head_dim = (16, 128) if GPU else (2, 16)
    for seq in seqs:
        batch = max(1, seqs[-1] // seq)
        q, k, v = (torch.randn(batch, heads, seq, head_dim, dtype=torch.bfloat16, device=DEVICE, requires_grad=True)
                   for _ in range(3))
        shape = {"seq": seq, "batch": batch, "heads": heads, "head_dim": head_dim}
        emit({"kind": "attention_fwd", **shape,
              **back_to_back(handle, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))})
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        g = torch.randn_like(o)
        emit({"kind": "attention_bwd", **shape,
              **back_to_back(handle, lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True))})
        del q, k, v, o, g
    for nbytes in copies:
        src = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=DEVICE)
        dst = torch.empty_like(src)
        emit({"kind": "copy", "bytes": nbytes, **back_to_back(handle, lambda: dst.copy_(src))})
    for name, (m, n, k) in gapped_shapes:
        fn, flops = gemm(m, n, k)
        for gap_s in gaps:
            emit({"kind": "gapped", "size": name, "m": m, "n": n, "k": k, "flops": flops, **gapped(handle, fn, gap_s)})
    emit(idle(handle, "idle_after"))


if __name__ == "__main__":
    main(sys.argv[1])
