"""How much of a pass the GPU waits on the host where the host's issue time and the GPU's work are
close: each pass's wall time against its host issue time and its GPU time, across token counts.

    python benchmarks/issue_crossover.py [--preset llama-2-7b] [--out results.json]

Why: the cost model takes a pass's time as a smooth max of the two (`models.timing.host_wait_s`, a
p-norm with p = `HOST_OVERLAP_SHARPNESS`, chosen, not measured), and the fitted runs whose host and GPU
times are close (a third to two thirds of the step on the host) were under-predicted at every ZeRO
stage (-2% to -5% on average) where fully host-bound ones were over-predicted. This measures the
crossover directly on the forward of a stack of harness decoder blocks:

- host: the seconds the forward call takes to return, the GPU busy throughout with an earlier long
  kernel, so the call never waits on it;
- GPU: CUDA events around the forward's kernels, queued behind that long kernel so that all of them
  are issued before the first runs (the GPU's own time, no waits);
- wall: the forward from an idle GPU to its last kernel's end, as a training step runs it.

The forward only: behind a long kernel the backward call itself waited for the GPU (494-527 ms behind
a 500 ms kernel on H200, machine AV), so its host time cannot be read this way.
Prints each token count's three times, the wall time over max(host, GPU), and the p of the p-norm
that fits the wall times best. On the CPU path (no CUDA) kernels run as they are issued: it only
checks that the stack runs (`--tokens 8,16`).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from models.timing import host_wait_s  # noqa: E402

LAYERS = 8
REPEATS = 5
GPU_TOKENS = (128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)


def _stack(preset: str, cuda: bool):
    from calibration.harness.model import DecoderBlock
    from calibration.microbench.layer import architecture

    arch = architecture(preset, not cuda)
    dtype = torch.bfloat16 if cuda else torch.float32
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    blocks = torch.nn.ModuleList(DecoderBlock(arch, None) for _ in range(LAYERS)).to(device, dtype)
    return arch, blocks, device, dtype


def forward_seconds(preset: str, tokens: int, cuda: bool) -> dict:
    """Median host, GPU and wall seconds of the stack's forward at `tokens`."""
    from calibration.harness.model import rope_tables

    arch, blocks, device, dtype = _stack(preset, cuda)
    cos, sin = rope_tables(torch.arange(tokens, device=device), arch.head_dim)
    x = torch.randn(1, tokens, arch.hidden_size, device=device, dtype=dtype, requires_grad=True)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def forward():
        h = x
        for block in blocks:
            h = block(h, cos, sin)
        return h.float().sum()

    def host_s() -> float:  # the GPU busy with an earlier kernel: the call never waits on it
        sync()
        if cuda:
            torch.cuda._sleep(int(0.5 * 2e9))  # cycles, at about 2 GHz: longer than any issue here
        t0 = time.perf_counter()
        forward()
        return time.perf_counter() - t0

    def gpu_s() -> float:  # every kernel queued behind that kernel before the first runs
        if not cuda:
            return float("nan")
        sync()
        torch.cuda._sleep(int(0.5 * 2e9))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        forward()
        end.record()
        sync()
        return start.elapsed_time(end) / 1e3

    def wall_s() -> float:  # from an idle GPU to the last kernel's end
        sync()
        t0 = time.perf_counter()
        forward()
        sync()
        return time.perf_counter() - t0

    medians = {}
    for name, fn in (("host", host_s), ("gpu", gpu_s), ("wall", wall_s)):  # forwards with autograd, as in training
        fn()  # warm-up
        medians[name] = statistics.median(fn() for _ in range(REPEATS))
    del blocks
    if cuda:
        torch.cuda.empty_cache()
    return {"tokens": tokens, **{f"forward_{name}_s": v for name, v in medians.items()}}


def smooth_max(host, gpu, p: float):
    """The cost model's time of a pass of `host` issue and `gpu` work at sharpness p."""
    return gpu + host_wait_s(host, gpu, p)


def best_p(rows: list[dict]) -> float | None:
    """The p whose smooth max fits the wall times best (log error); None without GPU times."""
    host, gpu, wall = (np.array([r[f"forward_{m}_s"] for r in rows]) for m in ("host", "gpu", "wall"))
    if not (gpu > 0).all():
        return None
    grid = np.arange(1.5, 32.01, 0.25)
    errors = [np.mean(np.log(smooth_max(host, gpu, p) / wall) ** 2) for p in grid]
    return float(grid[int(np.argmin(errors))])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="llama-2-7b", help="whose decoder layers (a preset name)")
    p.add_argument("--tokens", default=None, help="comma-separated token counts (default: 128-8192 on a GPU)")
    p.add_argument("--out", default=None, help="write the rows as JSON too")
    args = p.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    from calibration.microbench.layer import CPU_SHAPES, architecture
    from models.architecture import ModelConfigError

    cuda = torch.cuda.is_available()
    try:
        tokens = [int(t) for t in args.tokens.split(",")] if args.tokens else (list(GPU_TOKENS) if cuda else [8, 16])
    except ValueError:
        p.error(f"--tokens takes comma-separated whole numbers, not {args.tokens!r}")
    if not tokens or min(tokens) < 1:
        p.error("--tokens: each count must be at least 1")
    try:
        architecture(args.preset, not cuda)
    except ModelConfigError as exc:
        p.error(str(exc))
    except KeyError:
        p.error(f"the CPU path has tiny layers for {', '.join(CPU_SHAPES)} only, not {args.preset!r}")
    rows = []
    for t in tokens:
        rows.append(forward_seconds(args.preset, t, cuda))
        print(f"{t} tokens done", file=sys.stderr, flush=True)
    fitted = best_p(rows) if cuda else None
    table = Table(title=f"ms a forward, {LAYERS} {args.preset} layers, {torch.get_num_threads()} threads, "
                        f"{'GPU' if cuda else 'CPU path'}; best p = {fitted}")
    for col in ("tokens", "host", "GPU", "wall", "wall / max", "p=8 / wall"):
        table.add_column(col, justify="right")
    for r in rows:
        h, g, w = (r[f"forward_{m}_s"] for m in ("host", "gpu", "wall"))
        table.add_row(str(r["tokens"]), f"{h * 1e3:.2f}", f"{g * 1e3:.2f}" if cuda else "-", f"{w * 1e3:.2f}",
                      f"{w / max(h, g):.3f}" if cuda else "-", f"{smooth_max(h, g, 8.0) / w:.3f}" if cuda else "-")
    Console().print(table)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": "cuda" if cuda else "cpu", "threads": torch.get_num_threads(),
                                              "preset": args.preset, "layers": LAYERS, "best_p": fitted,
                                              "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
