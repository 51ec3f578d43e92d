"""What one GPU draws running training-sized kernels: back to back, and with host gaps between them.

The energy model charges every compute phase the dense power and every wait between kernels the
idle power. Machine X (data/calibration/README.md) showed both are wrong at the extremes: 1024^3
GEMMs drew ~310 W back to back, and 1-2 ms gaps after dense bursts drew the busy power. This
measures where between the extremes a training step's kernels fall:
  - `gemm`: bf16 GEMMs of decoder shapes (tokens x hidden x FFN), back to back;
  - `attention`: causal SDPA forward and backward, back to back;
  - `copy`: device copies (memory-bound kernels) of several sizes;
  - `gapped`: one kernel, then the host waits until it ends and spins for a gap before the next,
    as when the host's issue time outlasts the GPU's work;
  - `mixed`: a decoder MLP's stream, up GEMM, elementwise passes (SiLU, multiply, add) and down
    GEMM, at several counts of elementwise passes, with each part's time and power alone beside it:
    whether memory-bound kernels between GEMMs draw what they draw alone or the stream's power;
  - `adam`: a fused AdamW step over fp32 parameters, back to back and right after a GEMM burst of
    several lengths, as the optimizer step follows the backward.
One JSON line a window to the file named by argv[1]: time, calls, busy seconds, energy, power.
The calibration's GPU meter (`calibration.meters`: NVML's energy counter) for CUDA device 0; each
window at least WINDOW_S after a warm-up. Without a GPU it runs the same windows at tiny sizes on
the CPU, its meter reported absent (energy and power null).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from calibration.meters import NullGpuMeter, open_gpu_meter  # noqa: E402
from calibration.sensors import GpuMeter  # noqa: E402

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
WINDOW_S = 1.5 if GPU else 0.05
WARM_S = 0.3 if GPU else 0.01


@dataclass(frozen=True)
class Sizes:
    """What the windows run: decoder GEMMs of each token count at each (hidden, FFN) width, causal
    attention at each sequence, copies of each size, and each named GEMM (m, n, k) after each gap."""

    tokens: tuple[int, ...]
    widths: tuple[tuple[int, int], ...]
    attention_seqs: tuple[int, ...]
    copy_bytes: tuple[int, ...]
    gapped_gemms: tuple[tuple[str, tuple[int, int, int]], ...]
    gaps_s: tuple[float, ...]
    mixed_tokens: tuple[int, ...]
    elementwise_passes: tuple[int, ...]
    adam_elements: int  # parameters the AdamW step updates (default), in tensors of ADAM_TENSOR_ELEMENTS
    bursts_s: tuple[float, ...]


SIZES = Sizes(tokens=(512, 1024, 2048, 4096, 8192, 16384),
              widths=((896, 4864), (2048, 5632), (2048, 11008), (4096, 11008)),
              attention_seqs=(512, 1024, 2048, 4096, 8192, 16384),
              copy_bytes=(2**20, 8 * 2**20, 64 * 2**20, 512 * 2**20),
              gapped_gemms=(("small", (1024, 6144, 2048)), ("medium", (4096, 11008, 2048)),
                            ("large", (8192, 11008, 4096))),
              gaps_s=(0.0, 5e-5, 2e-4, 5e-4, 1e-3, 3e-3),
              mixed_tokens=(4096, 16384), elementwise_passes=(0, 1, 2, 4, 8),
              adam_elements=2**30, bursts_s=(0.01, 0.05, 0.2)) if GPU else \
    Sizes(tokens=(16,), widths=((32, 64),), attention_seqs=(16,), copy_bytes=(2**12,),
          gapped_gemms=(("small", (16, 32, 16)),), gaps_s=(0.0, 1e-4),
          mixed_tokens=(16,), elementwise_passes=(0, 2), adam_elements=2**12, bursts_s=(0.001,))
ADAM_TENSOR_ELEMENTS = 2**24 if GPU else 2**10
KINDS = ("gemm", "attention", "copy", "gapped", "mixed", "adam")


def sync() -> None:
    if GPU:
        torch.cuda.synchronize()


@dataclass(frozen=True)
class Meter:
    """The calibration's GPU energy meter (`calibration.meters`), read for CUDA device 0."""

    sensor: GpuMeter
    index: int

    @classmethod
    def open(cls) -> "Meter":
        sensor = open_gpu_meter() if GPU else NullGpuMeter("no GPU")
        return cls(sensor, sensor.meter_indices([0])[0] if sensor.present else 0)

    def read_j(self) -> float | None:
        readings = self.sensor.read_j([self.index])
        return None if readings is None else readings[self.index]

    def window(self, wall_s: float, e0: float | None) -> dict:
        """Energy and mean power of a window that began at reading `e0`; null without a meter."""
        e = self.read_j()
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


def back_to_back(meter: Meter, fn, window_s: float = WINDOW_S) -> dict:
    t = per_call_s(fn)
    calls = max(1, int(window_s / t))
    for _ in range(max(1, int(WARM_S / t))):
        fn()
    sync()
    e0, t0 = meter.read_j(), time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    wall = time.perf_counter() - t0
    return {"call_s": t, "calls": calls, "busy_s": wall, **meter.window(wall, e0)}


def gapped(meter: Meter, fn, gap_s: float) -> dict:
    t = per_call_s(fn)
    for _ in range(max(1, int(WARM_S / t))):
        fn()
    sync()
    calls, e0, t0 = 0, meter.read_j(), time.perf_counter()
    while time.perf_counter() - t0 < WINDOW_S:
        fn()
        sync()
        end = time.perf_counter() + gap_s
        while time.perf_counter() < end:
            pass
        calls += 1
    wall = time.perf_counter() - t0
    return {"call_s": t, "gap_s": gap_s, "calls": calls, "busy_s": calls * t, **meter.window(wall, e0)}


def gemm(m: int, n: int, k: int):
    a = torch.randn(m, k, dtype=torch.bfloat16, device=DEVICE)
    b = torch.randn(k, n, dtype=torch.bfloat16, device=DEVICE)
    out = torch.empty(m, n, dtype=torch.bfloat16, device=DEVICE)
    return (lambda: torch.matmul(a, b, out=out)), 2.0 * m * n * k


def mlp_stream(tokens: int, hidden: int, ffn: int, passes: int):
    """A decoder MLP's kernels: the up GEMM, `passes` elementwise passes over its output (SiLU,
    multiply, add: each reads and writes the tokens x FFN activation), the down GEMM; and each part
    alone, to time and meter apart."""
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device=DEVICE)
    up = torch.randn(hidden, ffn, dtype=torch.bfloat16, device=DEVICE)
    down = torch.randn(ffn, hidden, dtype=torch.bfloat16, device=DEVICE)
    a, b = (torch.empty(tokens, ffn, dtype=torch.bfloat16, device=DEVICE) for _ in range(2))
    y = torch.empty(tokens, hidden, dtype=torch.bfloat16, device=DEVICE)

    def gemms():
        torch.matmul(x, up, out=a)
        torch.matmul(a, down, out=y)

    def elementwise():
        for _ in range(passes):
            torch.nn.functional.silu(a, inplace=True)
            torch.mul(a, a, out=b)
            a.add_(b)

    def stream():
        torch.matmul(x, up, out=a)
        elementwise()
        torch.matmul(a, down, out=y)

    return gemms, elementwise, stream


def mixed(meter: Meter, tokens: int, hidden: int, ffn: int, passes: int) -> dict:
    """The stream back to back, and its GEMMs and its elementwise passes each back to back alone."""
    gemms, elementwise, stream = mlp_stream(tokens, hidden, ffn, passes)
    row = {"tokens": tokens, "hidden": hidden, "ffn": ffn, "passes": passes,
           "gemms_alone": back_to_back(meter, gemms), **back_to_back(meter, stream)}
    if passes:
        row["elementwise_alone"] = back_to_back(meter, elementwise)
    return row


def adam(elements: int):
    """A fused AdamW step over `elements` fp32 parameters with gradients, as a mixed-precision
    optimizer keeps its master copy."""
    params = [torch.zeros(ADAM_TENSOR_ELEMENTS, dtype=torch.float32, device=DEVICE, requires_grad=True)
              for _ in range(max(1, elements // ADAM_TENSOR_ELEMENTS))]
    for p in params:
        p.grad = torch.full_like(p, 1e-3)
    opt = torch.optim.AdamW(params, lr=1e-4, fused=GPU)
    return opt.step


def after_burst(meter: Meter, burst, burst_call_s: float, burst_s: float, step, window_s: float) -> dict:
    """GEMMs for `burst_s`, then one optimizer step, repeated: the window's energy, and the burst's
    share to subtract at the GEMMs' back-to-back power."""
    calls_per_burst = max(1, int(burst_s / burst_call_s))
    step_s = per_call_s(step)
    for _ in range(calls_per_burst):
        burst()
    step()
    sync()
    rounds, e0, t0 = 0, meter.read_j(), time.perf_counter()
    while time.perf_counter() - t0 < window_s:
        for _ in range(calls_per_burst):
            burst()
        step()
        sync()
        rounds += 1
    wall = time.perf_counter() - t0
    return {"burst_s": burst_s, "burst_calls": calls_per_burst, "step_s": step_s, "rounds": rounds,
            "burst_busy_s": rounds * calls_per_burst * burst_call_s, **meter.window(wall, e0)}


def idle(meter: Meter, name: str) -> dict:
    e0, t0 = meter.read_j(), time.perf_counter()
    time.sleep(2.0 if GPU else 0.01)
    return {"kind": name, **meter.window(time.perf_counter() - t0, e0)}


def main(path: str, kinds: tuple[str, ...], adam_elements: int, adam_window_s: float) -> None:
    out = open(path, "a")  # first: a bad path ends the run before any window
    meter = Meter.open()

    def emit(row: dict) -> None:
        row["meter"] = meter.sensor.kind
        out.write(json.dumps(row) + "\n")
        out.flush()
        print(json.dumps(row), flush=True)

    time.sleep(2.0 if GPU else 0.0)
    emit(idle(meter, "idle"))
    for tokens in SIZES.tokens if "gemm" in kinds else ():
        for hidden, ffn in SIZES.widths:
            for op, (m, n, k) in (("qkv", (tokens, 3 * hidden, hidden)), ("ffn_up", (tokens, ffn, hidden)),
                                  ("ffn_down", (tokens, hidden, ffn))):
                fn, flops = gemm(m, n, k)
                emit({"kind": "gemm", "op": op, "m": m, "n": n, "k": k, "flops": flops, **back_to_back(meter, fn)})
    heads, head_dim = (16, 128) if GPU else (2, 16)
    for seq in SIZES.attention_seqs if "attention" in kinds else ():
        batch = max(1, SIZES.attention_seqs[-1] // seq)
        q, k, v = (torch.randn(batch, heads, seq, head_dim, dtype=torch.bfloat16, device=DEVICE, requires_grad=True)
                   for _ in range(3))
        shape = {"seq": seq, "batch": batch, "heads": heads, "head_dim": head_dim}
        emit({"kind": "attention_fwd", **shape,
              **back_to_back(meter, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))})
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        g = torch.randn_like(o)
        emit({"kind": "attention_bwd", **shape,
              **back_to_back(meter, lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True))})
        del q, k, v, o, g
    for nbytes in SIZES.copy_bytes if "copy" in kinds else ():
        src = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=DEVICE)
        dst = torch.empty_like(src)
        emit({"kind": "copy", "bytes": nbytes, **back_to_back(meter, lambda: dst.copy_(src))})
    for name, (m, n, k) in SIZES.gapped_gemms if "gapped" in kinds else ():
        fn, flops = gemm(m, n, k)
        for gap_s in SIZES.gaps_s:
            emit({"kind": "gapped", "size": name, "m": m, "n": n, "k": k, "flops": flops, **gapped(meter, fn, gap_s)})
    for tokens in SIZES.mixed_tokens if "mixed" in kinds else ():
        for hidden, ffn in SIZES.widths[-2:]:
            for passes in SIZES.elementwise_passes:
                emit({"kind": "mixed", **mixed(meter, tokens, hidden, ffn, passes)})
    if "adam" in kinds:
        step = adam(adam_elements)
        emit({"kind": "adam", "elements": adam_elements, **back_to_back(meter, step, adam_window_s)})
        hidden, ffn = SIZES.widths[-1]
        burst, _ = gemm(SIZES.mixed_tokens[-1], ffn, hidden)
        burst_alone = back_to_back(meter, burst, adam_window_s)
        for burst_s in SIZES.bursts_s:
            emit({"kind": "adam_after_burst", "elements": adam_elements, "burst_alone": burst_alone,
                  **after_burst(meter, burst, burst_alone["call_s"], burst_s, step, adam_window_s)})
    emit(idle(meter, "idle_after"))


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kernel_power", description=__doc__.splitlines()[0])
    parser.add_argument("out", help="JSON lines file the windows are appended to")
    parser.add_argument("--only", action="append", choices=KINDS,
                        help="run only these kinds of window (repeat; default: all)")
    parser.add_argument("--adam-elements", type=int, default=SIZES.adam_elements,
                        help=f"parameters of the AdamW windows (default {SIZES.adam_elements})")
    parser.add_argument("--adam-window-s", type=float, default=WINDOW_S,
                        help=f"seconds of each AdamW window (default {WINDOW_S}): longer averages the meter's noise")
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse_args(sys.argv[1:])
    try:
        main(args.out, tuple(args.only or KINDS), args.adam_elements, args.adam_window_s)
    except OSError as exc:
        sys.exit(f"kernel_power: {exc}")
