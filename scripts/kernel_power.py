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
NVML's energy counter (mJ) on GPU 0; each window at least WINDOW_S after a warm-up.
"""
from __future__ import annotations

import json
import sys
import time

import pynvml
import torch
import torch.nn.functional as F

WINDOW_S = 1.5
WARM_S = 0.3


def energy_j(handle) -> float:
    return pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3


def per_call_s(fn) -> float:
    fn()
    torch.cuda.synchronize()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.1:
        fn()
        n += 1
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


def back_to_back(handle, fn) -> dict:
    t = per_call_s(fn)
    calls = max(1, int(WINDOW_S / t))
    for _ in range(max(1, int(WARM_S / t))):
        fn()
    torch.cuda.synchronize()
    e0, t0 = energy_j(handle), time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    e = energy_j(handle) - e0
    return {"call_s": t, "calls": calls, "wall_s": wall, "busy_s": wall, "energy_j": e, "avg_w": e / wall}


def gapped(handle, fn, gap_s: float) -> dict:
    t = per_call_s(fn)
    for _ in range(max(1, int(WARM_S / t))):
        fn()
    torch.cuda.synchronize()
    calls, e0, t0 = 0, energy_j(handle), time.perf_counter()
    while time.perf_counter() - t0 < WINDOW_S:
        fn()
        torch.cuda.synchronize()
        end = time.perf_counter() + gap_s
        while time.perf_counter() < end:
            pass
        calls += 1
    wall = time.perf_counter() - t0
    e = energy_j(handle) - e0
    return {"call_s": t, "gap_s": gap_s, "calls": calls, "wall_s": wall, "busy_s": calls * t,
            "energy_j": e, "avg_w": e / wall}


def gemm(m: int, n: int, k: int):
    a = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(k, n, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    return (lambda: torch.matmul(a, b, out=out)), 2.0 * m * n * k


def main(path: str) -> None:
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    out = open(path, "a")

    def emit(row: dict) -> None:
        out.write(json.dumps(row) + "\n")
        out.flush()
        print(json.dumps(row), flush=True)

    time.sleep(2.0)
    e0, t0 = energy_j(handle), time.perf_counter()
    time.sleep(2.0)
    emit({"kind": "idle", "wall_s": time.perf_counter() - t0, "avg_w": (energy_j(handle) - e0) / (time.perf_counter() - t0)})
    for tokens in (512, 1024, 2048, 4096, 8192, 16384):
        for hidden, ffn in ((896, 4864), (2048, 5632), (2048, 11008), (4096, 11008)):
            for op, (m, n, k) in (("qkv", (tokens, 3 * hidden, hidden)), ("ffn_up", (tokens, ffn, hidden)),
                                  ("ffn_down", (tokens, hidden, ffn))):
                fn, flops = gemm(m, n, k)
                emit({"kind": "gemm", "op": op, "m": m, "n": n, "k": k, "flops": flops, **back_to_back(handle, fn)})
    for seq in (512, 1024, 2048, 4096, 8192, 16384):
        batch = max(1, 16384 // seq)
        q, k, v = (torch.randn(batch, 16, seq, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True)
                   for _ in range(3))
        emit({"kind": "attention_fwd", "seq": seq, "batch": batch, "heads": 16, "head_dim": 128,
              **back_to_back(handle, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))})
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        g = torch.randn_like(o)
        emit({"kind": "attention_bwd", "seq": seq, "batch": batch, "heads": 16, "head_dim": 128,
              **back_to_back(handle, lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True))})
        del q, k, v, o, g
    for nbytes in (2**20, 8 * 2**20, 64 * 2**20, 512 * 2**20):
        src = torch.ones(nbytes // 2, dtype=torch.bfloat16, device="cuda")
        dst = torch.empty_like(src)
        emit({"kind": "copy", "bytes": nbytes, **back_to_back(handle, lambda: dst.copy_(src))})
    for name, (m, n, k) in (("small", (1024, 6144, 2048)), ("medium", (4096, 11008, 2048)),
                            ("large", (8192, 11008, 4096))):
        fn, flops = gemm(m, n, k)
        for gap_s in (0.0, 5e-5, 2e-4, 5e-4, 1e-3, 3e-3):
            emit({"kind": "gapped", "size": name, "m": m, "n": n, "k": k, "flops": flops, **gapped(handle, fn, gap_s)})
    e0, t0 = energy_j(handle), time.perf_counter()
    time.sleep(2.0)
    emit({"kind": "idle_after", "wall_s": time.perf_counter() - t0, "avg_w": (energy_j(handle) - e0) / (time.perf_counter() - t0)})


if __name__ == "__main__":
    main(sys.argv[1])
