"""`advisor validate`: run DeepSpeed candidates for real on this machine's GPUs, predicted first,
measured, stored, and shown side by side.

Loaded lazily by advisor.cli; torch is imported only to count the GPUs, DeepSpeed only inside
the harness subprocesses.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from advisor.inputs import FiniteFloatRange, parse_seq
from models.limits import MAX_GPUS, MAX_PER_SAMPLE
from advisor.rounds import repeat_note
from calibration.harness.window import WindowSettings
from runs.record import HOST_SPELL_S

WINDOW = WindowSettings()  # the defaults of the measured window


def _cell(comparison, metric: str) -> str:
    """Predicted / measured (error); an estimated CPU energy is marked est."""
    from advisor.render import error_suffix, figure

    p, m = comparison.predicted[metric], comparison.measured[metric]
    estimated = " est." if metric == "cpu_energy_j" and m is not None and comparison.cpu_energy_estimated else ""
    return f"{figure(p)} / {figure(m)}{estimated}{error_suffix(comparison.error_pct[metric])}"


def _default_store() -> Path:
    from runs.store import default_store_path

    return default_store_path()


@click.command()
@click.option("--model", default=None, help="Preset or config.json path (with --ds-config).")
@click.option("--seq", "seq_text", default=None, help="Context length: 4096, 4k, 32k (with --ds-config).")
@click.option("--ds-config", "ds_config_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Run this DeepSpeed config as is.")
@click.option("--gpus", type=click.IntRange(1, MAX_GPUS), default=None,
              help="GPUs for --ds-config (default: from its batch sizes, else its sp).")
@click.option("--images", type=click.IntRange(0, MAX_PER_SAMPLE), default=0, help="Images per sample (vision models).")
@click.option("--frames", type=click.IntRange(0, MAX_PER_SAMPLE), default=0, help="Video frames per sample (vision models).")
@click.option("--image-size", type=click.IntRange(1, MAX_PER_SAMPLE), default=None, help="Image side in pixels.")
@click.option("--freeze-vision/--train-vision", default=True, show_default=True)
@click.option("--loss-dtype", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True,
              help="The built-in model's cross-entropy dtype (with --ds-config): fp32 casts the logits first.")
@click.option("--cpu-threads-per-rank", "threads", type=click.IntRange(1, MAX_PER_SAMPLE), default=None,
              help="OMP_NUM_THREADS of every rank (with --ds-config). Default: the run's cores / its ranks.")
@click.option("--sweep", "sweep_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="JSONL of {model, seq, strategy | ds_config, images, frames, ...}, most valuable first.")
@click.option("--profile", default=None, help="Hardware profile for the predictions (default: the shipped default).")
@click.option("--store", "store_path", type=click.Path(dir_okay=False), default=None,
              help="SQLite run store (default: ~/.cache/energy-advisor/runs.db, else ./runs.db).")
@click.option("--jsonl", "jsonl_path", type=click.Path(dir_okay=False), default=None,
              help="Append each run here as it finishes (default: WORKDIR/runs.jsonl); a rerun skips what it holds.")
@click.option("--workdir", type=click.Path(file_okay=False), default=None,
              help="Per-run configs, logs and results (default: ~/.cache/energy-advisor/validate-runs, beside the "
                   "run store).")
@click.option("--warmup", type=click.IntRange(min=0), default=WINDOW.warmup, show_default=True)
@click.option("--steps", type=click.IntRange(min=1), default=WINDOW.steps, show_default=True,
              help="Measured steps, at least.")
@click.option("--min-window-s", type=FiniteFloatRange(min=0), default=WINDOW.min_window_s, show_default=True,
              help="Run more steps until the measured window is this long (energy counters tick every ~0.1 s).")
@click.option("--precision", type=FiniteFloatRange(min=0, max=1), default=WINDOW.precision, show_default=True,
              help=f"Then run more steps (up to {WINDOW.max_steps}, or {WINDOW.max_window_s:g} s) until the mean "
                   "step time's relative standard error "
                   "is this small; 0: stop at --steps and --min-window-s.")
@click.option("--timeout", "timeout_s", type=FiniteFloatRange(min=1), default=600, show_default=True,
              help="Seconds per run before it is stopped and recorded as a timeout.")
@click.option("--budget", "budget_s", type=FiniteFloatRange(min=1), default=None,
              help="Seconds for this whole command (op builds included): no run starts or runs past it.")
@click.option("--parallel/--serial", default=True, show_default=True,
              help="Run single-GPU candidates side by side, one per GPU, each on its share of the cores.")
@click.option("--retry", multiple=True, type=click.Choice(["oom", "crash", "timeout"]),
              help="Run candidates recorded with this status again.")
@click.option("--prebuild/--no-prebuild", default=None,
              help="Compile DeepSpeed's CPUAdam/FusedAdam once before the runs (default: when a GPU is present).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def validate(model, seq_text, ds_config_path, gpus, images, frames, image_size, freeze_vision, loss_dtype, threads,
             sweep_path, profile,
             store_path, jsonl_path, workdir, warmup, steps, min_window_s, precision, timeout_s, budget_s, parallel, retry,
             prebuild, as_json):
    """Run candidates for real, predict each first, store both, show predicted / measured (% error)."""
    started = time.monotonic()
    from runs.store import RunStore
    from advisor.validate import (
        candidate_from_ds_config,
        candidates_from_sweep,
        compare,
        default_workdir,
        latest_runs,
        local_slots,
        prebuild_local,
        print_progress,
        run_validation,
    )
    from advisor.outputs import output_file, output_folder
    from calibration.harness.runner import RunSettings
    from models.ds_config import read_ds_config

    if bool(sweep_path) == bool(ds_config_path):
        raise click.UsageError("give either --ds-config (with --model and --seq) or --sweep")
    if ds_config_path:
        if not model or not seq_text:
            raise click.UsageError("--ds-config needs --model and --seq")
        config = read_ds_config(ds_config_path)
        candidates = [candidate_from_ds_config(model, parse_seq(seq_text), config, gpus=gpus, images=images,
                                               frames=frames, image_size=image_size, freeze_vision=freeze_vision,
                                               loss_dtype=loss_dtype, cpu_threads_per_rank=threads or 0)]
    else:
        candidates = candidates_from_sweep(sweep_path)
    if profile is None:
        from models.profile import DEFAULT_PROFILE

        profile = DEFAULT_PROFILE
    workdir = output_folder(workdir or default_workdir(), "--workdir")
    jsonl = output_file(jsonl_path or workdir / "runs.jsonl", "--jsonl", make_folder=True,
                        reads=(sweep_path, ds_config_path))
    slots = local_slots(parallel)
    prebuild_local(slots, prebuild)

    window = WindowSettings(warmup=warmup, steps=steps, min_window_s=min_window_s, precision=precision)
    settings = RunSettings(window=window, timeout_s=timeout_s)
    beyond_host: list[dict] = []

    def left_out(candidate, why: str) -> None:
        beyond_host.append({"label": candidate.label, "reason": why})

    with RunStore(store_path or _default_store()) as store:
        print(f"runs: configs, logs and results in {workdir.resolve()}", file=sys.stderr, flush=True)
        left = budget_s - (time.monotonic() - started) if budget_s else None
        records = run_validation(candidates, store, jsonl, workdir, settings, slots, profile, deadline_s=left,
                                 retry=tuple(retry), on_record=print_progress, concurrent=parallel,
                                 on_skip=left_out)
        shown = latest_runs(candidates, records, store, jsonl)
    host_profile = _profile_or_none(profile)
    comparisons = [compare(r, host_profile, stored=stored) for r, stored in shown]
    skipped = len({c.key() for c in candidates}) - len(shown) - len(beyond_host)
    if as_json:
        click.echo(json.dumps({"profile": profile, "runs": [c.to_dict() for c in comparisons],
                               "not_run": skipped, "beyond_host_memory": beyond_host}))
        return
    _show(comparisons, profile, skipped, window, len(beyond_host))


def _profile_or_none(name: str):
    """The profile the predictions used, for the host check; None where it cannot be read (the
    predictions then say why)."""
    from models.profile import load_profile

    try:
        return load_profile(name)
    except Exception:  # noqa: BLE001 - a bad profile costs the host check, not the measurements
        return None


def _show(comparisons, profile: str, skipped: int, window: WindowSettings, beyond_host: int) -> None:
    from rich.table import Table

    from advisor.render import ESTIMATED_CPU_NOTE, console, probed_host_line, retry_hint
    from advisor.validate import METRICS

    table = Table(title=f"Predicted / measured per optimizer step (profile {profile})", title_justify="left")
    for col in ("run", "status", "step s", "GPU J", "CPU J", "GPU GiB allocated", "GPU GiB reserved", "host GiB"):
        table.add_column(col, justify="left" if col in ("run", "status") else "right")
    for c in comparisons:
        status = c.status if c.status == "ok" else f"[red]{c.status}[/red]: see below"
        table.add_row(c.label, status + (" (stored)" if c.stored else ""), *(_cell(c, m) for m in METRICS))
    out = console()
    out.print(table)
    for c in comparisons:  # whole, below the table: in a cell it squeezed the figures or was cut
        if c.status != "ok":
            out.print(f"{c.label}: {c.status}: {c.reason}", highlight=False, markup=False, soft_wrap=True)
    stored = sum(c.stored for c in comparisons)
    notes = [f"(stored): {stored} run(s) found from an earlier command, not run again" if stored else None,
             ESTIMATED_CPU_NOTE if any(c.cpu_energy_estimated and c.measured["cpu_energy_j"] is not None
                                       for c in comparisons) else None,
             retry_hint(c.status for c in comparisons)]
    for note in notes:
        if note:
            out.print(note, highlight=False)
    for c in comparisons:
        if c.host and c.host["differs"]:
            out.print(f"{c.label}: {c.host['note']}")
            if c.at_probed_host:
                out.print(probed_host_line(c.label, c.at_probed_host))
        if c.memory_note:
            out.print(f"{c.label}: {c.memory_note}")
        if c.status == "ok" and c.step_time_rel_sem is None and c.window_s is not None:
            out.print(f"{c.label}: its window ({c.window_s:.1f} s) was shorter than two {HOST_SPELL_S:g}-s host spells: "
                      "how well its mean step time is known is not measured.")
        if c.status == "ok" and c.step_time_rel_sem is not None and not window.precise_enough(c.step_time_rel_sem):
            out.print(f"{c.label}: its mean step time is known to +-{100 * c.step_time_rel_sem:.1f}% only (the window "
                      "ran out first; a noisy host): a smaller difference from another run is not measured.")
        repeats = repeat_note(c.host_share) if c.status == "ok" else None
        if repeats:
            out.print(f"{c.label}: {repeats}")
    if skipped:
        out.print(f"{skipped} candidate(s) not run: past --budget (a rerun runs them).")
    if beyond_host:
        out.print(f"{beyond_host} candidate(s) not run: predicted to need more host memory than this host has "
                  "available (each named on stderr).")
    sys.stdout.flush()
