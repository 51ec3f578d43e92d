"""A decoder layer's kernels as measured, against the cost model's three ways of costing them; and a
ViT block's elementwise kernels against their counted and their measured bytes.

    python benchmarks/layer_kernels.py [RAW.jsonl] [--json]

RAW is an `advisor calibrate --only layer_elementwise` raw file (default: the H200 one of
2026-12-05, machine CD, in data/calibration, whose layers include Qwen3's with and without their q/k
norms and with sandwich norms added). For each measured layer (one harness decoder block's forward and
backward, torch.profiler) it prints the GEMMs against the profile's GEMM curve, the attention core
against its curves, and the rest (norms, RoPE, activation, residuals, casts, copies) against the
bytes counted from the ops and against the shipped profile's measured bytes (`gpu.layer_elementwise`),
all at efficiency 1; and RAW's own fit. Where RAW measured ViT blocks (`vision_elementwise`), a
second table does the same for their elementwise kernels (`gpu.vision_elementwise`). Runs anywhere:
it reads measurements, it does not make them.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from calibration.fitting import (VISION_WIDTHS, decoder_row, fit_elementwise,  # noqa: E402
                                 separated_decoder_widths)
from calibration.microbench.layer import architecture  # noqa: E402
from calibration.rawlog import RawLogMismatch, read_raw  # noqa: E402
from models.flops import (counted_vit_block_bytes_per_token, layer_elementwise_bytes_per_token,  # noqa: E402
                          micro_step_work)
from models.profile import load_profile  # noqa: E402
from models.workload import Workload  # noqa: E402

DEFAULT_RAW = REPO / "data" / "calibration" / "h200-x1-layers-norms-2026-12-05-CD.raw.jsonl"


def modeled_s(row: dict, profile) -> dict:
    """GEMM and attention seconds of the measured layer at the profile's curves (efficiency 1)."""
    arch = architecture(row["preset"], cpu=False)
    work = micro_step_work(Workload(arch, row["tokens"]), 1, 1, 0)
    gemm = sum(float(g.fwd_flops + g.bwd_flops) / float(profile.gpu.gemm_bf16(g.flops_per_call))
               for g in work.gemms if g.name != "lm_head") / arch.num_layers
    af, ab = profile.gpu.attention_rates(row["tokens"], arch.head_dim)
    attention = float(work.attn_fwd_flops / af + work.attn_bwd_flops / ab) / arch.num_layers
    bandwidth = profile.gpu.hbm_bandwidth.value
    counted = 3.0 * row["tokens"] * layer_elementwise_bytes_per_token(arch) / bandwidth
    measured = profile.gpu.layer_elementwise
    shipped = (3.0 * row["tokens"] * layer_elementwise_bytes_per_token(arch, measured) / bandwidth
               if measured is not None else None)
    return {"gemm_s": gemm, "attention_s": attention, "counted_other_s": counted, "profile_other_s": shipped}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("raw", nargs="?", type=Path, default=DEFAULT_RAW)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    try:
        _, results = read_raw(args.raw)
    except OSError as exc:
        print(f"layer_kernels: {exc}", file=sys.stderr)
        return 2
    except (ValueError, RawLogMismatch) as exc:
        print(f"layer_kernels: {args.raw} is not a calibration raw file ({exc})", file=sys.stderr)
        return 2
    rows = [decoder_row(r.data) for r in results.values() if r.family == "layer_elementwise" and r.status == "ok"]
    widths = separated_decoder_widths(rows)
    if len(rows) < len(widths):
        print(f"layer_kernels: {args.raw} holds {len(rows)} measured layers; need {len(widths)}", file=sys.stderr)
        return 2
    profile = load_profile("h200")
    fit = fit_elementwise(rows, profile.gpu.hbm_bandwidth.value, widths)
    out = [{**r, **{f"modeled_{k}": v for k, v in modeled_s(r, profile).items()}} for r in rows]
    if args.json:
        print(json.dumps({"raw": str(args.raw), "fit": fit.__dict__, "rows": out}, indent=1))
        return 0
    table = Table(title=f"One decoder layer, forward + backward, ms: measured / modeled ({args.raw.name})")
    for col in ("layer", "tokens", "GEMMs", "attention", "rest: measured", "counted bytes", "profile"):
        table.add_column(col, justify="left" if col == "layer" else "right")
    for r in out:
        table.add_row(r["preset"], str(r["tokens"]), f"{r['gemm_s'] * 1e3:.2f} / {r['modeled_gemm_s'] * 1e3:.2f}",
                      f"{r['attention_s'] * 1e3:.2f} / {r['modeled_attention_s'] * 1e3:.2f}",
                      f"{r['other_s'] * 1e3:.2f}", f"{r['modeled_counted_other_s'] * 1e3:.2f}",
                      "-" if r["modeled_profile_other_s"] is None else f"{r['modeled_profile_other_s'] * 1e3:.2f}")
    console = Console(width=max(110, Console().width))
    console.print(table)
    per = ", ".join(f"{width} {value:.0f}" for width, value in fit.bytes_per_element.items())
    console.print(f"{args.raw.name}'s own fit, bytes per token per element of each width: {per}; worst layer "
                  f"{fit.worst_error:.1%} off")
    vit_rows = [r.data for r in results.values() if r.family == "vision_elementwise" and r.status == "ok"]
    if len(vit_rows) >= len(VISION_WIDTHS):
        print_vision(console, vit_rows, profile, args.raw.name)
    return 0


def print_vision(console: Console, rows: list[dict], profile, raw_name: str) -> None:
    """The ViT blocks' elementwise ms: measured, counted (models.flops's bytes), the profile's fit."""
    bandwidth = profile.gpu.hbm_bandwidth.value
    measured = profile.gpu.vision_elementwise
    table = Table(title=f"One ViT block's elementwise kernels, forward + backward, ms ({raw_name})")
    for col in ("block", "tokens", "measured", "forward alone", "counted bytes", "profile"):
        table.add_column(col, justify="left" if col == "block" else "right")
    for r in rows:
        counted = 3.0 * r["tokens"] * counted_vit_block_bytes_per_token(r["hidden"], r["ffn"]) / bandwidth
        shipped = (r["tokens"] * measured.bytes_per_token(r["hidden"], r["ffn"]) / bandwidth
                   if measured is not None else None)
        table.add_row(r["shape"], str(r["tokens"]), f"{r['other_s'] * 1e3:.2f}", f"{r['other_forward_s'] * 1e3:.2f}",
                      f"{counted * 1e3:.2f}", "-" if shipped is None else f"{shipped * 1e3:.2f}")
    console.print(table)
    fit = fit_elementwise(rows, bandwidth, VISION_WIDTHS)
    console.print(f"{raw_name}'s own ViT fit: {fit.bytes_per_element['hidden']:.0f} / {fit.bytes_per_element['ffn']:.0f} "
                  f"bytes per patch token per element of hidden / FFN width, worst block {fit.worst_error:.1%} off")


if __name__ == "__main__":
    sys.exit(main())
