"""The accuracy report as Markdown (docs/ACCURACY.md): how well a shipped profile predicts the shipped runs.

    python benchmarks/accuracy.py --markdown > docs/ACCURACY.md

Nothing is refitted, so it takes seconds, not the hours of a leave-one-out. It reads:
- the profile's stored fit report (`NAME.fit-report.json`, written by `advisor fit`): the errors of its
  cross-validation, each run predicted by a profile fitted without it, the targets, and the band;
- the shipped runs (`data/runs/`) predicted by the profile as shipped: in-sample for the runs it was
  fitted to, out of sample for the others, and whether those fall inside the band;
- the predictions committed before their runs (`data/sweeps/*.predicted.jsonl`, `committed_predictions.py`);
- GPU and host memory of every shipped run.
The page states its date, the machine that made it and the commit it was made at.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import band_coverage  # noqa: E402
import committed_predictions  # noqa: E402
import host_memory_accuracy  # noqa: E402
from advisor.accuracy import accuracy_report, compare_as_is  # noqa: E402
from models.band import load_band  # noqa: E402
from models.fit import fitted_run_ids  # noqa: E402
from models.predict import predict  # noqa: E402
from models.profile import load_profile, profile_path  # noqa: E402
from runs.measured import (default_allocator_reserved_gib, gather_records, run_files, shipped_run_files,  # noqa: E402
                           to_measured_run, to_run_set)

COMMAND = "python benchmarks/accuracy.py --markdown > docs/ACCURACY.md"


def fit_report_path(name: str) -> Path:
    """The profile's stored fit report: beside the profile, else in data/profiles/."""
    beside = profile_path(name).with_suffix(".fit-report.json")
    return beside if beside.exists() else REPO / "data" / "profiles" / f"{Path(name).stem}.fit-report.json"


def provenance() -> str:
    """When, where and at which commit this page was made."""
    cpu = platform.processor() or platform.machine()
    try:
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                timeout=30).stdout.strip() or "not a git checkout"
    except (OSError, subprocess.SubprocessError):
        commit = "not a git checkout"
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"Made on {now} by `{COMMAND}` at commit {commit}, on {platform.system()} {platform.machine()} "
            f"({cpu}, {os.cpu_count()} cores), Python {platform.python_version()}, no GPU needed.")


def pct(x, signed=False) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{100 * x:+.1f}%" if signed else f"{100 * x:.1f}%"


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]


def stats_cells(row: dict) -> list[str]:
    """MAPE / worst of time, energy, allocated memory and the pool, from a report row (`AccuracyReport.to_dict`)."""
    cells = []
    for key in ("step_time", "gpu_energy", "allocated_gpu_mem", "reserved_gpu_mem"):
        s = row[key]
        cells.append(f"{pct(s['mape'])} / {pct(s['max_abs_error'])}" if s["n"] else "-")
    return cells


ERROR_HEAD = ["step time MAPE / worst", "GPU energy MAPE / worst", "allocated memory MAPE / worst",
              "reserved pool MAPE / worst"]


def held_out_section(report: dict, name: str, path: Path) -> list[str]:
    held = report["held_out"]
    runs = report["runs"]
    out = [f"## Held out: {held['mode']} of the fit ({runs['used']} runs)", "",
           f"Each run predicted by `{name}` refitted without its fold, by `advisor fit --folds 5`; from the stored "
           f"report `{path.relative_to(REPO) if path.is_relative_to(REPO) else path}`, fitted from {report['base_profile']}. "
           f"A setting measured more than once counts once, at the geometric mean of its runs "
           f"({runs['repeats_averaged']} repeats averaged). The honest error of the model on settings like its fitted ones.", ""]
    out += table(["target", "held out", "limit", "verdict"],
                 [[t["name"], pct(t["value"]), ("< " if t["name"].startswith("worst step") or
                                                t["name"].startswith("worst GPU") else "<= ") + pct(t["limit"]),
                   t["verdict"]] for t in held["targets"]])
    out += ["", "By slice and by strategy family (MAPE / worst |error|):", ""]
    rows = [[f["family"], str(f["n"]), *stats_cells(f)] for f in held["families"][:1] + held["slices"] + held["families"][1:]]
    out += table(["runs", "n", *ERROR_HEAD], rows)
    overall = held["families"][0]
    out += ["", "The worst runs: " + "; ".join(f"{what} {overall[key]['worst_run']}" for what, key in
                                              (("time", "step_time"), ("energy", "gpu_energy"),
                                               ("allocated memory", "allocated_gpu_mem"), ("pool", "reserved_gpu_mem"))) + "."]
    worst = sorted((r for r in held["ranking"] if r["regret"]), key=lambda r: -r["regret"])[:5]
    if worst:
        out += ["", f"The least-predicted-energy pick against the least measured, in {len(held['ranking'])} groups of "
                    "alternatives measured on one machine kind (the five worst):", ""]
        out += table(["group", "runs", "picked", "best measured", "regret"],
                     [[r["group"], str(r["n"]), r["pick"], r["best"], pct(r["regret"])] for r in worst])
    return out


def band_section(band: dict) -> list[str]:
    def span(b):
        return f"x{math.exp(b['low_log']):.2f}-{math.exp(b['high_log']):.2f}"

    out = ["## The 90% band", "",
           f"From the same folds ({band['source']}; split-conformal, by the share of the step on the host: under a fifth "
           "is GPU-bound). The fraction of held-out runs inside is the band's own check; 85-95% is calibrated.", ""]
    rows = []
    for regime, label in (("gpu_bound", "GPU-bound steps"), ("host_bound", "host-bound steps")):
        r = band["regimes"][regime]
        rows.append([label, str(r["step_time_s"]["runs"]), span(r["step_time_s"]), span(r["gpu_energy_j"]),
                     pct(r["step_time_s"]["loo_coverage"])])
    pool = band.get("reserved_gpu_mem_gib")
    if pool:
        rows.append(["torch's pool (every step)", str(pool["runs"]), "-", "-", pct(pool["loo_coverage"])])
        rows[-1][2] = f"pool {span(pool)}"
    out += table(["steps", "runs", "step time", "GPU energy", "held-out runs inside"], rows)
    return out


def shipped_section(profile, name: str) -> list[str]:
    runs = to_run_set(gather_records(shipped_run_files(with_excluded=False))).runs
    fitted = fitted_run_ids(profile)
    inside = [r for r in runs if r.run_id in fitted]
    outside = [r for r in runs if r.run_id not in fitted]
    out = ["## The shipped runs, predicted by the shipped profile", "",
           f"`{name}` as shipped, each run at the host its probes measured, as `advisor report` predicts. The runs it was "
           "fitted to are in-sample; the others were made after the fit (their predictions committed first) or kept "
           "out of it, so they are out of sample.", ""]
    rows = []
    for label, members in (("in the fit (in-sample)", inside), ("outside the fit", outside)):
        if not members:
            continue
        rep = accuracy_report(compare_as_is(members, profile), "as-is", name).to_dict()
        for f in rep["families"][:1] + [s for s in rep["slices"] if s["family"] in ("GPU-bound steps", "host-bound steps")]:
            rows.append([label if f["family"] == "all" else f"{label}: {f['family']}", str(f["n"]), *stats_cells(f)])
    out += table(["runs", "n", *ERROR_HEAD], rows)
    return out


def coverage_section(profile, name: str) -> list[str]:
    band, why_not = load_band(profile_path(name), profile.to_json())
    if band is None:
        return ["## The band on runs outside the fit", "", f"No band: {why_not}"]
    timed, pooled = band_coverage.unfitted_runs(shipped_run_files(), profile)
    rows = band_coverage.coverage_rows(timed, pooled, profile, band)
    out = ["## The band on runs outside the fit", "",
           "The shipped runs the profile was not fitted to, against the band a user's prediction would take "
           "(`python benchmarks/band_coverage.py`). Where their share inside falls under the folds', the band is "
           "narrower than new settings' errors: read it as the model's error on settings like its fitted ones.", ""]
    out += table(["metric", "regime", "runs", "inside", "share", "below", "above"],
                 [[r.metric, r.regime, str(r.runs), str(r.inside), pct(r.share), str(r.below), str(r.above)] for r in rows])
    return out


def committed_section() -> list[str]:
    records = committed_predictions.shipped_records()
    results = [committed_predictions.sweep_errors(p, records)
               for p in sorted((REPO / "data" / "sweeps").glob("*.predicted.jsonl"))]
    results = [r for r in results if r["measured"]]
    names = [name for name, _, _ in committed_predictions.METRICS]
    pooled = {n: [run["errors_pct"][n] for r in results for run in r["runs"] if run["errors_pct"][n] is not None]
              for n in names}
    out = ["## Predictions committed before their runs", "",
           "Each sweep's predictions were committed to git before its device call, by the model and profile of that "
           "commit; each is matched with the first run made after it (`python benchmarks/committed_predictions.py`). "
           "The oldest rows predate most of the model. A sweep predicted twice (`-before-...`) shows the model "
           "before and after a change made while looking at its runs. Errors in %, MAPE / worst.", ""]

    def cell(s):
        return f"{s['mape_pct']:.1f} / {s['worst_pct']:+.1f}" if s else "-"

    rows = [[r["sweep"], f"{r['measured']} of {r['predicted']}", *[cell(r["summary"][n]) for n in names]] for r in results]
    rows.append(["**all of them**", str(sum(r["measured"] for r in results)),
                 *[f"{np.mean(np.abs(v)):.1f} / {max(v, key=abs):+.1f}" if v else "-" for v in pooled.values()]])
    out += table(["sweep", "runs", *names], rows)
    return out


def memory_section(profile) -> list[str]:
    allocated, reserved = [], []
    for record in gather_records(run_files(None)):
        try:
            run = to_measured_run(record)
        except ValueError:
            continue
        if run.peak_gpu_mem_gib is None:
            continue
        p = predict(run.workload, run.strategy, profile)
        allocated.append((p.allocated_gpu_mem_gib - run.peak_gpu_mem_gib) / run.peak_gpu_mem_gib)
        pool = default_allocator_reserved_gib(record.result)
        if pool:
            reserved.append((p.reserved_gpu_mem_gib - pool) / pool)
    out = ["## Memory of every shipped run", "",
           "GPU memory against `torch.cuda.max_memory_allocated` and torch's pool against `max_memory_reserved` "
           "(`python benchmarks/memory_accuracy.py --reserved`), the runs kept out of the time fit included; host "
           "memory of the runs that keep states on the CPU against the processes' peak "
           "(`python benchmarks/host_memory_accuracy.py`).", ""]
    rows = []
    for label, errors in (("GPU, allocated", allocated), ("GPU, torch's pool (default allocator)", reserved)):
        e = np.array(errors)
        if len(e):
            rows.append([label, str(len(e)), pct(float(np.abs(e).mean())), f"{pct(float(e.min()), True)} to {pct(float(e.max()), True)}",
                         str(int((np.abs(e) <= 0.10).sum()))])
    groups: dict[str, list[float]] = {}
    for path, members in sorted(host_memory_accuracy.host_memory_groups(run_files(None), profile).items()):
        for _, meas, pred, by in members:
            # SuperOffload's worker shares its rank's pages: only the proportional set size counts them once
            name = f"{path}, resident sum (shared pages twice)" if path == "SuperOffload" and by == "hwm" else path
            groups.setdefault(name, []).append((pred - meas) / meas)
    for path, errors in groups.items():
        e = np.array(errors)
        rows.append([f"host, {path}", str(len(e)), pct(float(np.abs(e).mean())),
                     f"{pct(float(e.min()), True)} to {pct(float(e.max()), True)}", str(int((np.abs(e) <= 0.10).sum()))])
    out += table(["memory", "runs", "MAPE", "errors", "within 10%"], rows)
    return out


def markdown(name: str = "h200") -> str:
    profile = load_profile(name)
    path = fit_report_path(name)
    report = json.loads(path.read_text())
    lines = [f"# Accuracy of the `{name}` profile", "",
             "<!-- Generated: do not edit by hand. Regenerate with the command below. -->", "",
             provenance(), "",
             f"Profile: {profile.describe()}. Targets: step time and GPU energy MAPE <= 5%, worst < 15%; allocated "
             "memory within 10%; the least-predicted-energy pick within 3% of the least measured. How the numbers came "
             "to be, experiment by experiment, is in `docs/MEASUREMENTS.md`.", ""]
    for section in (held_out_section(report, name, path), band_section(report["band"]), shipped_section(profile, name),
                    coverage_section(profile, name), committed_section(), memory_section(profile)):
        lines += section + [""]
    return "\n".join(lines)
