"""Predictions committed before the runs they predict, against those runs: one row per sweep.

    python benchmarks/committed_predictions.py [--json] [--threads]

`--threads` prints the thread test instead: each CPU-offload run measured at one thread a rank and
at more on the same machine, both predicted before they ran; it passes where both are within 15%.
`--on-probed-host NAME` predicts sweep NAME's runs again with the profile as committed beside its
predictions, each run on the host its probe measured (`HardwareProfile.on_host`), with today's model
code: what the host probe adds to the committed profile.

Each `data/sweeps/NAME.predicted.jsonl` was committed before its runs were made (git log shows
the order); its keys are matched with the first measured record made after that commit, in
`data/runs/` (the fit's files and `excluded/`). These are
the out-of-sample errors of the model as it stood at that commit, apart from leave-one-out
(benchmarks/accuracy.py). Errors are 100 (predicted - measured) / measured. The reserved pool is
compared where torch's allocator ran as by default (`runs.measured.default_allocator_reserved_gib`).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from runs.jsonl import read_records  # noqa: E402
from runs.measured import default_allocator_reserved_gib, shipped_run_files  # noqa: E402

THREAD_TEST_BOUND_PCT = 15.0  # issue #12: each of the pair predicted within 15%
# (column, prediction's field, the measured figure of a record's result)
METRICS = (("step time", "step_time_s", lambda r: r.step_time_s), ("GPU energy", "gpu_energy_j", lambda r: r.gpu_energy_j),
           ("allocated memory", "allocated_gpu_mem_gib", lambda r: r.peak_gpu_mem_gib),
           ("reserved pool", "reserved_gpu_mem_gib", default_allocator_reserved_gib))


def shipped_records() -> list:
    """Every ok record of the shipped run files, those kept out of the fit (data/runs/excluded/) too, and
    the runs of other machines (data/runs/MACHINE/, e.g. h100/)."""
    other_machines = sorted(p for p in (REPO / "data" / "runs").glob("*/*.jsonl") if p.parent.name != "excluded")
    return [r for path in [*shipped_run_files(), *other_machines] for r in read_records(path) if r.result.status == "ok"]


def sweep_name(predicted_path: Path) -> str:
    """NAME for NAME.predicted.jsonl; "NAME (PROFILE)" for NAME.predicted-PROFILE.jsonl, one sweep's runs
    predicted by another profile, committed before them too."""
    name, _, by = predicted_path.name.removesuffix(".jsonl").partition(".predicted")
    return f"{name} ({by.lstrip('-')})" if by else name


def first_commit(path: Path) -> tuple[str, datetime] | None:
    """The commit that first added the file, and when; None outside a git checkout."""
    try:
        out = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H %cI", "--", path.name], cwd=path.parent,
                             capture_output=True, text=True, timeout=30).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return (out[-2], datetime.fromisoformat(out[-1])) if out else None


def committed_at(path: Path) -> datetime | None:
    """When git first saw the file; None outside a git checkout."""
    first = first_commit(path)
    return first[1] if first else None


def made_after(records: list, since: datetime | None) -> list:
    """The records made after the predictions were committed (all of them outside git), by date."""
    return sorted((r for r in records if since is None or datetime.fromisoformat(r.date) >= since),
                  key=lambda r: r.date)


def first_run(runs_by_date: list, row: dict):
    """The first run of this key (or label: sweeps predicted before a run key changed, 2026-11-30):
    a run measured again later does not replace the one that was predicted."""
    return (next((r for r in runs_by_date if r.key == row["key"]), None)
            or next((r for r in runs_by_date if r.candidate.label == row["label"]), None))


def machine_of(record) -> str:
    """The lent machine a run was made on: its note where it names one, else its day and host size."""
    named = [n for n in record.notes if n.startswith("lent ")]
    if named:
        return named[-1].split(" (data/runs")[0].split(",")[0].split(" UTC")[0]
    return f"{record.date[:10]}, {record.result.machine.get('cpu_count', '?')}-core host"


def thread_pairs(results: list[dict], bound_pct: float = THREAD_TEST_BOUND_PCT) -> list[dict]:
    """Offload runs of one setting on one machine at one thread and at the most threads measured."""
    groups: dict[tuple, dict[int, dict]] = {}
    for res in results:
        for run in res["runs"]:
            if run["offload"] and run["threads"] and run["errors_pct"]["step time"] is not None:
                stem = re.sub(r" \d+ ?thr(?:eads?)?$", "", run["label"])  # "16thr", "16 threads"
                groups.setdefault((stem, run["machine"]), {})[run["threads"]] = run
    pairs = []
    for (stem, machine), by_threads in sorted(groups.items()):
        most = max(by_threads)
        if 1 not in by_threads or most == 1:
            continue
        one, many = by_threads[1], by_threads[most]
        errors = (one["errors_pct"]["step time"], many["errors_pct"]["step time"])
        pairs.append({"setting": stem, "machine": machine, "threads": [1, most],
                      "measured_s": [one["step_time_s"], many["step_time_s"]], "errors_pct": list(errors),
                      "passes": all(abs(e) <= bound_pct for e in errors)})
    return pairs


def sweep_errors(predicted_path: Path, records: list) -> dict:
    rows = [json.loads(line) for line in predicted_path.read_text().splitlines() if line.strip()]
    after = made_after(records, committed_at(predicted_path))
    runs = []
    for row in rows:
        record = first_run(after, row)
        if record is None or not row.get("prediction"):
            continue
        errors = {}
        for name, pkey, measured in METRICS:
            p, m = row["prediction"].get(pkey), measured(record.result)
            errors[name] = None if p is None or not m else 100.0 * (p - m) / m
        strategy = record.candidate.strategy or {}
        runs.append({"label": row["label"], "errors_pct": errors, "threads": record.result.cpu_threads_per_rank,
                     "offload": strategy.get("offload_optimizer") == "cpu", "machine": machine_of(record),
                     "step_time_s": record.result.step_time_s})
    summary = {}
    for name, _, _ in METRICS:
        values = [r["errors_pct"][name] for r in runs if r["errors_pct"][name] is not None]
        summary[name] = ({"mape_pct": sum(map(abs, values)) / len(values), "worst_pct": max(values, key=abs)}
                         if values else None)
    return {"sweep": sweep_name(predicted_path), "predicted": len(rows), "measured": len(runs), "summary": summary,
            "runs": runs}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    p.add_argument("--threads", action="store_true", help="the thread test: offload runs at 1 thread and more")
    p.add_argument("--on-probed-host", metavar="NAME", help="sweep NAME's runs predicted again on their probed hosts")
    args = p.parse_args(argv)
    records = shipped_records()
    if args.on_probed_host:
        return show_on_probed_host(REPO / "data" / "sweeps" / f"{args.on_probed_host}.predicted.jsonl", records,
                                   args.json)
    results = [sweep_errors(path, records) for path in sorted((REPO / "data" / "sweeps").glob("*.predicted*.jsonl"))]
    if args.threads:
        return show_thread_test(thread_pairs(results), args.json)
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    table = Table(title="Predictions committed before the runs (MAPE / worst, %)")
    table.add_column("sweep", no_wrap=True)
    table.add_column("runs", justify="right")
    for name, _, _ in METRICS:
        table.add_column(name, justify="right")
    for res in results:
        cells = [f"{s['mape_pct']:.1f} / {s['worst_pct']:+.1f}" if s else "-" for s in res["summary"].values()]
        table.add_row(res["sweep"], f"{res['measured']} of {res['predicted']}", *cells)
    console = Console(width=max(150, Console().width))
    console.print(table)
    if any(not res["measured"] for res in results):
        console.print("A sweep with no run matched predates the run labels of today's records: "
                      "benchmarks/scale_out.py reads its pre-run predictions from the records themselves.")
    return 0


def profile_at(commit: str) -> str:
    """The h200 profile's text at a commit: in data/profiles/ until the profiles became package data."""
    for path in ("models/profiles/h200.json", "data/profiles/h200.json"):
        shown = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=REPO, capture_output=True, text=True, timeout=30)
        if shown.returncode == 0:
            return shown.stdout
    raise FileNotFoundError(f"no h200 profile at {commit[:7]}")


def show_on_probed_host(predicted_path: Path, records: list, as_json: bool) -> int:
    from models.predict import predict
    from models.profile import parse_profile
    from runs.measured import to_measured_run

    if not predicted_path.exists():
        print(f"no such sweep: {predicted_path.name}", file=sys.stderr)
        return 2
    first = first_commit(predicted_path)
    if first is None:
        print(f"{predicted_path.name} is not committed: no profile to predict with", file=sys.stderr)
        return 2
    commit, since = first
    profile = parse_profile(json.loads(profile_at(commit)), origin=f"h200 at {commit[:7]}")
    after = made_after(records, since)
    rows = []
    for line in predicted_path.read_text().splitlines():
        row = json.loads(line)
        record = first_run(after, row)
        if record is None:
            continue
        run = to_measured_run(record)
        again = predict(run.workload, run.strategy, profile.on_host(run.host_issue_per_layer_s))
        rows.append({"label": row["label"], "measured_s": run.step_time_s,
                     "probe_us": run.host_issue_per_layer_s * 1e6 if run.host_issue_per_layer_s else None,
                     "committed_pct": 100.0 * (row["prediction"]["step_time_s"] / run.step_time_s - 1),
                     "on_probed_host_pct": 100.0 * (again.step_time_s / run.step_time_s - 1),
                     "energy_committed_pct": 100.0 * (row["prediction"]["gpu_energy_j"] / run.gpu_energy_j - 1),
                     "energy_on_probed_host_pct": 100.0 * (again.gpu_energy_j / run.gpu_energy_j - 1)})
    if as_json:
        print(json.dumps({"sweep": predicted_path.name, "profile_commit": commit, "runs": rows}, indent=1))
        return 0
    table = Table(title=f"{predicted_path.name}: committed (profile {commit[:7]}) and on each run's probed host, "
                        "step time / GPU energy error %")
    for col in ("run", "measured s", "probe us", "committed", "on probed host"):
        table.add_column(col, justify="left" if col == "run" else "right")
    for r in rows:
        table.add_row(r["label"], f"{r['measured_s']:.3f}", f"{r['probe_us']:.0f}" if r["probe_us"] else "-",
                      f"{r['committed_pct']:+.1f} / {r['energy_committed_pct']:+.1f}",
                      f"{r['on_probed_host_pct']:+.1f} / {r['energy_on_probed_host_pct']:+.1f}")
    if rows:
        def mape(key):
            return sum(abs(r[key]) for r in rows) / len(rows)
        table.add_row("MAPE", "", "", f"{mape('committed_pct'):.1f} / {mape('energy_committed_pct'):.1f}",
                      f"{mape('on_probed_host_pct'):.1f} / {mape('energy_on_probed_host_pct'):.1f}")
    Console(width=max(120, Console().width)).print(table)
    return 0


def show_thread_test(pairs: list[dict], as_json: bool) -> int:
    if as_json:
        print(json.dumps(pairs, indent=1))
        return 0
    table = Table(title=f"The thread test: step time predicted before the runs, each within {THREAD_TEST_BOUND_PCT:.0f}%")
    for col in ("setting", "machine", "threads", "measured s", "error %", "verdict"):
        table.add_column(col, justify="right" if col in ("threads", "measured s", "error %") else "left")
    for pair in pairs:
        table.add_row(pair["setting"], pair["machine"], " / ".join(map(str, pair["threads"])),
                      " / ".join(f"{t:.2f}" for t in pair["measured_s"]),
                      " / ".join(f"{e:+.1f}" for e in pair["errors_pct"]), "pass" if pair["passes"] else "FAIL")
    Console(width=max(140, Console().width)).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
