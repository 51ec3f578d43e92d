"""Calibration orchestrator: run every microbenchmark once, save each result at once, write the profile.

Runs as one process (world size 1) or under torchrun, one process per GPU:
    torchrun --nproc-per-node 8 -m calibration.calibrate --out h200.json
Each benchmark is tried on its own: a failure is recorded with its reason and the run
goes on. Results are appended to PATH.raw.jsonl as they come, so a rerun of the same
command resumes where an interrupted one stopped.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import socket
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from calibration import FAMILIES, environment
from calibration.carried import REFERENCE_PROFILE
from calibration.meters import EnergyMonitor
from calibration.ds_worker import DeepSpeedWorker
from calibration.microbench import (collectives, compute, cpu, ds_steps, hostlink, layer, memory, overlap, param_refresh,
                                    pass_issue, power, wait_decay, zero3_hooks)
from calibration.microbench.common import BenchContext, BenchItem, Skip, gather_objects, sizes_for
from calibration.profile_writer import MissingMeasurements, build_profile
from calibration.rawlog import RawLog, RawResult, now_iso, raw_path_for
from calibration.report import one_line, step_fit_table, summary_table
from calibration.step_fit import fit_to_steps



@dataclass(frozen=True)
class CalibrationOptions:
    out: Path
    name: str | None = None
    quick: bool = False
    fresh: bool = False
    cpu_adam: str = "auto"
    fill_from: str | None = None
    cpu_tdp_w: float | None = None
    cpu_idle_w: float | None = None
    only: tuple[str, ...] = ()


@dataclass
class CalibrationResult:
    profile_path: Path | None
    raw_path: Path
    profile: dict | None
    measured: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    interrupted: bool = False  # stopped by Ctrl-C; what was measured is in the raw file


WORKER_FAMILIES = ("ds_steps", "zero3_hooks")  # what runs in the DeepSpeed worker


def plan(ctx: BenchContext, only: tuple[str, ...] = ()) -> list[BenchItem]:
    """Every benchmark in run order: cold idle power first, the other power phases last."""
    items = [power.item("idle")]
    for module in (compute, layer, hostlink, cpu, pass_issue, zero3_hooks, param_refresh, collectives, memory, overlap, power, wait_decay):
        if module is param_refresh:
            items.append(cpu.host_issue_item("mid"))
        if module is hostlink:
            # The DeepSpeed worker starts with the calibration and builds the CPU optimizer beside the GPU
            # benchmarks (their clocks are the GPU's); the host-timed benchmarks wait for it to finish.
            items.append(ds_steps.worker_item())
        items += module.items(ctx)
    # The host probe midway and at the end too: one reading scatters with the host's spells (262 us on a
    # lent H100 whose runs then probed 130-220 us), so the profile takes the median of three.
    items.append(cpu.host_issue_item("end"))
    if ctx.world_size == 1:  # real steps of each family last: the overhead terms are fitted to them
        items += ds_steps.items(ctx)
    return [i for i in items if not only or i.family in only]


def _setup_distributed() -> tuple[int, int, int, int, str, torch.device]:
    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    timeout = _dt.timedelta(minutes=10)
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ:  # torchrun
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        dist.init_process_group(backend, timeout=timeout, device_id=device if cuda else None)
    else:
        rank, world, local_rank, local_world = 0, 1, 0, 1
        device = torch.device("cuda", 0) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout,
                                device_id=device if cuda else None)
    return rank, world, local_rank, local_world, backend, device


def _console():
    from rich.console import Console

    return Console(stderr=True)


def _preflight(ctx: BenchContext, monitor: EnergyMonitor, console) -> None:
    """Warn (do not stop) when a GPU is busy or hot; this run's own processes do not count."""
    meter = monitor.gpu_meter
    own_pids = set(gather_objects(ctx, os.getpid()))
    if ctx.local_rank != 0 or not meter.present:
        return
    for w in environment.busy_or_hot([meter.state(i) for i in range(meter.device_count)], own_pids):
        console.print(f"[yellow]warning ({socket.gethostname()}): {w}[/yellow]")


def _run_item(ctx: BenchContext, item: BenchItem) -> tuple[str, dict, str | None]:
    try:
        return "ok", item.run(ctx), None
    except Skip as exc:
        return "skipped", {}, str(exc)
    except Exception as exc:  # recorded, and the calibration goes on
        if ctx.is_cuda:
            torch.cuda.empty_cache()
        return "failed", {"traceback": traceback.format_exc(limit=4)[-2000:]}, f"{type(exc).__name__}: {exc}"[:500]


def _merge_status(per_rank: list[tuple[str, dict, str | None]]) -> tuple[str, dict, str | None]:
    """Rank 0's result, unless another rank failed: then the item failed."""
    status, data, reason = per_rank[0]
    bad = [(r, rr[2]) for r, rr in enumerate(per_rank) if rr[0] == "failed"]
    if bad and status != "failed":
        return "failed", data, "; ".join(f"rank {r}: {why}" for r, why in bad)
    return status, data, reason


def run(opts: CalibrationOptions, console=None) -> CalibrationResult:
    console = console or _console()
    rank, world, local_rank, local_world, backend, device = _setup_distributed()
    try:
        return _run(opts, console, rank, world, local_rank, local_world, backend, device)
    except KeyboardInterrupt:
        # Ctrl-C: let the GPU finish what is queued and stop the meters' threads before leaving,
        # so nothing is torn down under a running stream (that once aborted the process).
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return CalibrationResult(profile_path=None, raw_path=raw_path_for(opts.out), profile=None,
                                 error=f"interrupted; every finished benchmark is saved in {raw_path_for(opts.out)}: "
                                       "rerun the same command to resume", interrupted=True)
    finally:
        dist.destroy_process_group()


def _run(opts, console, rank, world, local_rank, local_world, backend, device) -> CalibrationResult:
    ctx = BenchContext(device=device, sizes=sizes_for(opts.quick, device.type != "cuda"), rank=rank,
                       world_size=world, local_rank=local_rank, local_world_size=local_world, backend=backend,
                       cpu_adam=opts.cpu_adam)
    ctx.monitor = EnergyMonitor([device.index or 0] if ctx.is_cuda else [], sync=ctx.sync)
    ctx.worker = _worker(ctx) if local_rank == 0 else None
    try:
        return _measure(opts, console, ctx, rank, world, local_world, device)
    finally:
        if ctx.worker is not None:
            ctx.worker.close()
        ctx.monitor.close()


def _worker(ctx: BenchContext) -> DeepSpeedWorker:
    """The DeepSpeed worker on this rank's GPU, one rank of its own, at the issue benchmarks' threads
    (on a GPU the run's: torch's default, all the cores this process may use)."""
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "OMP_NUM_THREADS": str(ctx.issue_threads)}
    if ctx.is_cuda:
        env["CUDA_VISIBLE_DEVICES"] = str(ctx.device.index or 0)
    return DeepSpeedWorker(env)


def _measure(opts, console, ctx, rank, world, local_world, device) -> CalibrationResult:
    _preflight(ctx, ctx.monitor, console)
    gpu_meter = ctx.monitor.gpu_meter
    env = environment.collect(gpu_meter, gpu_meter.meter_indices([device.index or 0])[0])
    scope, basis = ctx.monitor.nvml_scope() if ctx.is_cuda else ("gpu", "")
    env.update(kind="measured" if ctx.is_cuda else "cpu", quick=opts.quick, world_size=world,
               gpus_per_node=local_world, nodes=ctx.nnodes, nvml_scope=scope, nvml_scope_basis=basis)
    raw_path = raw_path_for(opts.out)
    result = CalibrationResult(profile_path=None, raw_path=raw_path, profile=None)

    log, error, ref, reference = None, None, None, None
    if rank == 0:
        from models.profile import ProfileError, load_profile

        try:  # fail before measuring, not after
            ref = load_profile(opts.fill_from) if opts.fill_from else None
            reference = ref or load_profile(REFERENCE_PROFILE)
        except ProfileError as exc:
            error = f"--fill-from: {exc}" if opts.fill_from else str(exc)
        header = {"kind": env["kind"], "device": env["gpu"] or env["host_cpu"], "gpus_per_node": local_world,
                  "nodes": ctx.nnodes, "quick": opts.quick, "machine": env["machine"]}
        try:
            log = RawLog(raw_path, header, fresh=opts.fresh)
        except Exception as exc:
            error = error or str(exc)
    done, error = gather_objects(ctx, (log.done_keys() if log else set(), error))[0]
    if error:
        result.error = error
        return result

    items = plan(ctx, opts.only)
    if ctx.worker is not None and ctx.is_cuda and any(i.key not in done and i.family in WORKER_FAMILIES for i in items):
        ctx.worker.begin(ds_steps.warm_request(ctx))  # on the CPU path its start would slow the CPU's own timings
    progress = _progress(console) if rank == 0 else None
    task = progress.add_task("calibrating", total=len(items)) if progress else None
    with progress or _Nothing():
        for item in items:
            if item.key in done:
                result.reused.append(item.key)
                if progress:
                    progress.advance(task)
                continue
            if progress:
                progress.update(task, description=item.label or item.key)
            t0 = time.perf_counter()
            status, data, reason = _merge_status(gather_objects(ctx, _run_item(ctx, item)))
            if world > 1:
                dist.barrier()
            if rank == 0:
                log.append(RawResult(item.key, item.family, status, data, reason, time.perf_counter() - t0, now_iso()))
                mark = {"ok": "[green]ok[/green]", "skipped": "[dim]skipped[/dim]", "failed": "[red]FAILED[/red]"}
                detail = one_line(item.family, data) if status == "ok" else reason
                progress.console.print(f"{mark[status]} {item.label or item.key}: {detail}")
                progress.advance(task)
            if status == "ok":
                result.measured.append(item.key)
            elif status == "skipped":
                result.skipped[item.key] = reason
            else:
                result.failed[item.key] = reason
    if rank == 0:
        _write_profile(opts, env, log, result, console, ref, reference)
    return result


def _write_profile(opts, env, log, result, console, ref, reference) -> None:
    name = opts.name or default_name(env)
    try:
        profile = build_profile(env, log.results(), name=name, raw_file=log.path.name, fill_from=ref,
                                reference=reference,
                                cpu_tdp_w=opts.cpu_tdp_w, cpu_idle_w=opts.cpu_idle_w)
    except MissingMeasurements as exc:
        result.error = str(exc)
        console.print(f"[red]{exc}[/red]")
        return
    steps = fit_to_steps(profile, log.results())
    if steps is not None:
        profile = steps.profile
        console.print(step_fit_table(steps))
    out = Path(opts.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(profile, indent=2) + "\n")
    tmp.replace(out)
    result.profile_path, result.profile = out, profile
    console.print(summary_table(profile))
    console.print(f"wrote {out} (raw measurements: {log.path})")


def default_name(env: dict) -> str:
    base = env["gpu"] or "cpu"
    slug = "".join(c if c.isalnum() else "-" for c in base.lower()).strip("-")
    while "--" in slug:
        slug = slug.replace("--", "-")
    return f"{slug}-x{env['gpus_per_node']}" + (f"-n{env['nodes']}" if env.get("nodes", 1) > 1 else "")


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _progress(console):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console)


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m calibration.calibrate", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path, help="profile JSON to write (raw results go beside it)")
    p.add_argument("--name", default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--fresh", action="store_true", help="ignore an existing raw file and measure everything again")
    p.add_argument("--cpu-adam", choices=("auto", "deepspeed", "torch"), default="auto")
    p.add_argument("--fill-from", default=None, help="profile to take unmeasurable constants from")
    p.add_argument("--cpu-tdp-w", type=float, default=None)
    p.add_argument("--cpu-idle-w", type=float, default=None)
    p.add_argument("--only", action="append", choices=FAMILIES, default=[])
    return p


def options_from_args(ns: argparse.Namespace) -> CalibrationOptions:
    return CalibrationOptions(out=ns.out, name=ns.name, quick=ns.quick, fresh=ns.fresh, cpu_adam=ns.cpu_adam,
                              fill_from=ns.fill_from, cpu_tdp_w=ns.cpu_tdp_w, cpu_idle_w=ns.cpu_idle_w,
                              only=tuple(ns.only))


def main(argv: list[str] | None = None) -> int:
    result = run(options_from_args(build_arg_parser().parse_args(argv)))
    if result.interrupted:
        print(result.error, file=sys.stderr)
        return 130
    return 0 if result.error is None else 2


if __name__ == "__main__":
    raise SystemExit(main())
