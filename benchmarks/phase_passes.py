"""Each pass of a traced step against the model's: the host's time, the GPU's busy time and the GPU's span.

    python benchmarks/phase_passes.py --runs RUNS.jsonl --traces DIR [--profile h200] [--json]

DIR holds the runs' phase traces (`ADVISOR_PHASE_TRACE`, `calibration/harness/phase_trace.py`), one
`KEY.json` per record of RUNS. For the last micro-step of each run, predicted on the host its probes
measured: the forward's and the backward's host seconds against the model's issue time, their GPU busy
seconds against the model's GPU work, and their GPU span against the model's pass (the GPU's work and its
wait on the host); the optimizer step's GPU busy seconds against the model's `optimizer_gpu`; and where
the trace measured the passes' power (`pass_power`), the forward and backward's power and the optimizer
step's against the model's (the step: its `optimizer_gpu` and `deepspeed_overhead`; the rest of the step
the forward and backward's). Where the trace split each pass's device time by kind of kernel
(`PassKernels`), the forward's and backward's GEMM, attention, elementwise (the trace's "other") and
communication (NCCL kernels and copies) seconds against the model's parts (`StepTiming.pass_parts_s`),
and the pass's longest kernels by name. Why: the
step-time error of a run says that the model missed, these say in which pass and on which side (machines
AW and AX, 2026-12-03: the optimizer step's GPU work, and the checkpointed ZeRO-3 forward's host time),
and the kinds say in which of its parts.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from calibration.harness.pass_power import PassPower  # noqa: E402
from calibration.harness.phase_trace import power_step_s, refit_pass_power  # noqa: E402
from models.predict import predict, step_timing  # noqa: E402
from models.profile import ProfileError, load_profile  # noqa: E402
from runs.jsonl import RunFileError, read_records  # noqa: E402
from runs.measured import to_measured_run  # noqa: E402

PASSES = ("forward", "backward")
# A pass's kinds of GPU work: the model's part (models.timing.StepTiming.pass_parts_s) and the trace's
# kernel classes it is compared with (calibration.harness.phase_trace.KERNEL_CLASSES). The trace's NCCL
# kernels and copies run beside the compute on streams of their own: their seconds are the stream's, as
# the model's "communication" is, not what they add to the pass.
KINDS = {"gemm": ("gemm",), "attention": ("attention",), "elementwise": ("other",),
         "communication": ("communication", "copy")}
STEP_PHASES = ("optimizer_gpu", "deepspeed_overhead")
GPU_BOUND_BUSY = 0.9  # a pass busy this share of its span is the GPU's


def power_row(pass_power: PassPower, prediction, excess: float) -> dict:
    """Measured and modelled watts of the forward and backward together and of the optimizer step;
    `excess`, how much longer the power's steps ran than the marked ones, is idle time the measured
    watts hold and a step in training does not (synchronized edges: machines BK and BL)."""
    watts, seconds = pass_power.power_w, pass_power.seconds
    passes = [k for k in PASSES if k in watts]
    measured_fb = sum(watts[k] * seconds[k] for k in passes) / sum(seconds[k] for k in passes)
    step = [p for p in prediction.breakdown if p.name in STEP_PHASES]
    step_s, step_j = sum(p.time_s for p in step), sum(p.gpu_energy_j for p in step)
    rest_s = prediction.step_time_s - step_s
    return {"forward_backward_w": measured_fb,
            "model_forward_backward_w": (prediction.gpu_energy_j - step_j) / rest_s if rest_s > 0 else None,
            "step_w": watts.get("step"), "model_step_w": step_j / step_s if step_s > 0 else None,
            "rms_w": pass_power.rms_w, "excess": excess}


def kind_rows(kernels: dict | None, model_parts: dict) -> dict | None:
    """Each of KINDS measured (the trace's kernel classes summed) and modelled, seconds; None for a trace
    that kept no kernels (before 2026-12-05, or without a device clock)."""
    if not kernels:
        return None
    return {kind: {"measured_s": sum(kernels["by_class_s"][c] for c in classes),
                   "model_s": float(model_parts[kind][0])} for kind, classes in KINDS.items()}


def pass_rows(records, traces: Path, profile) -> list[dict]:
    """One row a traced run: measured and modelled seconds of its last micro-step's passes."""
    rows = []
    for record in records:
        path = traces / f"{record.key}.json"
        if record.result.status != "ok" or not path.exists():
            continue
        run = to_measured_run(record)
        trace = json.loads(path.read_text())
        passes = {(p["name"], p["micro_step"]): p for p in trace["passes"]}
        last = run.strategy.grad_accum - 1
        tm = step_timing(run.workload, run.strategy, run.on_its_host(profile))
        row = {"label": run.label, "step_time_s": run.step_time_s}
        for name in PASSES:
            measured = passes[(name, last)]
            gpu = float(tm.pass_gpu_s[name][0])
            row[name] = {"host_s": measured["host_s"], "model_issue_s": float(tm.pass_issue_s[name][0]),
                         "gpu_busy_s": measured["gpu_busy_s"], "model_gpu_s": gpu,
                         "gpu_span_s": measured["gpu_span_s"], "model_span_s": gpu + float(tm.pass_wait_s[name][0]),
                         "kinds": kind_rows(measured.get("kernels"), tm.pass_parts_s[name]),
                         "top_kernels": (measured.get("kernels") or {}).get("top")}
        step = passes[("step", last)]
        # Under optimizer offload the trace's busy time holds the host copies (gradients down in the
        # backward, parameters up in the step) that the model keeps apart (`host_transfer`): no model
        # figure compares with the step's (machine BA, 2026-12-03: 56-851 ms busy, the model's GPU step none).
        offloaded = run.strategy.offload_optimizer != "none"
        row["step"] = {"gpu_busy_s": step["gpu_busy_s"],
                       "model_gpu_s": None if offloaded else float(tm.phase_time_s["optimizer_gpu"][0]),
                       "gpu_span_s": step["gpu_span_s"]}
        row["host_copies_in_gpu_busy"] = offloaded
        # The model's step phases hold the host's waits of every pass (`deepspeed_overhead`): only where
        # the forward and backward keep the GPU busy do its phases split as the passes do.
        gpu_bound = all(passes[(name, last)]["gpu_busy_s"] >= GPU_BOUND_BUSY * passes[(name, last)]["gpu_span_s"]
                        for name in PASSES if passes[(name, last)]["gpu_span_s"])
        fitted = refit_pass_power(trace["pass_power"]) if trace.get("pass_power") else None
        row["power"] = None
        if fitted and gpu_bound and not offloaded:
            excess = power_step_s(trace["pass_power"]) / trace["step_s"] - 1
            row["power"] = power_row(fitted, predict(run.workload, run.strategy, run.on_its_host(profile)), excess)
        rows.append(row)
    return rows


def _pair(measured, model) -> str:
    if measured is None:
        return "-"
    if model is None:
        return f"{measured * 1e3:.1f} / -"
    return f"{measured * 1e3:.1f} / {model * 1e3:.1f} ({(model / measured - 1) * 100:+.0f}%)"


def _watts(measured, model) -> str:
    if measured is None or model is None:
        return "-"
    return f"{measured:.0f} / {model:.0f} ({(model / measured - 1) * 100:+.0f}%)"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", action="append", required=True, help="run records (JSONL); repeatable")
    p.add_argument("--traces", required=True, type=Path, help="folder of the runs' phase traces, KEY.json each")
    p.add_argument("--profile", default="h200", help="profile name or JSON path (default h200)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = p.parse_args(argv)
    if not args.traces.is_dir():
        p.error(f"--traces: no folder {args.traces}")
    try:
        profile = load_profile(args.profile)
        records = [r for path in args.runs for r in read_records(path)]
    except (ProfileError, RunFileError) as exc:
        p.error(str(exc))
    rows = pass_rows(records, args.traces, profile)
    if not rows:
        p.error(f"no run of {', '.join(args.runs)} has a phase trace in {args.traces}")
    if args.json:
        print(json.dumps({"profile": profile.describe(), "runs": rows}))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"ms, measured / model (model's error), last micro-step, each run on its probed host; {profile.describe()}")
    for column in ("run", "forward host / issue", "forward GPU busy", "forward span", "backward host / issue",
                   "backward GPU busy", "backward span", "step GPU busy"):
        table.add_column(column, justify="left" if column == "run" else "right")
    for r in rows:
        f, b, s = r["forward"], r["backward"], r["step"]
        table.add_row(r["label"], _pair(f["host_s"], f["model_issue_s"]), _pair(f["gpu_busy_s"], f["model_gpu_s"]),
                      _pair(f["gpu_span_s"], f["model_span_s"]), _pair(b["host_s"], b["model_issue_s"]),
                      _pair(b["gpu_busy_s"], b["model_gpu_s"]), _pair(b["gpu_span_s"], b["model_span_s"]),
                      _pair(s["gpu_busy_s"], s["model_gpu_s"]))
    Console(width=220).print(table)
    powered = [r for r in rows if r["power"]]
    if powered:
        watts = Table(title="GPU power of the passes, W, measured / model (model's error); the fit's residual")
        for column in ("run", "forward + backward", "optimizer step", "residual", "steps longer than marked"):
            watts.add_column(column, justify="left" if column == "run" else "right")
        for r in powered:
            w = r["power"]
            watts.add_row(r["label"], _watts(w["forward_backward_w"], w["model_forward_backward_w"]),
                          _watts(w["step_w"], w["model_step_w"]), f"{w['rms_w']:.0f}", f"{w['excess'] * 100:+.0f}%")
        Console(width=220).print(watts)
        print("Where the power's steps ran longer than the marked ones (the last column; a synchronize at each edge "
              "before the edges were taken on the GPU's clock), the measured watts hold that idle time.")
    kinds = [r for r in rows if r["forward"]["kinds"]]
    if kinds:
        split = Table(title="GPU seconds of the passes by kind of kernel, ms, measured / model (model's error)")
        split.add_column("run", justify="left")
        for name in PASSES:
            for kind in KINDS:
                split.add_column(f"{name} {kind}", justify="right")
        for r in kinds:
            split.add_row(r["label"], *(_pair(r[name]["kinds"][kind]["measured_s"] or None,
                                              r[name]["kinds"][kind]["model_s"]) for name in PASSES for kind in KINDS))
        Console(width=260).print(split)
        print("By kind each kernel counts whole: the NCCL kernels and copies beside the compute are their stream's "
              "seconds, and the kinds may sum past the pass's busy time. --json names each pass's longest kernels.")
    print("A pass whose GPU is busy for most of its span is the GPU's: its host seconds then include waiting on a "
          "full launch queue, and say nothing of the issue time.")
    if any(r["host_copies_in_gpu_busy"] for r in rows):
        print("Under optimizer offload the measured GPU busy time holds the host copies, which the model keeps in "
              "host_transfer: its backward figure is the GPU's work alone, and it has none for the step.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
