"""Validation: run candidates for real on the local GPUs, predict each one first, store both,
and compare them.

Candidates come from one DeepSpeed config (`--ds-config`, with `--model/--seq`) or from a sweep
file: JSONL, one object a line with `model`, `seq`, either `strategy` (models.strategy.Strategy
fields; the config is written by models.ds_config) or `ds_config` (read back into a strategy
for the prediction), and optionally `images`, `frames`, `image_size`, `freeze_vision`, `label`.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

from models.input_file import MAX_LINES_BYTES, parse_json, read_text
from runs.record import Candidate, RunRecord, memory_limit_note, relative_sem

# What is compared: (name, the prediction's key, the measured RunResult field). Like with like, as
# `advisor report` does: allocated GPU memory against torch's max_memory_allocated, the allocator's
# reserved pool against max_memory_reserved.
COMPARED = (
    ("step_time_s", "step_time_s", "step_time_s"),
    ("gpu_energy_j", "gpu_energy_j", "gpu_energy_j"),
    ("cpu_energy_j", "cpu_energy_j", "cpu_energy_j"),
    ("allocated_gpu_mem_gib", "allocated_gpu_mem_gib", "peak_gpu_mem_gib"),
    ("reserved_gpu_mem_gib", "reserved_gpu_mem_gib", "peak_gpu_reserved_gib"),
    ("peak_host_mem_gib", "peak_host_mem_gib", "peak_host_mem_gib"),
)
METRICS = tuple(name for name, _, _ in COMPARED)
SWEEP_KEYS = {"model", "seq", "seq_len", "strategy", "ds_config", "images", "frames", "image_size",
              "freeze_vision", "label", "gpus", "loss_dtype"}


class SweepFileError(ValueError):
    """A sweep line that cannot be run; the message names the file and line."""


def _check_workload(arch, seq_len: int, images: int, frames: int, image_size: int | None, loss_dtype: str) -> None:
    """The workload the candidate runs, checked by its owner (`models.workload.Workload`) before the run:
    images for a text model, or more vision tokens than the context, would run a step no prediction has."""
    from models.workload import Workload

    Workload(arch, seq_len, images=images, frames=frames, image_size=image_size, loss_dtype=loss_dtype)


def candidate_from_ds_config(model: str, seq_len: int, ds_config: dict, gpus: int | None = None, images: int = 0,
                             frames: int = 0, image_size: int | None = None, freeze_vision: bool = False,
                             label: str = "", loss_dtype: str = "fp32", cpu_threads_per_rank: int = 0) -> Candidate:
    """A candidate running `ds_config` as is, with the strategy it describes (for the prediction)."""
    from models.architecture import load_architecture
    from models.ds_config import gpus_from_batch, parse_ds_config, strategy_from_ds_config

    arch = load_architecture(model)
    _check_workload(arch, seq_len, images, frames, image_size, loss_dtype)
    freeze_vision = freeze_vision and arch.vision is not None  # a text model has nothing to freeze
    settings = parse_ds_config(ds_config, arch)
    sp = settings.fields.get("sp", 1)
    gpus = gpus or gpus_from_batch(settings, sp) or sp
    strategy = strategy_from_ds_config(settings, gpus=gpus, gpus_per_node=gpus)
    strategy = replace(strategy, cpu_threads_per_rank=cpu_threads_per_rank)
    return Candidate(model=model, seq_len=seq_len, ds_config=ds_config, gpus=gpus, sp=strategy.sp,
                     checkpoint_every=strategy.checkpoint_every, images=images, frames=frames,
                     image_size=image_size, freeze_vision=freeze_vision, strategy=asdict(strategy),
                     label=label or strategy.label(), loss_dtype=loss_dtype)


def candidate_from_strategy(model: str, seq_len: int, strategy: dict, images: int = 0, frames: int = 0,
                            image_size: int | None = None, freeze_vision: bool = False, label: str = "",
                            loss_dtype: str = "fp32") -> Candidate:
    """A candidate for a Strategy, its DeepSpeed config written by models.ds_config."""
    from models.architecture import load_architecture
    from models.strategy import Strategy, static_reasons

    arch = load_architecture(model)
    _check_workload(arch, seq_len, images, frames, image_size, loss_dtype)
    s = Strategy(**strategy)
    reasons = static_reasons(s, arch)
    if reasons:  # named by the file and line: a strategy of the wrong types has no label
        raise SweepFileError("; ".join(reasons))
    return Candidate.from_strategy(model, seq_len, s, arch, label, images=images, frames=frames,
                                   image_size=image_size, freeze_vision=freeze_vision and arch.vision is not None,
                                   loss_dtype=loss_dtype)


def _check_sweep_line(spec) -> None:
    """The shape of one sweep line, said in its own words before any field is used."""
    if not isinstance(spec, dict):
        raise SweepFileError("a line is a JSON object")
    unknown = set(spec) - SWEEP_KEYS
    if unknown:
        raise SweepFileError(f"unknown keys {sorted(unknown)}")
    if not isinstance(spec.get("model"), str) or not spec["model"].strip():
        raise SweepFileError("needs 'model': a model name or a config.json path")
    seq = spec.get("seq", spec.get("seq_len"))
    if seq is not None and (isinstance(seq, bool) or not isinstance(seq, int) or seq <= 0):
        raise SweepFileError(f"'seq' is a positive whole number of tokens, got {seq!r}")
    for key in ("strategy", "ds_config"):
        if key in spec and not isinstance(spec[key], dict):
            raise SweepFileError(f"'{key}' is a JSON object, got {spec[key]!r}")
    for key in ("images", "frames", "gpus"):
        value = spec.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise SweepFileError(f"'{key}' is a whole number, got {value!r}")


def candidates_from_sweep(path: str | Path) -> list[Candidate]:
    """Every line of a sweep file as a candidate; a bad line raises naming it."""
    out = []
    for number, line in enumerate(read_text(path, SweepFileError, MAX_LINES_BYTES).splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{path}:{number}"
        try:
            spec = parse_json(line, "not a sweep line", SweepFileError)
            _check_sweep_line(spec)
            seq = spec.get("seq", spec.get("seq_len"))
            common = dict(images=spec.get("images", 0), frames=spec.get("frames", 0),
                          image_size=spec.get("image_size"), freeze_vision=spec.get("freeze_vision", False),
                          label=spec.get("label", ""), loss_dtype=spec.get("loss_dtype", "fp32"))
            if seq is None:
                raise SweepFileError("needs 'seq'")
            if "strategy" in spec:
                c = candidate_from_strategy(spec["model"], int(seq), spec["strategy"], **common)
                if "ds_config" in spec:  # run the given config; keep the strategy for the prediction
                    c = Candidate(**{**c.to_dict(), "ds_config": spec["ds_config"]})
            elif "ds_config" in spec:
                c = candidate_from_ds_config(spec["model"], int(seq), spec["ds_config"], gpus=spec.get("gpus"),
                                             **common)
            else:
                raise SweepFileError("needs 'strategy' or 'ds_config'")
        except SweepFileError as exc:
            raise SweepFileError(f"{where}: {exc}") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise SweepFileError(f"{where}: {type(exc).__name__}: {exc}") from None
        out.append(c)
    return out


def make_predictor(profile_name: str) -> Callable[[Candidate], tuple[dict | None, str | None, list[str]]]:
    """predict(candidate) -> (Prediction.to_dict(), profile name, notes); never raises, so a
    missing cost model or profile costs the prediction, not the measurement."""
    def predict(c: Candidate):
        if c.strategy is None:
            return None, None, ["no prediction: the candidate carries no strategy"]
        try:
            from models.architecture import load_architecture
            from models.predict import predict as predict_one
            from models.profile import load_profile
            from models.strategy import Strategy
            from models.workload import Workload

            profile = load_profile(profile_name)
            workload = Workload(load_architecture(c.model), c.seq_len, images=c.images, frames=c.frames,
                                image_size=c.image_size, train_vision=not c.freeze_vision, loss_dtype=c.loss_dtype)
            pred = predict_one(workload, Strategy(**c.strategy), profile)
        except Exception as exc:  # noqa: BLE001 - recorded in the run's notes
            return None, profile_name, [f"no prediction: {type(exc).__name__}: {exc}"]
        return pred.to_dict(), profile_name, []

    return predict


@dataclass(frozen=True)
class PredictedCandidate:
    """One line of a sweep with the model's prediction for it (None, with notes, where it has none)."""

    candidate: Candidate
    prediction: dict | None
    profile: str | None
    notes: list[str]


def predicted_sweep(path: str | Path, profile_name: str) -> list[PredictedCandidate]:
    """Every candidate of a sweep file with its prediction: what is committed before a device call
    (`lab/predict_sweep.py`) and what a memory cap is a multiple of (`lab/memory_cap.py`).
    Raises as `candidates_from_sweep` does."""
    candidates = candidates_from_sweep(path)
    predict = make_predictor(profile_name)
    return [PredictedCandidate(c, *predict(c)) for c in candidates]


@dataclass(frozen=True)
class Comparison:
    """Predicted against measured for one run; error_pct = 100 (predicted - measured) / measured."""

    key: str
    label: str
    status: str
    reason: str
    measured: dict
    predicted: dict
    error_pct: dict
    host: dict | None = None  # advisor.host_check.HostCheck of the run's host against the profile's
    step_time_rel_sem: float | None = None  # how well the measured mean step is known (runs.record.relative_sem)
    at_probed_host: dict | None = None  # the prediction made again at the host the run probed (`at_probed_host`)
    gpu_alloc_retries: int | None = None  # times the allocator freed its cache and retried (runs.record.RunResult)
    window_s: float | None = None  # the measured steps' seconds, summed; None where none were recorded
    host_share: float | None = None  # the predicted share of the step on the host (models.predict); None: not known
    cpu_energy_estimated: bool = False  # the measured CPU energy is an estimate from utilization (no sensor)
    stored: bool = False  # found stored from an earlier command, not run by this one

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def memory_note(self) -> str | None:
        return memory_limit_note(self.status, self.gpu_alloc_retries)


def _error_pct(predicted: float | None, measured: float | None) -> float | None:
    """100 (predicted - measured) / measured; None where either is missing or nothing was measured."""
    return None if predicted is None or not measured else 100.0 * (predicted - measured) / measured


def at_probed_host(record: RunRecord, profile) -> dict | None:
    """The run's step time and GPU energy predicted again, on `profile` at the issue time the run's own
    probes measured (`runs.record.probed_issue_us`, as the fit takes it), with their errors in percent.

    A host-bound step follows its host, and a lent host drifted 1.85x within minutes (2026-12-02,
    data/runs/README.md): where this prediction is near the measurement and the one made before the run
    was not, the host moved, not the model. The issue time only: an offload run's CPU optimizer stays
    the profile's. None where the run failed or did not probe its host, the profile has no issue time
    of its own, or the record cannot be read as a run (`runs.measured.to_measured_run` says why)."""
    from models.predict import predict
    from runs.measured import to_measured_run

    if record.result.status != "ok" or profile.host.issue_per_layer is None:
        return None
    try:
        run = to_measured_run(record)
    except (ValueError, KeyError, TypeError):
        return None
    if run.host_issue_per_layer_s is None:
        return None
    p = predict(run.workload, run.strategy, run.on_its_host(profile))
    return {"issue_us_per_layer": run.host_issue_per_layer_s * 1e6,
            "step_time_s": p.step_time_s, "gpu_energy_j": p.gpu_energy_j,
            "error_pct": {"step_time_s": _error_pct(p.step_time_s, run.step_time_s),
                          "gpu_energy_j": _error_pct(p.gpu_energy_j, run.gpu_energy_j)}}


def compare(record: RunRecord, profile=None, stored: bool = False) -> Comparison:
    """The run's errors, and with `profile` (models.profile.HardwareProfile) its host against the
    profile's where the run probed it, and the prediction again at that host. `stored`: the run is
    an earlier command's."""
    measured = {name: getattr(record.result, field) for name, _, field in COMPARED}
    predicted = {name: (record.prediction or {}).get(key) for name, key, _ in COMPARED}
    errors = {m: _error_pct(predicted[m], measured[m]) for m in METRICS}
    extra = "; ".join(record.notes)
    reason = "; ".join(x for x in (record.result.reason, extra) if x)
    host = None
    if profile is not None and record.candidate.strategy is not None:
        from advisor.host_check import check_host
        from models.strategy import Strategy

        checked = check_host(record.result.host_probe, Strategy(**record.candidate.strategy), profile)
        host = checked.to_dict() if checked else None
    steps = record.result.step_times_s
    spread = relative_sem(steps) if steps else None
    again = at_probed_host(record, profile) if profile is not None else None
    return Comparison(record.key, record.candidate.label, record.result.status, reason, measured, predicted, errors,
                      host, spread, again, record.result.gpu_alloc_retries, sum(steps) if steps else None,
                      (record.prediction or {}).get("host_share"), record.result.cpu_energy_estimated, stored)


def run_validation(candidates: list[Candidate], store, jsonl_path: Path, workdir: Path, settings, slots,
                   profile: str, deadline_s: float | None = None, retry: tuple[str, ...] = (),
                   on_record: Callable[[RunRecord], None] | None = None, concurrent: bool = True,
                   skip_stored: bool = True,
                   on_skip: Callable[[Candidate, str], None] | None = None) -> list[RunRecord]:
    """Predict, run and store each candidate not yet in `jsonl_path` (nor in `store`, unless
    `skip_stored` is False: a repeat); return new records. A candidate predicted to need more host
    memory than this host has available is not run: a line on stderr says so, and `on_skip` hears of
    it. The profile's host may be larger than the one validating (a 7B offload step on a 125 GiB host,
    2026-12-04)."""
    from calibration.environment import host_memory_available_gib
    from calibration.harness.runner import run_sweep

    done = store.done_keys([s for s in ("ok", "oom", "crash", "timeout") if s not in retry]) if skip_stored else set()
    todo = [c for c in candidates if c.key() not in done]

    def record(r: RunRecord):
        store.add_run(r)
        if on_record:
            on_record(r)

    def skipped(c: Candidate, why: str):
        print_skip(c, why)
        if on_skip:
            on_skip(c, why)

    if settings.host_memory_gib is None:
        settings = replace(settings, host_memory_gib=host_memory_available_gib())
    return run_sweep(todo, jsonl_path, workdir, settings, slots, predict=make_predictor(profile),
                     on_record=record, deadline_s=deadline_s, retry=retry, concurrent=concurrent,
                     on_skip=skipped)


def latest_runs(candidates: list[Candidate], new: list[RunRecord], store, jsonl_path: Path) -> list[tuple[RunRecord, bool]]:
    """Each candidate's run as this command leaves it: the one it made, else the latest stored (from
    `store` or `jsonl_path`), flagged True; a candidate with neither is left out. In candidate order."""
    from runs.jsonl import read_records

    latest = {}
    for record in sorted([*store.runs(), *read_records(jsonl_path, missing_ok=True)], key=lambda r: r.date):
        latest[record.key] = (record, True)
    latest.update({record.key: (record, False) for record in new})
    keys = dict.fromkeys(c.key() for c in candidates)  # a sweep may hold a line twice
    return [latest[key] for key in keys if key in latest]


def default_workdir() -> Path:
    """Where runs keep their configs, logs and results unless --workdir says: beside the run store
    (~/.cache/energy-advisor/validate-runs), not in the current folder, often a repository's root."""
    from runs.store import default_store_path

    return default_store_path().parent.resolve() / "validate-runs"


def local_slots(parallel: bool = True) -> list:
    """This machine's GPUs as run slots (the visible ones), each with its share of the cores; one
    slot without a GPU on a CPU-only machine. The runs need torch and DeepSpeed: without them this
    fails (ModuleNotFoundError, one line from the CLI) before any run starts."""
    import os

    from advisor.extras import require_gpu_extra
    from calibration.harness.runner import Slot, split_slots

    require_gpu_extra()
    import torch

    count = torch.cuda.device_count()
    if count == 0:
        return [Slot()]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    ids = [e.strip() for e in visible.split(",") if e.strip()][:count] if visible else list(range(count))
    return split_slots(ids) if parallel else [Slot(g) for g in ids]


def prebuild_local(slots, asked: bool | None = None) -> None:
    """Compile DeepSpeed's CPU and GPU Adam once before timed runs (by default when a GPU is present)."""
    import sys

    from calibration.harness.runner import prebuild_ops

    on_gpu = slots[0].gpu is not None
    if asked if asked is not None else on_gpu:
        report = prebuild_ops(gpu=on_gpu)
        print(f"prebuilt DeepSpeed ops: {json.dumps(report)}", file=sys.stderr)


def print_skip(candidate: Candidate, why: str) -> None:
    """One line on stderr per candidate not started."""
    import sys

    print(f"[skip] {candidate.model} seq {candidate.seq_len} {candidate.label}: {why}", file=sys.stderr, flush=True)


def print_progress(record: RunRecord) -> None:
    """One line on stderr per finished run."""
    import sys

    r = record.result
    took = f"{r.step_time_s:.3f} s/step" if r.status == "ok" and r.step_time_s else r.reason
    print(f"[{r.status}] {record.candidate.model} seq {record.candidate.seq_len} {record.candidate.label}: {took} "
          f"(run {r.wall_s or 0:.0f} s)", file=sys.stderr, flush=True)
