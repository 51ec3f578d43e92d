"""The host's time to issue a layer: forward with autograd, without it, forward and backward, and a
checkpointed layer's forward and backward, for the host probe's tiny Linear and a tiny harness block.

    python benchmarks/checkpoint_issue.py [OUT.json]

A checkpointed layer's first forward runs without autograd and its forward runs again in backward;
the cost model charges it a full extra layer pass of issue time (models/timing.py). The shapes are
tiny, so the GPU waits on the host throughout. Prints one row per stack and repeat: microseconds a
layer, and each checkpointed variant over the plain forward and backward.
"""
from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from calibration.harness.model import DecoderBlock, rope_tables  # noqa: E402
from models.architecture import load_architecture  # noqa: E402

LAYERS, ROUNDS, REPEATS = 16, 9, 10
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SYNC = torch.cuda.synchronize if DEVICE.type == "cuda" else (lambda: None)
DTYPE = torch.bfloat16 if DEVICE.type == "cuda" else torch.float32
ARCH = dataclasses.replace(load_architecture("qwen2.5-0.5b"), hidden_size=64, intermediate_size=128, num_heads=4,
                           num_kv_heads=2)


def stacks() -> dict:
    """name: (layers, input, how one layer is called)."""
    cos, sin = rope_tables(torch.arange(8, device=DEVICE), ARCH.head_dim)
    return {
        "linear": (torch.nn.ModuleList(torch.nn.Linear(64, 64) for _ in range(LAYERS)).to(DEVICE, DTYPE),
                   torch.randn(8, 64, device=DEVICE, dtype=DTYPE, requires_grad=True), lambda layer, x: layer(x)),
        "decoder": (torch.nn.ModuleList(DecoderBlock(ARCH, None) for _ in range(LAYERS)).to(DEVICE, DTYPE),
                    torch.randn(1, 8, 64, device=DEVICE, dtype=DTYPE, requires_grad=True),
                    lambda layer, x: layer(x, cos, sin)),
    }


def us_per_layer(layers, x0, call, mode: str, checkpoint=None) -> float:
    """Median over rounds of the host's time per layer; nothing waits for the GPU inside a round."""
    def forward(grad: bool):
        x = x0
        with torch.set_grad_enabled(grad):
            for layer in layers:
                x = checkpoint(lambda y, layer=layer: call(layer, y), x) if checkpoint else call(layer, x)
        return x

    def once():
        if mode == "fwd_nograd":
            forward(False)
        elif mode == "fwd_grad":
            forward(True)
        else:
            forward(True).float().sum().backward()

    for _ in range(3):
        once()
    SYNC()
    rounds = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(REPEATS):
            once()
        rounds.append((time.perf_counter() - t0) / (REPEATS * LAYERS) * 1e6)
        SYNC()
    return statistics.median(rounds)


def checkpoints() -> dict:
    from torch.utils.checkpoint import checkpoint

    out = {"torch_reentrant": lambda f, x: checkpoint(f, x, use_reentrant=True),
           "torch_nonreentrant": lambda f, x: checkpoint(f, x, use_reentrant=False)}
    try:
        import deepspeed

        if DEVICE.type == "cuda":
            deepspeed.checkpointing.configure(None, partition_activations=False)
            out["deepspeed"] = deepspeed.checkpointing.checkpoint
    except Exception as exc:  # noqa: BLE001 - the torch variants still run
        print(f"DeepSpeed's checkpoint not measured: {type(exc).__name__}: {exc}", file=sys.stderr)
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    result = {"device": str(DEVICE), "torch": torch.__version__, "threads": torch.get_num_threads(), "rows": []}
    variants = checkpoints()
    for name, (layers, x0, call) in stacks().items():
        for repeat in range(2):  # twice: how far the host drifts between repeats
            row = {"stack": name, "repeat": repeat}
            for mode in ("fwd_grad", "fwd_nograd", "plain"):
                row[mode] = us_per_layer(layers, x0, call, mode)
            for ck_name, ck in variants.items():
                row[f"ckpt_{ck_name}"] = us_per_layer(layers, x0, call, "plain", ck)
            result["rows"].append(row)
            ratios = " ".join(f"{k}/plain {v / row['plain']:.2f}" for k, v in row.items() if k.startswith("ckpt_"))
            print(f"{name:8s} fwd {row['fwd_grad']:7.1f} us, no-grad fwd {row['fwd_nograd']:7.1f}, "
                  f"fwd+bwd {row['plain']:7.1f}; {ratios}", flush=True)
    if argv:
        Path(argv[0]).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
