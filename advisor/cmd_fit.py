"""`advisor fit` and `advisor report`: refine a profile from measured runs, and show how well a
profile predicts them.

Loaded lazily by advisor.cli. Runs come from JSONL files (`data/runs/*.jsonl`) and/or the run
store; failed runs (oom, crash, timeout) are counted and left out.
"""
from __future__ import annotations

import json
import math

import click


def _run_set(run_paths: tuple[str, ...], store_path: str | None):
    from runs.measured import gather_records, to_run_set

    if not run_paths and not store_path:
        raise click.UsageError("give the runs: --runs FILE.jsonl (repeatable) and/or --store DB")
    run_set = to_run_set(gather_records(list(run_paths), store_path))
    if not run_set.runs:
        where = ", ".join(list(run_paths) + ([store_path] if store_path else []))
        raise click.ClickException(f"no successful runs to use in {where} ({run_set.summary()})")
    return run_set


def _sources(run_paths, store_path) -> str:
    return ", ".join(list(run_paths) + ([f"store {store_path}"] if store_path else []))


def _inputs(run_paths, store_path, profile) -> tuple:
    """The files a command reads, which its outputs must not replace."""
    from models.band import band_path
    from models.profile import profile_path

    read = profile_path(profile)
    return (*run_paths, store_path, read, band_path(read))


def _parameter_rows(model) -> list[dict]:
    return [{"name": f.name, "fitted_to": f.kind, "start": f.start, "value": f.value, "std": f.std,
             "informed": f.informed} for f in model.parameters_.values()]


def _format_parameters(rows: list[dict], model) -> str:
    """The fitted constants, then the pool's figures and the host's, of a fitted `ProfileFit`."""
    lines = [f"{'constant':<44}{'start':>11}{'fitted':>11}{'+-':>10}  note"]
    for r in rows:
        std = "-" if r["std"] is None else f"{r['std']:.3g}"
        note = f"fitted to {r['fitted_to']}" if r["informed"] else "kept: no run responds to it"
        lines.append(f"{r['name']:<44}{r['start']:>11.4g}{r['value']:>11.4g}{std:>10}  {note}")
    if model.offload_start_pool_ is not None:
        value, count = model.offload_start_pool_
        lines.append(f"{'memory.offload_start_pool':<44}{'':>11}{value:>11.4g}{'-':>10}  x bf16 parameters "
                     f"({count} ZeRO-1/2 offload runs)")
    for name, (value, count) in (model.fragmentation_ or {}).items():
        lines.append(f"{name:<44}{'':>11}{value:>11.4g}{'-':>10}  median reserved/allocated - 1 ({count} runs)")
    if model.collective_pool_ is not None:
        value, count = model.collective_pool_
        lines.append(f"{'memory.collective_pool':<44}{'':>11}{value:>11.4g}{'-':>10}  median GiB beyond the share "
                     f"({count} runs on more than one GPU)")
    if model.host_process_ is not None:
        lines.append(f"{'memory.host_process_per_rank':<44}{'':>11}{model.host_process_:>11.4g}{'-':>10}  "
                     "median host GiB per rank, runs without offload")
    return "\n".join(lines)


def _runs_summary(run_set) -> dict:
    return {"used": len(run_set.runs), "failed": run_set.failed, "unusable": run_set.skipped,
            "repeats_averaged": run_set.repeats}


@click.command()
@click.option("--runs", "run_paths", multiple=True, type=click.Path(dir_okay=False),
              help="JSONL of run records (data/runs/*.jsonl); repeatable.")
@click.option("--store", "store_path", type=click.Path(dir_okay=False), default=None, help="SQLite run store to read too.")
@click.option("--profile", required=True, help="Profile to start from: shipped name or JSON path.")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False, writable=True),
              help="Where to write the fitted profile (JSON).")
@click.option("--loo/--no-loo", default=True, show_default=True,
              help="Report each run's error as if left out of the fit, and write the band from them: by default "
                   "from the one fit (leverage-corrected residuals: seconds); see --folds and --exact.")
@click.option("--folds", type=click.IntRange(min=2), default=None,
              help="Hold out this many folds in turn instead (as many refits: minutes); the report and band say which.")
@click.option("--exact", is_flag=True,
              help="Leave each run out by a refit of its own (an hour for 300 runs on two cores; progress on stderr).")
@click.option("--prior-strength", "prior_text", default="cv", show_default=True,
              help="How strongly constants stay at their starting values: a number, or 'cv' to pick "
                   "0.001, 0.01 or 0.1 by the error of runs held out (leverage-corrected).")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Processes for the held-out refits, at most one a core (default: one a core).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def fit(run_paths, store_path, profile, out_path, loo, folds, exact, prior_text, jobs, as_json):
    """Fit the profile's efficiency, overlap, overhead and power constants to measured runs and
    write the refined profile; print leave-one-out error (K-fold's with --folds) per strategy family,
    and write the 90% prediction band those errors give beside the profile (PROFILE.band.json)."""
    from advisor.accuracy import format_report
    from advisor.inputs import check_jobs, usable_cores
    from advisor.outputs import output_file, write_atomic
    from advisor.refit import refit, to_stderr
    from models.band import band_path
    from models.profile import load_profile

    prior = _prior(prior_text)
    jobs = check_jobs(jobs) if jobs else usable_cores()
    if (folds or exact) and not loo:
        raise click.UsageError("--folds and --exact hold runs out: they cannot go with --no-loo")
    if folds and exact:
        raise click.UsageError("--folds and --exact are two ways to hold runs out: give one")
    base_profile = load_profile(profile)
    run_set = _run_set(run_paths, store_path)
    if folds and folds > len(run_set.runs):
        raise click.UsageError(f"--folds {folds}: more folds than the {len(run_set.runs)} runs; give at most "
                               f"{len(run_set.runs)}, or leave --folds out to hold out each run")
    reads = _inputs(run_paths, store_path, profile)
    # after every input is read (its folder is made here), before the fit's minutes, so its result is not lost
    out = output_file(out_path, "--out", make_folder=True, reads=reads)
    output_file(str(band_path(out)), "--out (its band beside it)", reads=reads)
    done = refit(run_set.runs, base_profile, prior, loo=loo, data_note=_sources(run_paths, store_path),
                 jobs=jobs, progress=to_stderr, folds=folds, exact=exact)
    model, base, report = done.model, done.base, done.report
    write_atomic(out, model.profile_.to_json() + "\n")
    if done.band:
        write_atomic(band_path(out), done.band.to_json() + "\n")
    rows = _parameter_rows(model)
    if as_json:
        click.echo(json.dumps({
            "profile_out": str(out), "base_profile": base.describe(), "runs": _runs_summary(run_set),
            "prior_strength": done.prior_strength,
            "cross_validation": {str(k): v for k, v in done.cv_scores.items()},
            "prior_hurt_models": {str(k): v for k, v in done.prior_hurt.items()},
            "released_constants": list(done.released), "released_score": done.released_score, "parameters": rows,
            "fragmentation": {k: v for k, (v, _) in (model.fragmentation_ or {}).items()},
            "collective_pool_gib": model.collective_pool_[0] if model.collective_pool_ else None,
            "offload_start_pool": model.offload_start_pool_[0] if model.offload_start_pool_ else None,
            "host_process_per_rank_gib": model.host_process_,
            # the held-out report under its own name: leave-one-out's, or k-fold's (its mode says which)
            ("held_out" if folds else "leave_one_out"): report.to_dict() if report else None,
            "band": json.loads(done.band.to_json()) if done.band else None,
        }))
        return
    click.echo(f"Fitted {base.describe()} to {run_set.summary()}; wrote {out}")
    if done.cv_scores:
        click.echo("prior strength by the error of runs held out (mean |log error|): "
                   + ", ".join(f"{k:g}: {v:.3f}" for k, v in done.cv_scores.items())
                   + f"; chose {done.prior_strength:g}")
        hurt = {k: v for k, v in done.prior_hurt.items() if v}
        if hurt:
            click.echo("  not chosen: a model held out came out worse than before the fit under "
                       + "; ".join(f"{k:g} ({', '.join(v)})" for k, v in hurt.items()))
        if done.released:
            click.echo(f"  fitted at the weakest prior instead, each helping the models held out and hurting none: "
                       f"{', '.join(done.released)} (mean |log error| {done.cv_scores[done.prior_strength]:.3f} -> "
                       f"{done.released_score:.3f})")
    for line in run_set.skipped:
        click.echo(f"  unusable: {line}")
    click.echo(_format_parameters(rows, model))
    if report:
        click.echo("")
        click.echo(format_report(report))
    if done.band:
        click.echo("")
        click.echo(_format_band(done.band, band_path(out)))


def _format_band(band, path) -> str:
    from models.band import POOL_METRIC

    lines = [f"{band.level:.0%} prediction band (from the held-out errors), written to {path}:"]
    for metric in ("step_time_s", "gpu_energy_j", POOL_METRIC):
        m = getattr(band, metric)
        if m is None:  # too few runs measured the pool
            continue
        lines.append(f"  {metric}: predicted x [{math.exp(m.low_log):.3f}, {math.exp(m.high_log):.3f}] "
                     f"({m.runs} runs; held {m.loo_coverage:.0%} of them, each left out)")
    return "\n".join(lines)


def _prior(text: str):
    from advisor.refit import PriorError, parse_prior

    try:
        return parse_prior(text)
    except PriorError as exc:
        raise click.UsageError(str(exc)) from None


def _in_sample(profile, runs) -> int:
    """How many of `runs` the profile was fitted to (its provenance notes name them)."""
    from models.fit import fitted_run_ids

    ids = fitted_run_ids(profile)
    return sum(1 for r in runs if r.run_id in ids)


@click.command()
@click.option("--runs", "run_paths", multiple=True, type=click.Path(dir_okay=False),
              help="JSONL of run records (data/runs/*.jsonl); repeatable.")
@click.option("--store", "store_path", type=click.Path(dir_okay=False), default=None, help="SQLite run store to read too.")
@click.option("--profile", required=True, help="Profile to evaluate: shipped name or JSON path.")
@click.option("--loo", is_flag=True, help="Refit from --profile without each run in turn (the honest error).")
@click.option("--prior-strength", "prior_text", default="cv", show_default=True,
              help="With --loo: as for advisor fit.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write the predicted-against-measured plot (PNG) here.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def report(run_paths, store_path, profile, loo, prior_text, plot_path, as_json):
    """Accuracy of a profile on measured runs: step time and GPU energy MAPE, worst error, rank
    correlation, memory, per strategy family, against the targets."""
    from advisor.accuracy import accuracy_report, compare_as_is, format_report
    from advisor.inputs import usable_cores
    from advisor.outputs import output_file
    from advisor.refit import refit, to_stderr
    from models.profile import load_profile

    if plot_path and not plot_path.lower().endswith(".png"):
        raise click.UsageError(f"bad --plot '{plot_path}': the plot is a PNG, name it FILE.png")
    prior = _prior(prior_text)
    prof = load_profile(profile)
    if plot_path:  # before the work, so its result is not lost
        output_file(plot_path, "--plot", reads=_inputs(run_paths, store_path, profile))
    run_set = _run_set(run_paths, store_path)
    if loo:
        done = refit(run_set.runs, prof, prior, jobs=usable_cores(), progress=to_stderr)
        result = accuracy_report(done.report.compared, f"leave-one-out, prior strength {done.prior_strength:g}",
                                 done.base.describe())
        note = ""
    else:
        seen = _in_sample(prof, run_set.runs)
        mode = f"as-is, in-sample: the profile was fitted to {seen} of these runs" if seen else "as-is"
        result = accuracy_report(compare_as_is(run_set.runs, prof), mode, prof.describe())
        note = " (use --loo for the error on unseen runs)" if seen else ""
    if plot_path:
        from advisor.plot import accuracy_plot

        accuracy_plot(result, plot_path)
    if as_json:
        click.echo(json.dumps({**result.to_dict(), "runs_summary": _runs_summary(run_set), "plot": plot_path}))
        return
    click.echo(f"{run_set.summary()}{note}")
    click.echo(format_report(result))
    if plot_path:
        click.echo(f"plot: {plot_path}")
