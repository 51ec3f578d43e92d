"""A real run: the candidate that was run, what it measured, and the record of both as it is
stored and shipped (one JSONL line).

A `RunRecord` line is what `data/runs/*.jsonl` holds and what `runs.store` imports: the
workload, the strategy and DeepSpeed config it ran, the prediction made before the run, and
the measured `RunResult`. The key hashes what determines the run, so a resumed sweep skips
runs already recorded. Per-step quantities in a `RunResult` are averages over the measured
window; energies sum over every GPU of the job, like `models.predict.Prediction`. `None` means
not measured (no sensor, or the run failed), never zero.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import statistics
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path

STATUSES = ("ok", "oom", "crash", "timeout")
# How a harness run whose GPU allocations were recorded says so in `config_adjustments`.
MEMORY_TRACE_ADJUSTMENT = ("GPU allocations recorded (ADVISOR_MEMORY_TRACE): steps carry the recording's cost, "
                           "and host memory the recording's own")
# How a run that shared its process with other runs (the calibration's DeepSpeed worker) says so: its
# memory peaks carry what the runs before it left on the GPU and in the process's heap.
SHARED_PROCESS_ADJUSTMENT = ("ran in a process shared with other runs (calibration.ds_worker): its GPU and host "
                             "memory peaks are not its own")
# Records written before candidates carried a loss dtype (2026-11-29) ran the harness's loss on bf16 logits.
LEGACY_LOSS_DTYPE = "bf16"


# A lent host holds a fast or slow spell for about this long: host-bound steps 0.7-2 s apart correlate
# 0.56-0.80 in log, and a window's mean varies twice as much as independent steps would say from 5 s
# to 20 s (lab/probe_drift.py, machines BN and BO, 2026-12-04).
HOST_SPELL_S = 2.0


def relative_sem(step_times_s: list[float]) -> float | None:
    """The relative standard error of the mean of these step times, from the means of consecutive
    batches of at least HOST_SPELL_S (a step as long is its own batch): the steps of one host spell
    agree with each other and say nothing of the next, so counting them as independent claimed a
    1.5-s window's mean to 1% where such windows scatter by 9-15%. None below two batches: the
    window is too short to tell."""
    batches, current = [], []
    for t in step_times_s:
        current.append(t)
        if sum(current) >= HOST_SPELL_S:
            batches.append(current)
            current = []
    if current and batches:
        batches[-1].extend(current)  # a short tail joins the last batch rather than stand alone
    if len(batches) < 2:
        return None
    means = [statistics.fmean(b) for b in batches]
    weights = [len(b) for b in batches]
    mean = sum(m * w for m, w in zip(means, weights)) / sum(weights)
    return statistics.stdev(means) / mean / math.sqrt(len(means))


def geometric_mean(values: list[float]) -> float | None:
    """The geometric mean of repeats of one measured figure (the same step run more than once); None
    for none."""
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else None


def _issue_probes(host_probe: dict | None, zero_stage: int | None) -> tuple[float | None, float | None]:
    """The run's valid issue probes (us a layer), before and after its measured window. Before: the
    probe right before the window where the harness took one (from 2026-12-02), else the one before
    the model was built.

    A ZeRO-3 run's after-probe counts only where the probe timed torch's own linear
    (`issue_probe_linear`): before 2026-12-02 it timed the wrapper deepspeed.zero.Init leaves in
    torch.nn.functional.linear, 1.03-1.98x the probe before (median 1.55x, 8 runs), where the steps
    followed the probe before."""
    probe = host_probe or {}
    before = probe.get("issue_us_per_layer_window_start") or probe.get("issue_us_per_layer")
    after = probe.get("issue_us_per_layer_after")
    if zero_stage == 3 and probe.get("issue_probe_linear") != "torch":
        after = None
    return before or None, (after or None) if before else None


def bracketing_issue_us(host_probe: dict | None, zero_stage: int | None) -> float | None:
    """The host's issue time around a run's measured window (us a layer): the geometric mean of the
    probes before and after it where both ran, else the one before; None where it was not probed. A
    host-bound step follows its host over the window, and one lent host's probe read 1.5x apart within
    a call."""
    before, after = _issue_probes(host_probe, zero_stage)
    return math.sqrt(before * after) if after else before


def window_issue_us(host_probe: dict | None) -> float | None:
    """The host's issue time as the probes taken within the measured window read it (us a layer):
    their median, where at least two read it; None for a run probed only around its window."""
    readings = [us for us in (host_probe or {}).get("issue_us_per_layer_in_window") or [] if us]
    return statistics.median(readings) if len(readings) >= 2 else None


def probed_issue_us(host_probe: dict | None, zero_stage: int | None) -> float | None:
    """The host's issue time over a run (us a layer), as the fit and `validate` take it: the probes
    within its measured window where at least two read it, else those around it; None where it was not
    probed. The 16 host-bound runs probed both ways (machines BY and BZ, 2026-12-04) were predicted to
    3.9% MAPE at their window's probes and 8.2% at the probes around it (`benchmarks/window_probes.py`)."""
    return window_issue_us(host_probe) or bracketing_issue_us(host_probe, zero_stage)


def probes_read_window(host_probe: dict | None, zero_stage: int | None) -> bool:
    """Whether the run's probes measured its host over its window: within it, or on both sides of it
    (`_issue_probes`)."""
    return window_issue_us(host_probe) is not None or _issue_probes(host_probe, zero_stage)[1] is not None


def memory_limit_note(status: str, alloc_retries: int | None) -> str | None:
    """For people: why a finished run whose allocator retried ran at the GPU's memory limit; None for
    any other run (RunResult.gpu_alloc_retries)."""
    if status != "ok" or not alloc_retries:
        return None
    return (f"torch's allocator found no free memory {alloc_retries} time(s) and freed its cache to go on: "
            "this step ran at the GPU's memory limit, its time includes those retries, and a little more memory "
            "(a longer sequence, a larger micro-batch) may not fit.")


@dataclass(frozen=True)
class RunResult:
    status: str  # ok | oom | crash | timeout
    reason: str = ""  # why it failed; empty when ok
    step_time_s: float | None = None  # wall time of one optimizer step, GPU synchronized
    gpu_energy_j: float | None = None  # per step, summed over the job's GPUs
    cpu_energy_j: float | None = None  # per step, host CPU
    cpu_energy_estimated: bool = False  # True when cpu_energy_j is a model, not a sensor
    peak_gpu_mem_gib: float | None = None  # torch max_memory_allocated, max over ranks
    peak_gpu_reserved_gib: float | None = None  # torch max_memory_reserved, max over ranks
    # Times the allocator freed its cache and retried an allocation, over the run, most over ranks: a
    # pool at the GPU's limit or at a cap (calibration.harness.memory_cap). None: not recorded.
    gpu_alloc_retries: int | None = None
    peak_host_mem_gib: float | None = None  # peak RSS of each rank's process tree, summed over ranks
    host_mem_baseline_gib: float | None = None  # the same before the model was built (runtime, libraries)
    # Only where a rank has child processes (SuperOffload's worker), sampled (calibration.harness.
    # shared_host_memory): the trees' peak Pss, which counts a page the processes share once, and
    # their resident sum at the same samples (beside peak_host_mem_gib: whether sampling caught the peak).
    peak_host_mem_pss_gib: float | None = None
    peak_host_mem_sampled_gib: float | None = None
    tokens_per_s: float | None = None  # sequences x context length per second, whole job
    warmup_steps: int = 0
    measured_steps: int = 0
    window_s: float | None = None  # length of the measured window
    step_times_s: list[float] = field(default_factory=list)  # each measured step, rank 0
    # Rank 0's host, each measured step (calibration.harness.host_noise): CPU time stolen by the
    # hypervisor over all vCPUs (None: the host does not say), in Python's GC, on the main thread.
    step_steal_cpu_s: list[float] | None = None
    step_gc_s: list[float] | None = None
    step_thread_cpu_s: list[float] | None = None
    gpu_energy_window_j: dict[str, float] | None = None  # per global rank, whole window
    gpu_power_avg_w: dict[str, float] | None = None  # per global rank, over the window
    cpu_process_core_s: float | None = None  # CPU seconds used by the ranks' process trees, per step
    loss_first: float | None = None
    loss_last: float | None = None
    gpu_meter: str = "absent"  # nvml | absent (and why)
    cpu_meter: str = "absent"  # rapl | grace-hwmon | absent
    world_size: int = 0
    config_adjustments: list[str] = field(default_factory=list)  # what the harness changed in ds_config
    machine: dict = field(default_factory=dict)  # host, GPU, versions
    layout: dict = field(default_factory=dict)  # as run: ZeRO stage, sp, dp, checkpointing, optimizer class
    timeline_s: dict[str, float] = field(default_factory=dict)  # rank 0: seconds since its start at each stage
    wall_s: float | None = None  # whole run including start-up, filled in by the runner
    concurrent_runs: int = 1  # most runs sharing the machine meanwhile (host CPU energy is whole-host)
    cpu_threads_per_rank: int | None = None  # torch's intra-op threads in each rank (OMP_NUM_THREADS)
    host_probe: dict | None = None  # the host's issue and CPUAdam rates (calibration.harness.host_probe)
    # The harness itself could not start (a missing module or file, a bad argument): says nothing about
    # the candidate, so the sweep records no result for it and stops.
    harness_error: bool = False

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {self.status!r}")

    @property
    def memory_traced(self) -> bool:
        """Whether its GPU allocations were recorded: the recording holds host memory of its own (a
        traced run held 0.4-0.9 GiB more than the same run untraced), so its host peak is not the run's."""
        return any("ADVISOR_MEMORY_TRACE" in a for a in self.config_adjustments)

    @property
    def shared_process(self) -> bool:
        """Whether it ran in a process shared with other runs (SHARED_PROCESS_ADJUSTMENT)."""
        return any(a.startswith(SHARED_PROCESS_ADJUSTMENT.partition(" (")[0]) for a in self.config_adjustments)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "RunResult":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def write(self, path: str | Path) -> None:
        """Atomic: a reader never sees half a file."""
        path = Path(path)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1, sort_keys=True))
        tmp.replace(path)

    @classmethod
    def read(cls, path: str | Path) -> "RunResult":
        return cls.from_dict(json.loads(Path(path).read_text()))


@dataclass(frozen=True)
class Candidate:
    """One real run: a workload, and the DeepSpeed config (plus harness knobs) that lays it out."""

    model: str  # preset name or config.json path
    seq_len: int
    ds_config: dict
    gpus: int = 1
    sp: int | None = None  # None: the ds_config's sequence_parallel_size
    checkpoint_every: int | None = None  # None: from the ds_config (models.ds_config's convention)
    images: int = 0
    frames: int = 0
    image_size: int | None = None
    freeze_vision: bool = False
    strategy: dict | None = None  # the models.strategy.Strategy fields it came from, if any
    label: str = ""  # for people; not part of the key
    loss_dtype: str = "fp32"  # the cross-entropy's dtype (models.workload.Workload.loss_dtype)
    # The user's training script (`advisor recommend --validate --script`), None for the built-in model.
    script: str | None = None

    def __post_init__(self):
        if self.gpus < 1 or self.seq_len < 1:
            raise ValueError(f"gpus and seq_len must be positive, got {self.gpus} and {self.seq_len}")
        if self.images and self.frames:
            raise ValueError("give images or frames, not both")

    @classmethod
    def from_strategy(cls, model: str, seq_len: int, strategy, arch, label: str = "", **workload) -> "Candidate":
        """The run of a models.strategy.Strategy on `arch`, its DeepSpeed config written by models.ds_config
        (the one way a strategy becomes a run: `advisor validate` and the calibration's steps both use it)."""
        from models.ds_config import to_ds_config

        return cls(model=model, seq_len=seq_len, ds_config=to_ds_config(strategy, arch), gpus=strategy.gpus,
                   sp=strategy.sp, checkpoint_every=strategy.checkpoint_every, strategy=asdict(strategy),
                   label=label or strategy.label(), **workload)

    @property
    def zero_stage(self) -> int:
        return int(self.ds_config.get("zero_optimization", {}).get("stage", 0))

    def workload(self) -> dict:
        out = {
            "model": self.model,
            "seq_len": self.seq_len,
            "images": self.images,
            "frames": self.frames,
            "image_size": self.image_size,
            "train_vision": not self.freeze_vision,
        }
        if self.loss_dtype != LEGACY_LOSS_DTYPE:  # keys of runs made before the field existed stay as they were
            out["loss_dtype"] = self.loss_dtype
        return out

    def key(self) -> str:
        """Stable id of what determines the run (not the label, not the strategy's spelling)."""
        what = {
            "workload": self.workload(),
            "ds_config": self.ds_config,
            "gpus": self.gpus,
            "sp": self.sp,
            "checkpoint_every": self.checkpoint_every,
        }
        if self.script:  # another program is another run
            what["script"] = self.script
        threads = (self.strategy or {}).get("cpu_threads_per_rank")
        if threads:  # so is another thread count (keys of runs that did not set it stay as they were)
            what["cpu_threads_per_rank"] = threads
        return hashlib.sha1(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]

    def to_dict(self) -> dict:
        return asdict(self)


class RunRecordError(ValueError):
    """A stored record that is not a run record: the field and what is wrong with it."""


@functools.cache
def _record_adapter():
    """pydantic's validator of `RunRecord` (built once: a few milliseconds)."""
    from pydantic import TypeAdapter

    return TypeAdapter(RunRecord)


@dataclass(frozen=True)
class RunRecord:
    """One real run, measured or failed, with the prediction made before it."""

    key: str
    date: str  # ISO 8601, UTC, when the run finished
    candidate: Candidate
    result: RunResult
    prediction: dict | None = None  # models.predict.Prediction.to_dict(), made before the run
    profile: str | None = None  # the hardware profile the prediction used
    notes: list[str] = field(default_factory=list)  # e.g. why there is no prediction

    @classmethod
    def now(cls, candidate: Candidate, result: RunResult, prediction=None, profile=None, notes=()) -> "RunRecord":
        date = datetime.now(timezone.utc).isoformat(timespec="seconds")
        return cls(candidate.key(), date, candidate, result, prediction, profile, list(notes))

    def to_dict(self) -> dict:
        return {
            "key": self.key,
            "date": self.date,
            "candidate": self.candidate.to_dict(),
            "result": self.result.to_dict(),
            "prediction": self.prediction,
            "profile": self.profile,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: dict) -> "RunRecord":
        """A record as stored, every field's type checked strictly (pydantic: no number given as a
        string, no bool as a count) and every figure's range (`runs.record_bounds`): a record edited by
        hand, or written by something else, fails here naming the field (`RunRecordError`), not later
        inside the model. Fields a newer harness added are ignored; a candidate from before the loss
        dtype takes the loss it ran (`LEGACY_LOSS_DTYPE`)."""
        from pydantic import ValidationError

        from runs.record_bounds import record_problems

        if not isinstance(data, dict):
            raise RunRecordError(f"a record is a JSON object, got {type(data).__name__}")
        candidate = data.get("candidate")
        if isinstance(candidate, dict):
            data = {**data, "candidate": {"loss_dtype": LEGACY_LOSS_DTYPE, **candidate}}
        try:  # from JSON text: pydantic's strict mode takes objects for dataclasses only there
            record = _record_adapter().validate_json(json.dumps(data), strict=True)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "record"
            raise RunRecordError(f"{where}: {first['msg'].removeprefix('Value error, ')}") from None
        problems = record_problems(record)
        if problems:
            raise RunRecordError(problems[0])
        return record

    def to_json_line(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True) + "\n"
