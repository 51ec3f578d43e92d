"""The H200 calibration sweep: which real runs to make on one H200 (x1) and on two NVLink H200s
(x2), and the scale-out runs on four (x4), most valuable first, written as sweep files for `advisor validate --sweep`.

    python -m calibration.harness.sweep_h200 --out data/sweeps

Each machine gets its own list and the two are disjoint: x2 takes every two-GPU run, the
multimodal runs and the single-GPU runs that need more host memory than x1's 128 GiB; x1 takes
the remaining single-GPU runs. Ordering puts one run of each strategy family first (ZeRO
stages, optimizer offload sync and SuperOffload, parameter offload, checkpointing, Ulysses),
then sizes, context lengths and micro-batches, so a sweep cut short still spans the space.
Every strategy passes `models.strategy.static_reasons`; whether it fits in memory is left to
the run (an OOM is data too).
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from models.strategy import Strategy

VL_MINI = "data/sweeps/qwen2.5-vl-mini.json"
# A small Qwen2-VL-style model: the qwen2.5-0.5b backbone and a ViT-B/14-sized encoder
# (86M parameters), 2x2 spatial merge and 2-frame temporal patches: 256 LLM tokens per 2 frames.
VL_MINI_CONFIG = {
    "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
    "intermediate_size": 4864, "vocab_size": 151936, "tie_word_embeddings": True,
    "vision_config": {
        "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
        "patch_size": 14, "image_size": 448, "spatial_merge_size": 2, "temporal_patch_size": 2,
        "projector_hidden_size": 3584,
        "_source": "ViT-B/14-sized encoder (86M parameters) chosen for short calibration runs",
    },
    "_source": "calibration model: qwen2.5-0.5b backbone + small ViT + MLP projector, Qwen2-VL layout",
}
HOST_GIB = {"x1": 128, "x2": 256, "x4": 512}
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Run:
    model: str
    seq: int
    strategy: Strategy
    frames: int = 0
    images: int = 0
    freeze_vision: bool = False
    host_gib_needed: float = 0.0  # rough pinned host memory for offload (not a prediction)
    tags: tuple[str, ...] = field(default_factory=tuple)

    def line(self) -> dict:
        out = {"model": self.model, "seq": self.seq, "strategy": asdict(self.strategy),
               "label": f"{Path(self.model).stem if self.model.endswith('.json') else self.model} {self.seq} "
                        f"{self.strategy.label()}"}
        if self.frames:
            out["frames"] = self.frames
        if self.images:
            out["images"] = self.images
        if self.frames or self.images:
            out["freeze_vision"] = self.freeze_vision
            out["label"] += f" {'frozen' if self.freeze_vision else 'trained'} {self.frames or self.images}" \
                            f"{'f' if self.frames else 'img'}"
        return out


def S(gpus=1, zero=2, ckpt=0, mb=1, ga=1, sp=1, opt="none", param="none", superoff=False) -> Strategy:
    return Strategy(gpus=gpus, gpus_per_node=gpus, zero_stage=zero, checkpoint_every=ckpt, micro_batch=mb,
                    grad_accum=ga, sp=sp, offload_optimizer=opt, offload_param=param, super_offload=superoff)


def _offload_host_gib(params_billion: float) -> float:
    """fp32 master weights, Adam moments and fp32 gradients on the host: 16 bytes a parameter."""
    return 16 * params_billion


Q05, TL, Q15, L7 = "qwen2.5-0.5b", "tinyllama-1.1b", "qwen2.5-1.5b", "llama-2-7b"


def runs() -> list[Run]:
    """Every run, in priority order (before the split by machine)."""
    off15, off7 = _offload_host_gib(1.5), _offload_host_gib(6.7)
    return [
        # One of each family first.
        Run(Q05, 4096, S(zero=0)),
        Run(Q15, 8192, S(zero=2, ckpt=1)),
        Run(Q15, 8192, S(gpus=2, zero=2, ckpt=1)),
        Run(Q15, 8192, S(zero=2, ckpt=1, opt="cpu"), host_gib_needed=off15),
        Run(Q15, 8192, S(zero=3, ckpt=1, opt="cpu", superoff=True), host_gib_needed=off15),
        Run(Q15, 16384, S(gpus=2, zero=2, ckpt=1, sp=2)),
        Run(VL_MINI, 8192, S(zero=2, ckpt=1), frames=32, freeze_vision=True),
        Run(Q15, 8192, S(zero=3, ckpt=1, opt="cpu", param="cpu"), host_gib_needed=off15),
        Run(L7, 4096, S(gpus=2, zero=3, ckpt=1)),
        Run(VL_MINI, 8192, S(zero=2, ckpt=1), frames=32, freeze_vision=False),
        Run(Q15, 8192, S(zero=2, ckpt=0)),
        Run(Q05, 4096, S(zero=3)),
        Run(Q15, 8192, S(gpus=2, zero=3, ckpt=1)),
        Run(VL_MINI, 16384, S(gpus=2, zero=2, ckpt=1, sp=2), frames=64, freeze_vision=False),
        # ZeRO stages and micro-batches on the small model.
        Run(Q05, 4096, S(zero=1)),
        Run(Q05, 4096, S(zero=2)),
        Run(Q05, 2048, S(zero=2, mb=4)),
        Run(Q05, 2048, S(zero=2, mb=2)),
        Run(Q05, 2048, S(zero=2, mb=1, ga=4)),
        # Context length, with and without checkpointing.
        Run(Q05, 16384, S(zero=2, ckpt=1)),
        Run(Q05, 32768, S(zero=2, ckpt=1)),
        Run(Q05, 32768, S(zero=2, ckpt=0)),
        Run(Q05, 8192, S(zero=2, ckpt=2)),
        Run(Q05, 32768, S(gpus=2, zero=2, ckpt=0, sp=2)),
        Run(Q05, 32768, S(gpus=2, zero=2, ckpt=1)),
        Run(Q15, 32768, S(gpus=2, zero=3, ckpt=1, sp=2)),
        # Offload families at a second size and on two GPUs.
        Run(TL, 4096, S(zero=2, opt="cpu"), host_gib_needed=_offload_host_gib(1.1)),
        Run(TL, 4096, S(zero=3, ckpt=1, opt="cpu", superoff=True), host_gib_needed=_offload_host_gib(1.1)),
        Run(Q15, 8192, S(zero=2, ckpt=1, opt="cpu", ga=4), host_gib_needed=off15),
        Run(Q15, 8192, S(gpus=2, zero=2, ckpt=1, opt="cpu"), host_gib_needed=off15),
        Run(Q15, 8192, S(gpus=2, zero=3, ckpt=1, opt="cpu", superoff=True), host_gib_needed=off15),
        Run(L7, 4096, S(gpus=2, zero=3, ckpt=1, opt="cpu"), host_gib_needed=off7),
        Run(L7, 4096, S(gpus=2, zero=3, ckpt=1, opt="cpu", superoff=True), host_gib_needed=off7),
        Run(L7, 16384, S(gpus=2, zero=3, ckpt=1, sp=2)),
        Run(TL, 8192, S(gpus=2, zero=3, ckpt=1, opt="cpu", param="cpu"), host_gib_needed=_offload_host_gib(1.1)),
        # Sizes and stages at one context.
        Run(TL, 4096, S(zero=2, mb=2)),
        Run(TL, 16384, S(zero=2, ckpt=1)),
        Run(Q15, 8192, S(zero=0, ckpt=1)),
        Run(Q15, 8192, S(zero=3, ckpt=1)),
        Run(Q15, 4096, S(zero=1, opt="cpu"), host_gib_needed=off15),
        Run(Q15, 8192, S(gpus=2, zero=1, ckpt=1)),
        Run(L7, 2048, S(zero=3, ckpt=1, opt="cpu", param="cpu"), host_gib_needed=off7),
        Run(L7, 2048, S(zero=2, ckpt=1)),
        # Multimodal: frozen and trained encoder, frame counts, offload, Ulysses.
        Run(VL_MINI, 8192, S(zero=2, ckpt=1), frames=8, freeze_vision=True),
        Run(VL_MINI, 16384, S(zero=2, ckpt=1), frames=64, freeze_vision=False),
        Run(VL_MINI, 16384, S(gpus=2, zero=2, ckpt=1, sp=1), frames=64, freeze_vision=False),
        Run(VL_MINI, 8192, S(zero=2, ckpt=1, opt="cpu"), frames=32, freeze_vision=False, host_gib_needed=8),
        Run(VL_MINI, 8192, S(zero=3, ckpt=1), frames=32, freeze_vision=False),
        Run(VL_MINI, 8192, S(gpus=2, zero=2, ckpt=1, sp=2), frames=32, freeze_vision=True),
        Run(VL_MINI, 4096, S(zero=2, ckpt=1), images=4, freeze_vision=True),
        Run(VL_MINI, 8192, S(zero=3, ckpt=1, opt="cpu", superoff=True), frames=32, freeze_vision=False,
            host_gib_needed=8),
        Run(VL_MINI, 8192, S(zero=2, ckpt=0), frames=32, freeze_vision=True),
    ]


def runs_x4() -> list[Run]:
    """Scale-out runs for a 4-GPU node, most valuable first: Ulysses sp 4 at 32k-128k, ZeRO-2/3 at
    dp 4 with and without offload, TinyLlama-1.1B and LLaMA-2-7B (both have KV heads divisible by
    4), and TinyLlama at 32k on 1, 2 and 4 GPUs (sp = GPUs) for energy per token against GPU count."""
    off_tl, off7 = _offload_host_gib(1.1), _offload_host_gib(6.7)
    four = dict(gpus=4, ckpt=1)
    return [
        Run(TL, 32768, S(zero=3, sp=4, **four)),
        Run(L7, 4096, S(zero=3, **four)),
        Run(L7, 32768, S(zero=3, sp=4, **four)),
        Run(TL, 8192, S(zero=2, **four)),
        Run(L7, 4096, S(zero=2, **four)),
        Run(L7, 4096, S(zero=2, opt="cpu", **four), host_gib_needed=off7),
        Run(TL, 32768, S(zero=3, ckpt=1)),
        Run(TL, 32768, S(gpus=2, zero=3, ckpt=1, sp=2)),
        Run(TL, 8192, S(zero=3, opt="cpu", **four), host_gib_needed=off_tl),
        Run(TL, 131072, S(zero=3, sp=4, **four)),
        Run(L7, 65536, S(zero=3, sp=4, **four)),
        Run(TL, 32768, S(zero=2, sp=4, **four)),
        Run(L7, 16384, S(zero=3, sp=2, **four)),
        Run(TL, 8192, S(zero=3, **four)),
        Run(L7, 4096, S(zero=3, opt="cpu", param="cpu", **four), host_gib_needed=off7),
        Run(L7, 32768, S(zero=3, sp=4, opt="cpu", **four), host_gib_needed=off7),
        Run(TL, 65536, S(gpus=4, zero=3, ckpt=0, sp=4)),
        Run(TL, 8192, S(zero=2, mb=2, **four)),
        Run(L7, 8192, S(zero=3, ga=2, **four)),
        Run(TL, 8192, S(zero=1, **four)),
        Run(L7, 4096, S(zero=3, opt="cpu", superoff=True, **four), host_gib_needed=off7),
    ]


def split(all_runs: list[Run], machine: str) -> list[Run]:
    """Disjoint lists: x2 gets two-GPU runs, multimodal runs and single-GPU runs that need more
    host memory than half of x1's; x1 gets the rest. Order is kept."""
    def on_x2(r: Run) -> bool:
        return r.strategy.gpus == 2 or r.model == VL_MINI or r.host_gib_needed > HOST_GIB["x1"] / 2

    return [r for r in all_runs if on_x2(r) == (machine == "x2")]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="data/sweeps", help="folder for h200-x1/x2/x4.jsonl")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_path = REPO_ROOT / VL_MINI  # sweep lines name it relative to the repo root
    model_path.parent.mkdir(parents=True, exist_ok=True)
    model_path.write_text(json.dumps(VL_MINI_CONFIG, indent=2) + "\n")
    everything = runs()
    lists = {machine: split(everything, machine) for machine in ("x1", "x2")}
    lists["x4"] = runs_x4()
    for machine, chosen in lists.items():
        lines = [json.dumps(r.line(), sort_keys=True) for r in chosen]
        (out / f"h200-{machine}.jsonl").write_text("\n".join(lines) + "\n")
        print(f"{out / f'h200-{machine}.jsonl'}: {len(lines)} runs")


if __name__ == "__main__":
    main()
