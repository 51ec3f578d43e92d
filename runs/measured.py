"""Measured runs as the cost model sees them: stored run records in, `models.measured_run.MeasuredRun`s out.

Runs that failed (oom, crash, timeout) cannot be compared and are counted, not used; a
candidate measured twice counts once (the latest). This is the one place a record becomes a
run the fit and the accuracy report can use, so `advisor fit`, `advisor report`, `advisor
validate` and the benchmarks see the same runs.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from models.measured_run import MeasuredRun
from runs.jsonl import RunFileError, read_records
from runs.record import RunRecord, RunResult, geometric_mean, probed_issue_us, probes_read_window
from runs.store import RunStore

REPO_ROOT = Path(__file__).resolve().parents[1]
# Records made before the harness recorded its threads (2026-11-29): `advisor validate` gave each run a
# slot of 16 cores per GPU (32 cores on the 2-GPU host, 64 on the 4-GPU node) and each rank its
# slot's cores over its ranks: 16 threads in every shipped run.
LEGACY_THREADS_PER_RANK = 16
FAILED = ("oom", "crash", "timeout")


def _threads_ran_at(result: RunResult) -> int:
    """A run's CPU threads a rank: as its result records them, else the runner's rule before it did."""
    return result.cpu_threads_per_rank or LEGACY_THREADS_PER_RANK


def gather_records(paths: list[str | Path] = (), store: str | Path | None = None) -> list[RunRecord]:
    """Records from JSONL files (one RunRecord a line) and from a run store, in that order."""
    records = []
    for path in paths:
        records.extend(read_records(path))
    if store is not None:
        if not Path(store).exists():
            raise RunFileError(f"run store not found: {store}")
        with RunStore(store) as db:
            records.extend(db.runs())
    return records


@dataclass(frozen=True)
class RunSet:
    """The usable runs, and an account of every record that is not among them."""

    runs: list[MeasuredRun]
    failed: dict[str, int]  # status -> count (oom, crash, timeout): excluded
    skipped: list[str] = field(default_factory=list)  # ok records that cannot be used, and why
    repeats: int = 0  # ok records of a candidate measured more than once, averaged into one run

    def summary(self) -> str:
        parts = [f"{len(self.runs)} runs used"]
        if self.failed:
            parts.append("failed, not used: " + ", ".join(f"{n} {s}" for s, n in sorted(self.failed.items())))
        if self.skipped:
            parts.append(f"{len(self.skipped)} unusable")
        if self.repeats:
            parts.append(f"{self.repeats} repeated runs (averaged with their candidate's others)")
        return "; ".join(parts)


def _model_name(model: str) -> str:
    return Path(model).stem if model.endswith(".json") else model


def _label(c, strategy) -> str:
    """Sweep labels already start with the model and context; others get them."""
    name = _model_name(c.model)
    label = c.label or strategy.label()
    return label if label.startswith(name) else f"{name} {c.seq_len} {label}"


def to_measured_run(record: RunRecord) -> MeasuredRun:
    """One ok record as a MeasuredRun; ValueError saying why when it cannot be one."""
    from models.architecture import load_architecture
    from models.strategy import Strategy
    from models.workload import Workload

    c, r = record.candidate, record.result
    if r.status != "ok":
        raise ValueError(f"status {r.status}")
    if r.step_time_s is None or not r.step_time_s > 0:
        raise ValueError("no measured step time")
    if r.machine.get("gpu_memory_cap_gib"):
        # Its allocator freed and refilled its cache under the cap: neither its time nor its pool is the step's own.
        raise ValueError(f"GPU memory pool capped at {r.machine['gpu_memory_cap_gib']:g} GiB")
    arch = load_architecture(c.model)
    if c.strategy is not None:
        strategy = Strategy(**c.strategy)
        if not strategy.cpu_threads_per_rank:  # what the run had, where the record says or the runner's rule
            strategy = dataclasses.replace(strategy, cpu_threads_per_rank=_threads_ran_at(r))
    else:
        from models.ds_config import parse_ds_config, strategy_from_ds_config

        settings = parse_ds_config(c.ds_config, arch)
        strategy = strategy_from_ds_config(settings, gpus=c.gpus, gpus_per_node=c.gpus)
    workload = Workload(arch, c.seq_len, images=c.images, frames=c.frames, image_size=c.image_size,
                        train_vision=not c.freeze_vision, loss_dtype=c.loss_dtype)
    energy = r.gpu_energy_j if r.gpu_energy_j is not None and r.gpu_energy_j > 0 else None
    issue_us = probed_issue_us(r.host_probe, c.zero_stage)
    reserved = default_allocator_reserved_gib(r)
    allocated, host_peak = r.peak_gpu_mem_gib, r.peak_host_mem_gib
    if r.shared_process:
        # What the runs before it left stays: DeepSpeed's ZeRO-3 engines outlive engine.destroy() in a process
        # (the calibration's worker on a lent H100 held 10.8 GiB after its ZeRO-3 hook benchmark), so none of
        # its memory peaks is this run's own.
        allocated, reserved, host_peak = None, None, None
    return MeasuredRun(workload, strategy, float(r.step_time_s), energy, allocated,
                       reserved, host_peak, run_id=record.key, label=_label(c, strategy),
                       host_issue_per_layer_s=issue_us * 1e-6 if issue_us else None)


def default_allocator_reserved_gib(result: RunResult) -> float | None:
    """The run's reserved pool where torch's caching allocator ran as it does by default, the pool the
    model predicts; None where it was not measured or another allocator setting ran (expandable
    segments about halved the excess on H200: data/runs/README.md)."""
    return result.peak_gpu_reserved_gib if not result.machine.get("cuda_alloc_conf") else None


def mean_of_repeats(records: list[RunRecord]) -> RunRecord:
    """One record for a candidate measured more than once (date order): the geometric mean of the
    step times and of the GPU energies, the rest the latest's that ran torch's default allocator (whose
    pool the model predicts; a run with expandable segments repeats its step but not its pool), else the
    latest's. Repeats are the same step on other hosts of one kind, which ran host-bound steps 1.2-1.8x
    apart (2026-12-01); the model predicts the typical host, and one run per candidate keeps
    leave-one-out from meeting a twin of the run it left out. The host's issue time is the geometric
    mean of the repeats' probes too, and unknown unless every repeat probed its host."""
    default_allocator = [r for r in records if not r.result.machine.get("cuda_alloc_conf")]
    latest = (default_allocator or records)[-1]
    if len(records) == 1:
        return latest
    energies = [r.result.gpu_energy_j for r in records if r.result.gpu_energy_j]
    issues = [probed_issue_us(r.result.host_probe, r.candidate.zero_stage) for r in records]
    probe = {"issue_us_per_layer": geometric_mean(issues)} if all(issues) else None
    result = dataclasses.replace(latest.result, step_time_s=geometric_mean([r.result.step_time_s for r in records]),
                                 gpu_energy_j=geometric_mean(energies), host_probe=probe)
    return dataclasses.replace(latest, result=result)


# A lent machine's lease as run notes name it: "lent 1x H200 machine X of 2026-12-01 17:05-17:10 UTC".
_LEASE_NOTE = re.compile(r"machine(?: [A-Z]+)? of \d{4}-\d\d-\d\d(?: \d\d:\d\d-\d\d:\d\d)?")


def lease_of(record: RunRecord) -> str | None:
    """The one boot of one machine a run ran on: the boot id the harness records, or for runs made
    before it did (2026-12-02), the lease their notes name; None where neither says."""
    boot = record.result.machine.get("boot_id")
    if boot:
        return boot
    for note in record.notes:
        match = _LEASE_NOTE.search(note)
        if match:
            return match.group(0)
    return None


def lease_issue_us(records: list[RunRecord]) -> dict[str, float]:
    """Each lease's issue time (us a layer): the median of its runs' probes."""
    probes: dict[str, list[float]] = {}
    for record in records:
        lease, issue = lease_of(record), probed_issue_us(record.result.host_probe, record.candidate.zero_stage)
        if lease and issue:
            probes.setdefault(lease, []).append(issue)
    return {lease: statistics.median(values) for lease, values in probes.items()}


def on_lease_host(record: RunRecord, lease_us: dict[str, float]) -> RunRecord:
    """The record at the best measure of the host its window had: its own probes where they read the
    window (within it or on both sides); else its lease's issue time (`lease_issue_us`) where the lease
    probed its host; else unchanged.

    A lent host drifts within minutes: one lease ran the same 256-token step from 0.11 to 0.21 s in
    eleven minutes, whichever CPU it was pinned to (machine AD, 2026-12-02, data/runs/README.md). The
    mean of the probes on both sides of the window followed those steps (host-bound residuals against it:
    slope 0.73, correlation 0.72, 32 runs); a single probe taken before the model is built, tens of
    seconds earlier, hardly did (slope 0.14, 116 runs), and the lease's median was the better measure."""
    issue = lease_us.get(lease_of(record))
    zero_stage = record.candidate.zero_stage
    if (issue is None or not probed_issue_us(record.result.host_probe, zero_stage)
            or probes_read_window(record.result.host_probe, zero_stage)):
        return record
    probe = {**record.result.host_probe, "issue_us_per_layer": issue, "issue_us_per_layer_window_start": None,
             "issue_us_per_layer_after": None}
    return dataclasses.replace(record, result=dataclasses.replace(record.result, host_probe=probe))


def run_identity(record: RunRecord) -> str:
    """What makes two records repeats of one run: the record's key, with the threads it ran at where
    the candidate does not say. A candidate's key names its threads only where it set them, so a run
    made before runs set them (`LEGACY_THREADS_PER_RANK`) and the same run at that count set had two
    keys: two candidates to the fit and two strategies to the pick-regret check, which then compared
    a strategy with itself on two hosts (qwen2.5-1.5b 8k ZeRO-2 on 2 GPUs, 2026-11-29 and 12-01)."""
    c = record.candidate
    if c.strategy is None or c.strategy.get("cpu_threads_per_rank"):
        return record.key
    return dataclasses.replace(c, strategy={**c.strategy, "cpu_threads_per_rank": _threads_ran_at(record.result)}).key()


def unique_records(records: list[RunRecord]) -> list[RunRecord]:
    """One record a run: a record read from two files is one run."""
    return list({(r.key, r.date): r for r in records}.values())


def timed_on_their_hosts(unique: list[RunRecord]) -> list[RunRecord]:
    """The finished records that measured a step time, oldest first, each probed one at the best
    measure of its host (`on_lease_host`)."""
    timed = [r for r in unique if r.result.status == "ok" and (r.result.step_time_s or 0) > 0]
    lease_us = lease_issue_us(timed)
    return [on_lease_host(r, lease_us) for r in sorted(timed, key=lambda r: r.date)]


def to_run_set(records: list[RunRecord]) -> RunSet:
    """Usable runs of `records`: failed ones counted by status, repeats of a run (`run_identity`) averaged
    into one, each probed run at the best measure of its host (`on_lease_host`)."""
    unique = unique_records(records)
    failed = Counter(r.result.status for r in unique if r.result.status in FAILED)
    by_key: dict[str, list[RunRecord]] = {}
    timed = timed_on_their_hosts(unique)
    for record in timed:
        by_key.setdefault(run_identity(record), []).append(record)
    runs, skipped = [], [f"{r.key} {r.candidate.label}: no measured step time"
                         for r in unique if r.result.status == "ok" and not (r.result.step_time_s or 0) > 0]
    for repeats in by_key.values():
        record = mean_of_repeats(repeats)
        try:
            runs.append(to_measured_run(record))
        except (ValueError, KeyError, TypeError) as exc:
            skipped.append(f"{record.key} {record.candidate.label}: {exc}")
    return RunSet(runs, dict(failed), skipped, len(timed) - len(by_key))


# In the repository, not the wheel: 6.5 MB of evidence, read by the benchmarks and by a refit of a shipped profile.
SHIPPED_RUNS = REPO_ROOT / "data" / "runs"
# Runs kept out of the time and energy fit (data/runs/README.md says why); their memory is valid.
EXCLUDED_RUNS = SHIPPED_RUNS / "excluded"


def shipped_run_files(with_excluded: bool = True) -> list[Path]:
    """The shipped run files: those the profile is fitted to, and those kept out of the time fit
    (excluded/), whose memory and committed predictions are still checked."""
    kept_out = sorted(EXCLUDED_RUNS.glob("*.jsonl")) if with_excluded else []
    return kept_out + sorted(SHIPPED_RUNS.glob("*.jsonl"))


def add_runs_option(parser: argparse.ArgumentParser) -> None:
    """A benchmark's repeatable --runs option, whose globs `run_files` reads."""
    parser.add_argument("--runs", action="append", help="glob of run files (repeatable); default: the shipped runs")


def run_files(patterns: list[str] | None) -> list[Path]:
    """The files the globs match, sorted; where none is given, the shipped run files
    (`shipped_run_files`): what a benchmark's repeatable --runs option reads."""
    if not patterns:
        return shipped_run_files()
    return sorted(Path(f) for pattern in patterns for f in glob.glob(pattern))


class ShippedRunsMissing(ValueError):
    """A refit needs the runs its profile was fitted to, and this install has no checkout holding them."""


def require_shipped_runs(ids: set[str]) -> None:
    """Fail in one line where a refit wants the runs of `ids` (those no store holds) and the repository's
    data/runs is not here (an installed wheel): without them it would drop what the profile was fitted to."""
    if ids and not SHIPPED_RUNS.is_dir():
        raise ShippedRunsMissing(
            f"the {len(ids)} runs this profile was fitted to are kept in the advisor's repository (data/runs/), "
            "not in its wheel: refit from a checkout of the repository, or fit a profile of your own runs "
            "with advisor fit --store")


def shipped_records(ids: set[str]) -> list[RunRecord]:
    """The runs shipped with the advisor (data/runs/*.jsonl) whose keys are in `ids`: the runs a
    shipped profile was fitted to, so that a refit adds new runs to them instead of replacing them."""
    return [r for path in shipped_run_files(with_excluded=False) for r in read_records(path) if r.key in ids]
