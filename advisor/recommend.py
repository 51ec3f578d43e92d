"""`advisor recommend` behind the CLI: build the problem, search, and write what was asked.

Kept apart from cli.py so the search can be driven from Python (benchmarks, tests) with
the same wiring of workload, profile and cost model as the command line.
"""
from __future__ import annotations

import hashlib
import json
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import click

from advisor.outputs import write_atomic
from advisor.search import Problem, SearchResult, auto_method, exhaustive_search, optuna_search
from advisor.space import build_space


DEFAULT_MEMORY_MARGIN = 0.05  # GPU memory a pick leaves free: allocated memory was predicted within 7% on H200


def make_problem(workload, profile, gpu_counts: list[int], global_batch: int, tokens: int,
                 cpu_threads_per_rank: int = 0, memory_margin: float = DEFAULT_MEMORY_MARGIN,
                 target: str = "deepspeed") -> Problem:
    """The search problem on the shipped cost model (`models.predict.predict_batch`); for the
    Hugging Face Trainer (`target` hf), only what it runs (`advisor.hf_trainer.trainer_space`)."""
    from models.predict import predict_batch

    arch = workload.arch
    space = build_space(arch, gpu_counts, int(profile.gpus_per_node.value), global_batch,
                        run_sequences=max(1, tokens // workload.seq_len), cpu_threads_per_rank=cpu_threads_per_rank)
    if target == "hf":
        from advisor.hf_trainer import trainer_space

        space = trainer_space(space)
    digest = hashlib.sha1((repr(workload) + profile.to_json()).encode()).hexdigest()[:10]
    return Problem(
        space=space, arch=arch, seq_len=workload.seq_len, tokens=tokens,
        evaluate=lambda batch: predict_batch(workload, batch, profile),
        gpu_memory_gib=profile.gpu.memory_gib.value, host_memory_gib=profile.host.memory_gib.value,
        key=f"{arch.name}-seq{workload.seq_len}-{profile.name}-{digest}", gpu_memory_margin=memory_margin,
    )


@contextmanager
def progress_bar(label: str):
    """A rich progress bar on stderr, shown only on a terminal (stdout stays clean for --json)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    err = Console(stderr=True)
    if not err.is_terminal:
        yield None
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as bar:
        task = bar.add_task(label, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def run_search(problem: Problem, method: str, trials: int, objective: str, max_slowdown: float,
               storage: str | None = None, seed: int | None = 0) -> SearchResult:
    points = problem.space.enumerate(problem.arch) if method in ("auto", "exhaustive") else None
    if method == "auto":
        method = auto_method(points)
    with progress_bar(f"{method} search") as progress:
        if method == "exhaustive":
            result = exhaustive_search(problem, objective, max_slowdown, progress=progress, points=points)
        else:
            result = optuna_search(problem, trials, objective, max_slowdown, storage=storage, seed=seed,
                                   progress=progress)
    return result


def search_notes(result: SearchResult, global_batch: int, extra: list[str]) -> list[str]:
    """What the user should know about how the pick was reached, one line each."""
    notes = list(extra) + list(result.notes)
    chosen = result.candidates.strategies[result.pick]
    if chosen.global_batch != global_batch:
        notes.append(f"global batch {global_batch} sequences rounded to {chosen.global_batch} so that "
                     f"{chosen.dp} data-parallel ranks x micro-batch {chosen.micro_batch} divide it")
    if len(result.pareto) == 1:
        notes.append("one strategy is both the fastest and the least energy here: the Pareto front is one point; "
                     "the best of each family below is what you would trade against")
    return notes


class OutputWriteError(ValueError):
    """A requested output file could not be written (the folder went away, the disk is full)."""


def write_output(option: str, path: str, write) -> None:
    try:
        write(path)
    except OSError as exc:
        raise OutputWriteError(f"cannot write {option} {path}: {exc.strerror or exc}") from None


def _dump_json(config: dict):
    def write(path):
        write_atomic(path, json.dumps(config, indent=2))
    return write


def threads_of(strategy, profile) -> int:
    """The CPU threads per rank a strategy runs with on `profile` (its own, else the launch default)."""
    from models.strategy import StrategyBatch
    from models.timing import cpu_threads

    return int(cpu_threads(StrategyBatch.from_strategies([strategy]), profile)[0])


def thread_warnings(strategy, profile) -> list[str]:
    """What would make CPU offload run far slower than predicted."""
    from advisor.host_check import calibrate_host_commands

    threads, out = threads_of(strategy, profile), []
    ranks = strategy.ranks_per_node
    if strategy.offload_optimizer == "cpu" and threads == 1:
        out.append("warning: this strategy offloads to the CPU with one thread per rank: the CPU optimizer "
                   "runs several times slower than with the node's cores shared out (--cpu-threads-per-rank)")
    if threads * ranks > profile.host.cores.value:
        out.append(f"warning: {ranks} ranks x {threads} threads exceed the {profile.host.cores.value:.0f} cores "
                   "of a node: threads compete, and the prediction assumes a core each")
    if strategy.offload_optimizer == "cpu":
        out.append(f"note: CPU offload's time follows the host CPU; this {profile.provenance.kind} profile's CPU "
                   f"optimizer speed is for '{profile.host.cpu}'. Lent 2x H200 hosts of one kind ran the same offload step up to "
                   f"1.8x apart (data/runs/README.md). Measure your node's in about a minute: "
                   + calibrate_host_commands(profile.name))
    return out


@dataclass(frozen=True)
class RecommendRequest:
    """Everything `advisor recommend` was asked, parsed."""

    model: str  # as typed: a preset name or a config.json path (validation runs need it)
    workload: object  # models.workload.Workload
    profile: object  # models.profile.HardwareProfile
    profile_name: str  # as typed: its band and refits live beside it
    gpu_counts: list[int]
    global_batch: int
    tokens: int
    objective: str
    max_slowdown: float
    method: str
    trials: int
    storage: str | None
    seed: int | None
    out_ds_config: str | None
    plot_path: str | None
    as_json: bool
    notes: tuple[str, ...] = ()
    cpu_threads_per_rank: int = 0
    memory_margin: float = DEFAULT_MEMORY_MARGIN
    loop: object | None = None  # advisor.loop.LoopSettings: measure the closest candidates
    target: str = "deepspeed"  # what runs the config: deepspeed (its own flags) or hf (the Trainer)


def recommend_run(req: RecommendRequest) -> SearchResult:
    from advisor.alternatives import alternatives
    from advisor.bands import pool_band_note, profile_band, with_bands
    from advisor.host_check import host_bound_notes
    from advisor.unmeasured import pick_note, rests_on
    from advisor.model_notes import head_dim_notes
    from models.predict import predict

    workload, profile, arch = req.workload, req.profile, req.workload.arch
    problem = make_problem(workload, profile, req.gpu_counts, req.global_batch, req.tokens, req.cpu_threads_per_rank,
                           req.memory_margin, req.target)
    result = run_search(problem, req.method, req.trials, req.objective, req.max_slowdown, req.storage, req.seed)
    band, band_note = profile_band(req.profile_name, profile)
    notes = list(req.notes) + head_dim_notes(arch, profile)
    if req.target == "hf":
        from advisor.hf_trainer import TRAINER_SPACE_NOTE

        notes.append(TRAINER_SPACE_NOTE)
    if req.memory_margin:
        notes.append(f"every strategy shown leaves {req.memory_margin:.0%} of the GPU's {problem.gpu_memory_gib:.0f} "
                     "GiB free (--memory-margin): the room for the prediction's error")
    if band_note:
        notes.append(band_note)
    gpus = f"{req.gpu_counts[0]}" if len(req.gpu_counts) == 1 else f"{req.gpu_counts[0]}-{req.gpu_counts[-1]}"
    header = (f"{arch.name}, {workload.seq_len} tokens, {gpus} GPUs; objective {req.objective} within "
              f"{req.max_slowdown:.0%} of the fastest; run of {req.tokens:.3g} tokens; {result.method}, "
              f"{result.evaluations} evaluations")
    others = alternatives(result, req.objective, req.max_slowdown)

    shown = {result.pick, *result.pareto, *(a.index for a in others)}
    unmeasured = rests_on(result, shown, workload, profile)

    def point(i):
        return {**with_bands(band, result.point(i, workload.seq_len)),
                "rests_on_unmeasured": [r.to_dict() for r in unmeasured.get(i, [])]}

    loop = None
    if req.loop is not None:
        from advisor.loop import close_loop

        loop = close_loop(req, result, band)
        if req.loop.plan_only:
            _print_plan(req, loop)
            return result
    pick = loop.pick_index if loop and loop.pick_index is not None else result.pick
    if pick not in unmeasured:  # a measured pick the search did not show
        unmeasured.update(rests_on(result, [pick], workload, profile))
    unmeasured_note = pick_note(unmeasured[pick], profile)
    chosen = result.candidates.strategies[pick]
    config, training, line = pick_outputs(req, chosen)
    recommended = point(pick)
    pool_note = pool_band_note(recommended["peak_gpu_mem_gib_band"], problem.gpu_memory_gib, band.level if band else None)
    lines = search_notes(result, req.global_batch, notes + ([unmeasured_note] if unmeasured_note else [])
                         + thread_warnings(chosen, profile)
                         + host_bound_notes(predict(workload, chosen, profile)) + ([pool_note] if pool_note else []))
    if req.as_json:
        click.echo(json.dumps({
            "recommended": recommended,
            "model_pick": point(result.pick),
            "pareto": [point(i) for i in result.pareto],
            "alternatives": [a.to_dict(result) for a in others],
            "ds_config": config,
            "target": req.target,
            "training_args": training.kwargs() if training else None,
            "launch": asdict(line),
            "notes": lines,
            "band": {"level": band.level, "source": band.source} if band else None,
            "validation": loop.to_dict() if loop else None,
            "search": {
                "method": result.method, "objective": req.objective, "max_slowdown": req.max_slowdown,
                "tokens": req.tokens, "global_batch_target": req.global_batch, "gpu_counts": list(req.gpu_counts),
                "evaluations": result.evaluations, "distinct_strategies": len(result.candidates),
                "resumed": result.trials_before > 0, "trials_before": result.trials_before,
                "trials_total": result.trials_total or result.evaluations,
                "study_name": result.study_name, "storage": req.storage, "profile": profile.describe(),
                "profile_trust": profile.trust(),
            },
        }))
    else:
        from advisor.render import console, show_config, show_loop, show_recommendation

        out = console()
        show_recommendation(out, result, workload.seq_len, header, profile.trust(), lines, others,
                            picked_by="measurement" if loop and loop.pick_index is not None else "the model")
        if loop:
            out.print()
            show_loop(out, loop)
        show_config(out, config, line, training)
    # The result is out before anything can fail on the way to a file.
    if req.out_ds_config:
        write_output("--out-ds-config", req.out_ds_config, _dump_json(config))
    if req.plot_path:
        from advisor.plot import pareto_plot

        write_output("--plot", req.plot_path,
                     lambda path: pareto_plot(result, path, f"{header}; {profile.name}", req.max_slowdown))
        if not req.as_json:
            click.echo(f"Pareto plot written to {req.plot_path}")
    return result


def pick_outputs(req: RecommendRequest, chosen) -> tuple[dict, object, object]:
    """The pick's DeepSpeed config, its TrainingArguments (advisor.hf_trainer.TrainingArgs; None but
    for the Trainer) and launch line, starting the --script the loop ran where it ran one."""
    from advisor.launch import default_program, launch, script_program
    from models.ds_config import to_ds_config

    path = req.out_ds_config or "ds_config.json"
    config, training = to_ds_config(chosen, req.workload.arch), None
    if req.target == "hf":
        from advisor.hf_trainer import for_trainer

        config, training = for_trainer(config, chosen, path)
    flags = training.layout_flags() if training else None
    script = req.loop.script if req.loop is not None else None
    program = (script_program(script, path, chosen, req.model, req.workload.seq_len, flags) if script
               else default_program(path, flags))
    return config, training, launch(chosen, threads_of(chosen, req.profile), program, trainer=training is not None)


def _print_plan(req: RecommendRequest, loop) -> None:
    if req.as_json:
        click.echo(json.dumps({"plan": loop.to_dict()}))
        return
    from advisor.render import console, show_loop

    show_loop(console(), loop)
