"""`advisor fit` and `advisor report`: refine a profile from measured runs, and show how well a
profile predicts them.

Loaded lazily by advisor.cli. Runs come from JSONL files (`data/runs/*.jsonl`) and/or the run
store; failed runs (oom, crash, timeout) are counted and left out.
"""
from __future__ import annotations

import json
from pathlib import Path

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


def _write_profile(profile, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(profile.to_json() + "\n")
    tmp.replace(out)


def _write_residual(model, runs, path: Path, profile_path: Path) -> None:
    """Residual models of step time and GPU energy on the fitted profile, with what they saw."""
    from models.fit import RunEvaluator
    from models.residual import ResidualModel

    predictions = RunEvaluator(runs)(model.profile_)
    models = {}
    for metric in ("step_time_s", "gpu_energy_j"):
        try:
            models[metric] = ResidualModel(metric).fit(runs, predictions).to_dict()
        except ValueError as exc:
            models[metric] = {"not_fitted": str(exc)}
    data = {"kind": "energy-advisor residual model", "version": 1, "profile": str(profile_path),
            "run_ids": [r.run_id for r in runs], "models": models,
            "note": "Gaussian process on log(measured / predicted) of the fitted profile's in-sample predictions; "
                    "the band is at 'level'. Fitted on in-sample residuals, which are smaller than on new runs: "
                    "advisor fit --residual reports how often the band held, leave-one-out."}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


def _parameter_rows(model) -> list[dict]:
    return [{"name": f.name, "fitted_to": f.kind, "start": f.start, "value": f.value, "std": f.std,
             "informed": f.informed} for f in model.parameters_.values()]


def _format_parameters(rows: list[dict], fragmentation: dict, host_process_gib: float | None) -> str:
    lines = [f"{'constant':<44}{'start':>11}{'fitted':>11}{'+-':>10}  note"]
    for r in rows:
        std = "-" if r["std"] is None else f"{r['std']:.3g}"
        note = f"fitted to {r['fitted_to']}" if r["informed"] else "kept: no run responds to it"
        lines.append(f"{r['name']:<44}{r['start']:>11.4g}{r['value']:>11.4g}{std:>10}  {note}")
    for name, (value, count) in (fragmentation or {}).items():
        lines.append(f"{name:<44}{'':>11}{value:>11.4g}{'-':>10}  median reserved/allocated - 1 ({count} runs)")
    if host_process_gib is not None:
        lines.append(f"{'memory.host_process_per_rank':<44}{'':>11}{host_process_gib:>11.4g}{'-':>10}  "
                     "median host GiB per rank, runs without offload")
    return "\n".join(lines)


def _runs_summary(run_set) -> dict:
    return {"used": len(run_set.runs), "failed": run_set.failed, "unusable": run_set.skipped,
            "repeats_dropped": run_set.duplicates}


@click.command()
@click.option("--runs", "run_paths", multiple=True, type=click.Path(dir_okay=False),
              help="JSONL of run records (data/runs/*.jsonl); repeatable.")
@click.option("--store", "store_path", type=click.Path(dir_okay=False), default=None, help="SQLite run store to read too.")
@click.option("--profile", required=True, help="Profile to start from: shipped name or JSON path.")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False, writable=True),
              help="Where to write the fitted profile (JSON).")
@click.option("--loo/--no-loo", default=True, show_default=True,
              help="Report leave-one-out error (one refit per run; about a second each).")
@click.option("--prior-strength", "prior_text", default="cv", show_default=True,
              help="How strongly constants stay at their starting values: a number, or 'cv' to pick "
                   "0.001, 0.01 or 0.1 by 5-fold cross-validation.")
@click.option("--residual/--no-residual", default=False, show_default=True,
              help="Also check a scikit-learn residual model and its 90% band, leave-one-out.")
@click.option("--residual-out", "residual_out", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write the residual models (step time, GPU energy) fitted to all runs here (JSON).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def fit(run_paths, store_path, profile, out_path, loo, prior_text, residual, residual_out, as_json):
    """Fit the profile's efficiency, overlap, overhead and power constants to measured runs and
    write the refined profile; print leave-one-out error per strategy family."""
    from advisor.accuracy import (
        accuracy_report,
        compare_held_out,
        format_report,
        residual_check,
    )
    from models.fit import ProfileFit, prefit_profile
    from models.validation import leave_one_out
    from models.profile import load_profile

    run_set = _run_set(run_paths, store_path)
    base = prefit_profile(load_profile(profile))
    strength, scores = _prior_strength(prior_text, run_set.runs, base)
    note = _sources(run_paths, store_path)
    if scores:
        note += "; prior strength chosen by cross-validation, mean |log error| " + ", ".join(
            f"{k:g}: {v:.3f}" for k, v in scores.items())
    model = ProfileFit(prior_strength=strength, data_note=note).fit(run_set.runs, base)
    out = Path(out_path)
    _write_profile(model.profile_, out)
    rows = _parameter_rows(model)
    if residual_out:
        _write_residual(model, run_set.runs, Path(residual_out), out)
    report = checks = None
    if loo:
        held = leave_one_out(run_set.runs, base, estimator=model, full_fit=model)
        report = accuracy_report(compare_held_out(held), "leave-one-out", base.describe())
        if residual:
            checks = [c for c in (residual_check(held, m) for m in ("step_time_s", "gpu_energy_j")) if c]
    if as_json:
        click.echo(json.dumps({
            "profile_out": str(out), "base_profile": base.describe(), "runs": _runs_summary(run_set),
            "prior_strength": strength, "cross_validation": {str(k): v for k, v in scores.items()},
            "parameters": rows, "fragmentation": {k: v for k, (v, _) in (model.fragmentation_ or {}).items()}, "host_process_per_rank_gib": model.host_process_,
            "leave_one_out": report.to_dict() if report else None,
            "residual": [vars(c) for c in checks] if checks is not None else None,
        }))
        return
    click.echo(f"Fitted {base.describe()} to {run_set.summary()}; wrote {out}")
    if scores:
        click.echo("prior strength by 5-fold cross-validation (mean |log error|): "
                   + ", ".join(f"{k:g}: {v:.3f}" for k, v in scores.items()) + f"; chose {strength:g}")
    for line in run_set.skipped:
        click.echo(f"  unusable: {line}")
    click.echo(_format_parameters(rows, model.fragmentation_, model.host_process_))
    if report:
        click.echo("")
        click.echo(format_report(report))
    for c in checks or []:
        click.echo(f"residual model, {c.metric} (leave-one-out, {c.n} runs): MAPE {c.mape_before:.1%} -> "
                   f"{c.mape_after:.1%}, worst {c.max_after:.1%}; {c.level:.0%} band held {c.coverage:.0%}, "
                   f"median half-width {c.median_half_width:.1%}")


def _prior_strength(text: str, runs, base) -> tuple[float, dict]:
    """A number as given, or 'cv': chosen by cross-validation (with 4 runs or more)."""
    from models.fit import ProfileFit
    from models.validation import choose_prior_strength

    if text != "cv":
        try:
            value = float(text)
        except ValueError:
            raise click.UsageError(f"bad --prior-strength '{text}': give a number >= 0 or 'cv'") from None
        if value < 0:
            raise click.UsageError(f"bad --prior-strength '{text}': give a number >= 0 or 'cv'")
        return value, {}
    if len(runs) < 4:
        return ProfileFit().prior_strength, {}
    return choose_prior_strength(runs, base)


def _in_sample(profile, runs) -> int:
    """How many of `runs` the profile was fitted to (its provenance notes name them)."""
    from models.fit import fitted_run_ids

    ids = fitted_run_ids(profile)
    return sum(1 for r in runs if r.run_id in ids)


def accuracy_plot(report, path: str | Path) -> Path:
    """Predicted against measured step time, GPU energy and allocated memory, log-log, by family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    panels = (("time", "step time (s)", lambda c: (c.run.step_time_s, c.step_time_s)),
              ("energy", "GPU energy per step (J)", lambda c: (c.run.gpu_energy_j, c.gpu_energy_j)),
              ("memory", "GPU memory allocated (GiB)", lambda c: (c.run.peak_gpu_mem_gib, c.allocated_gpu_mem_gib)))
    families = sorted({c.run.family for c in report.compared})
    colors = {f: plt.cm.tab10(i % 10) for i, f in enumerate(families)}
    fig, axes = plt.subplots(1, 3, figsize=(15, 5), dpi=110)
    overall = report.families[0]
    for ax, (metric, title, pick) in zip(axes, panels):
        points = [(c.run.family, *pick(c)) for c in report.compared if pick(c)[0]]
        for family in families:
            xs = [m for f, m, p in points if f == family]
            ys = [p for f, m, p in points if f == family]
            if xs:
                ax.scatter(xs, ys, s=22, color=colors[family], label=family)
        if points:
            lo = min(min(m, p) for _, m, p in points) * 0.8
            hi = max(max(m, p) for _, m, p in points) * 1.25
            ax.plot([lo, hi], [lo, hi], color="0.3", linewidth=1)
            for band, style in ((0.05, ":"), (0.15, "--")):
                ax.plot([lo, hi], [lo * (1 + band), hi * (1 + band)], style, color="0.6", linewidth=0.8)
                ax.plot([lo, hi], [lo * (1 - band), hi * (1 - band)], style, color="0.6", linewidth=0.8)
            ax.set_xscale("log")
            ax.set_yscale("log")
            for axis in (ax.xaxis, ax.yaxis):  # minor labels collide on short ranges
                axis.set_minor_formatter(NullFormatter())
        stats = getattr(overall, metric)
        mape = "-" if stats.mape is None else f"{stats.mape:.1%}"
        ax.set_title(f"{title}: MAPE {mape}", fontsize=10)
        ax.set_xlabel("measured")
        ax.set_ylabel("predicted")
        ax.grid(True, alpha=0.3, which="both")
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"Predicted against measured ({report.mode}), {report.profile}; lines: equal, 5%, 15%", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


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
    from advisor.accuracy import (
        accuracy_report,
        compare_as_is,
        compare_held_out,
        format_report,
    )
    from models.fit import ProfileFit, prefit_profile
    from models.validation import leave_one_out
    from models.profile import load_profile

    if plot_path and not plot_path.lower().endswith(".png"):
        raise click.UsageError(f"bad --plot '{plot_path}': the plot is a PNG, name it FILE.png")
    run_set = _run_set(run_paths, store_path)
    prof = load_profile(profile)
    if loo:
        base = prefit_profile(prof)
        strength, _ = _prior_strength(prior_text, run_set.runs, base)
        held = leave_one_out(run_set.runs, base, estimator=ProfileFit(prior_strength=strength))
        result = accuracy_report(compare_held_out(held), f"leave-one-out, prior strength {strength:g}", base.describe())
        note = ""
    else:
        seen = _in_sample(prof, run_set.runs)
        mode = f"as-is, in-sample: the profile was fitted to {seen} of these runs" if seen else "as-is"
        result = accuracy_report(compare_as_is(run_set.runs, prof), mode, prof.describe())
        note = " (use --loo for the error on unseen runs)" if seen else ""
    if plot_path:
        accuracy_plot(result, plot_path)
    if as_json:
        click.echo(json.dumps({**result.to_dict(), "runs_summary": _runs_summary(run_set), "plot": plot_path}))
        return
    click.echo(f"{run_set.summary()}{note}")
    click.echo(format_report(result))
    if plot_path:
        click.echo(f"plot: {plot_path}")
