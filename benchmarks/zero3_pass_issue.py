"""The host's time to issue each pass of a stack of decoder layers inside a DeepSpeed engine, under
ZeRO-0 and ZeRO-3, plain and checkpointed: what ZeRO-3's fetch and release hooks cost the host in
the forward, the backward, and a checkpointed layer's recompute.

    python benchmarks/zero3_pass_issue.py [--preset qwen2.5-1.5b] [--out results.json]

Why: the cost model charges ZeRO-3's hooks one `zero3_module_pass` per module in every pass, the
recompute's included (models/timing.py), and host-bound ZeRO-3 steps with checkpointing were
over-predicted where those without were under-predicted (held out on machine AR, 2026-12-03). A
stack of harness decoder blocks runs at a few tokens, so the GPU waits on the host throughout and a
call's wall time is the host's issue time. One process, one rank (gloo on the CPU path, NCCL on a GPU).
Prints milliseconds a layer for each stage, pass and checkpointing, medians of interleaved rounds.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from calibration.microbench.pass_issue import LAYERS, TOKENS, interleaved_pass_rounds  # noqa: E402


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


def engine_for(stage: int, arch, device):
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
            model = Stack(arch).to(device)
    finally:
        torch.set_default_dtype(default)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return engine, dtype


def passes_ms_per_layer(stage: int, arch, device, sync) -> dict:
    from calibration.harness.model import rope_tables

    engine, dtype = engine_for(stage, arch, device)
    cos, sin = rope_tables(torch.arange(TOKENS, device=device), arch.head_dim)
    x = torch.randn(1, TOKENS, arch.hidden_size, device=device, dtype=dtype, requires_grad=True)

    def forward(checkpointed: bool) -> torch.Tensor:
        engine.module.checkpointed = checkpointed
        return engine(x, cos, sin)

    rounds = interleaved_pass_rounds(forward, engine.backward, sync, after=engine.step)
    engine.destroy()

    def ms(which: int, part: int) -> float:
        return statistics.median(r[which][part] for r in rounds) / LAYERS * 1e3

    return {"stage": stage, "forward_ms": ms(0, 0), "backward_ms": ms(0, 1),
            "checkpointed_forward_ms": ms(1, 0), "checkpointed_backward_ms": ms(1, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="qwen2.5-1.5b", help="whose decoder layers (a preset name)")
    p.add_argument("--out", default=None, help="write the rows as JSON too")
    args = p.parse_args(argv)
    import deepspeed
    from rich.console import Console
    from rich.table import Table

    from calibration.microbench.layer import CPU_SHAPES, architecture
    from models.architecture import ModelConfigError

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    try:
        arch = architecture(args.preset, not cuda)
    except ModelConfigError as exc:
        p.error(str(exc))
    except KeyError:
        p.error(f"the CPU path has tiny layers for {', '.join(CPU_SHAPES)} only, not {args.preset!r}")
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": os.environ.get("MASTER_PORT", "29517")}.items():
        os.environ.setdefault(key, value)
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    rows = [passes_ms_per_layer(stage, arch, device, sync) for stage in (0, 3)]
    table = Table(title=f"host ms a layer, {LAYERS} {args.preset} layers at {TOKENS} tokens, "
                        f"{torch.get_num_threads()} threads, {'GPU' if cuda else 'CPU path'}")
    for col in ("ZeRO stage", "forward", "backward", "checkpointed forward", "checkpointed backward"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["stage"]), *(f"{r[k]:.3f}" for k in ("forward_ms", "backward_ms", "checkpointed_forward_ms",
                                                                  "checkpointed_backward_ms")))
    Console().print(table)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": str(device), "threads": torch.get_num_threads(),
                                              "preset": args.preset, "layers": LAYERS, "tokens": TOKENS, "rows": rows},
                                             indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
