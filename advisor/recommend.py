"""`advisor recommend` behind the CLI: build the problem, search, and write what was asked.

Kept apart from cli.py so the search can be driven from Python (benchmarks, tests) with
the same wiring of workload, profile and cost model as the command line.
"""
from __future__ import annotations

import hashlib
import json
from contextlib import contextmanager
from dataclasses import asdict

import click

from advisor.search import Problem, SearchResult, exhaustive_search, optuna_search
from advisor.space import build_space


DEFAULT_MEMORY_MARGIN = 0.05  # GPU memory a pick leaves free: allocated memory was predicted within 7% on H200


def make_problem(workload, profile, gpu_counts: list[int], global_batch: int, tokens: int,
                 cpu_threads_per_rank: int = 0, memory_margin: float = DEFAULT_MEMORY_MARGIN) -> Problem:
    """The search problem on the shipped cost model (`models.predict.predict_batch`)."""
    from models.predict import predict_batch

    arch = workload.arch
    space = build_space(arch, gpu_counts, int(profile.gpus_per_node.value), global_batch,
                        run_sequences=max(1, tokens // workload.seq_len), cpu_threads_per_rank=cpu_threads_per_rank)
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
    with progress_bar(f"{method} search") as progress:
        if method == "exhaustive":
            result = exhaustive_search(problem, objective, max_slowdown, progress=progress)
        else:
            result = optuna_search(problem, trials, objective, max_slowdown, storage=storage, seed=seed,
                                   progress=progress)
    return result


def point_dict(result: SearchResult, i: int, seq_len: int) -> dict:
    from advisor.strategy_flags import flags_for

    c = result.candidates
    s = c.strategies[i]
    m = {k: float(v[i]) for k, v in c.metrics.items()}
    return {
        "label": s.label(),
        "strategy": asdict(s),
        "predict_flags": flags_for(s),
        **m,
        "tokens_per_s": s.global_batch * seq_len / m["step_time_s"],
        "global_batch": s.global_batch,
        "steps": int(c.steps[i]),
        "run_time_s": float(c.run_time_s[i]),
        "run_energy_j": float(c.run_energy_j[i]),
    }


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
        with open(path, "w") as f:
            json.dump(config, f, indent=2)
    return write


def threads_of(strategy, profile) -> int:
    """The CPU threads per rank a strategy runs with on `profile` (its own, else the launch default)."""
    from models.strategy import StrategyBatch
    from models.timing import cpu_threads

    return int(cpu_threads(StrategyBatch.from_strategies([strategy]), profile)[0])


def thread_warnings(strategy, profile) -> list[str]:
    """What would make CPU offload run far slower than predicted."""
    threads, out = threads_of(strategy, profile), []
    ranks = min(strategy.gpus, strategy.gpus_per_node)
    if strategy.offload_optimizer == "cpu" and threads == 1:
        out.append("warning: this strategy offloads to the CPU with one thread per rank: the CPU optimizer "
                   "runs several times slower than with the node's cores shared out (--cpu-threads-per-rank)")
    if threads * ranks > profile.host.cores.value:
        out.append(f"warning: {ranks} ranks x {threads} threads exceed the {profile.host.cores.value:.0f} cores "
                   "of a node: threads compete, and the prediction assumes a core each")
    return out


def recommend_run(*, arch, workload, profile, gpu_counts, global_batch, tokens, objective, max_slowdown, method,
                  trials, storage, seed, out_ds_config, plot_path, as_json, notes=(),
                  cpu_threads_per_rank: int = 0, memory_margin: float = DEFAULT_MEMORY_MARGIN) -> SearchResult:
    from advisor.alternatives import alternatives
    from advisor.launch import launch
    from models.ds_config import to_ds_config

    problem = make_problem(workload, profile, gpu_counts, global_batch, tokens, cpu_threads_per_rank, memory_margin)
    result = run_search(problem, method, trials, objective, max_slowdown, storage, seed)
    chosen = result.candidates.strategies[result.pick]
    config = to_ds_config(chosen, arch)
    line = launch(chosen, threads_of(chosen, profile), config_path=out_ds_config or "ds_config.json")
    notes = list(notes) + thread_warnings(chosen, profile)
    if memory_margin:
        notes.append(f"every strategy shown leaves {memory_margin:.0%} of the GPU's {problem.gpu_memory_gib:.0f} GiB "
                     "free (--memory-margin): the room for the prediction's error")
    gpus = f"{gpu_counts[0]}" if len(gpu_counts) == 1 else f"{gpu_counts[0]}-{gpu_counts[-1]}"
    header = (f"{arch.name}, {workload.seq_len} tokens, {gpus} GPUs; objective {objective} within "
              f"{max_slowdown:.0%} of the fastest; run of {tokens:.3g} tokens; {method}, "
              f"{result.evaluations} evaluations")
    lines = search_notes(result, global_batch, list(notes))
    others = alternatives(result, objective, max_slowdown)
    if as_json:
        click.echo(json.dumps({
            "recommended": point_dict(result, result.pick, workload.seq_len),
            "pareto": [point_dict(result, i, workload.seq_len) for i in result.pareto],
            "alternatives": [a.to_dict(result) for a in others],
            "ds_config": config,
            "launch": asdict(line),
            "notes": lines,
            "search": {
                "method": method, "objective": objective, "max_slowdown": max_slowdown, "tokens": tokens,
                "global_batch_target": global_batch, "gpu_counts": list(gpu_counts),
                "evaluations": result.evaluations, "distinct_strategies": len(result.candidates),
                "resumed": result.trials_before > 0, "trials_before": result.trials_before,
                "trials_total": result.trials_total or result.evaluations,
                "study_name": result.study_name, "storage": storage, "profile": profile.describe(),
                "profile_trust": profile.trust(),
            },
        }))
    else:
        from advisor.render import console, show_recommendation

        show_recommendation(console(), result, workload.seq_len, config, line, header, profile.trust(), lines,
                            others)
    # The result is out before anything can fail on the way to a file.
    if out_ds_config:
        write_output("--out-ds-config", out_ds_config, _dump_json(config))
    if plot_path:
        from advisor.plot import pareto_plot

        write_output("--plot", plot_path,
                     lambda path: pareto_plot(result, path, f"{header}; {profile.name}", max_slowdown))
        if not as_json:
            click.echo(f"Pareto plot written to {plot_path}")
    return result
