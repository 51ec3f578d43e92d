"""Fit the profile's efficiency, overlap, overhead, power and memory terms to measured runs.

The structure of the cost model stays fixed; only physically meaningful constants move,
each inside bounds (an efficiency in (0, 1.2], a power between idle and the cap, an
overhead of seconds or less). Residuals are relative (log ratio), so a 0.3 s run counts
as much as a 30 s one. `leave_one_out` refits without each run in turn: that error, not
the training error, is the number of record.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import least_squares

from models.predict import predict
from models.profile import HardwareProfile
from models.strategy import Strategy
from models.workload import Workload


@dataclass(frozen=True)
class MeasuredRun:
    """One real training run: what ran and what it cost per optimizer step."""

    workload: Workload
    strategy: Strategy
    step_time_s: float
    gpu_energy_j: float | None  # per step, summed over GPUs; None when not measured
    peak_gpu_mem_gib: float | None
    run_id: str = ""

    @property
    def family(self) -> str:
        """Strategy family for error reporting: ZeRO stage, offload kind, sp, checkpointing."""
        s = self.strategy
        offload = "none"
        if s.offload_optimizer == "cpu":
            offload = "super" if s.super_offload else ("param" if s.offload_param == "cpu" else "opt")
        vision = "+vision" if self.workload.vision_groups else ""
        return f"z{s.zero_stage}/{offload}/sp{s.sp}/{'ckpt' if s.checkpoint_every else 'nockpt'}{vision}"


@dataclass(frozen=True)
class FitParameter:
    """A profile constant the fit may move: its path in the profile and its bounds."""

    path: tuple[str, ...]
    lower: float
    upper: float
    affects: str  # "time", "energy" or "memory": which residuals inform it


DEFAULT_PARAMETERS = (
    FitParameter(("overheads", "compute_efficiency"), 0.3, 1.2, "time"),
    FitParameter(("overheads", "comm_efficiency"), 0.05, 1.2, "time"),
    FitParameter(("overheads", "step"), 0.0, 5.0, "time"),
    FitParameter(("overheads", "micro_step"), 0.0, 1.0, "time"),
    FitParameter(("overheads", "zero3_module_pass"), 0.0, 5e-3, "time"),
    FitParameter(("overheads", "offload_step_per_gparam"), 0.0, 10.0, "time"),
    FitParameter(("overlap", "compute_slowdown_with_collective"), 0.0, 1.0, "time"),
    FitParameter(("power", "gpu", "compute"), 50.0, 1000.0, "energy"),
    FitParameter(("power", "gpu", "wait"), 30.0, 400.0, "energy"),
    FitParameter(("power", "gpu", "collective"), 50.0, 800.0, "energy"),
    FitParameter(("memory", "framework_reserved"), 0.0, 16.0, "memory"),
    FitParameter(("memory", "fragmentation"), 0.0, 0.5, "memory"),
)


def get_value(profile: HardwareProfile, path: tuple[str, ...]) -> float:
    node = profile
    for key in path:
        node = getattr(node, key)
    return node.value


def with_values(profile: HardwareProfile, values: dict[tuple[str, ...], float], source: str) -> HardwareProfile:
    """A copy of `profile` with the quantities at `values`' paths replaced (units kept)."""
    data = profile.model_dump()
    for path, value in values.items():
        node = data
        for key in path:
            node = node[key]
        node["value"] = float(value)
        node["source"] = source
    return HardwareProfile.model_validate(data)


def _relative_error(predicted: float, measured: float | None) -> float | None:
    if measured is None or not np.isfinite(measured) or measured <= 0 or predicted <= 0:
        return None
    return float(np.log(predicted / measured))


@dataclass
class ProfileFit:
    """scikit-learn-shaped: __init__ stores settings, fit() sets the attributes ending in _."""

    parameters: tuple[FitParameter, ...] = DEFAULT_PARAMETERS
    memory_weight: float = 0.5
    source: str = "fitted to measured runs"
    profile_: HardwareProfile | None = field(default=None, init=False)
    values_: dict[tuple[str, ...], float] = field(default_factory=dict, init=False)
    cost_: float | None = field(default=None, init=False)

    def _residuals(self, runs: list[MeasuredRun], profile: HardwareProfile) -> np.ndarray:
        out = []
        for run in runs:
            p = predict(run.workload, run.strategy, profile)
            for predicted, measured, weight in (
                (p.step_time_s, run.step_time_s, 1.0),
                (p.gpu_energy_j, run.gpu_energy_j, 1.0),
                (p.peak_gpu_mem_gib, run.peak_gpu_mem_gib, self.memory_weight),
            ):
                err = _relative_error(predicted, measured)
                out.append(0.0 if err is None else weight * err)
        return np.asarray(out)

    def fit(self, runs: list[MeasuredRun], base_profile: HardwareProfile) -> "ProfileFit":
        if not runs:
            raise ValueError("no measured runs to fit")
        paths = [p.path for p in self.parameters]
        start = np.array([get_value(base_profile, p) for p in paths])
        lower = np.array([p.lower for p in self.parameters])
        upper = np.array([p.upper for p in self.parameters])
        start = np.clip(start, lower + 1e-12, upper - 1e-12)
        scale = np.maximum(np.abs(start), (upper - lower) * 1e-2)

        def residuals(x: np.ndarray) -> np.ndarray:
            return self._residuals(runs, with_values(base_profile, dict(zip(paths, x)), self.source))

        result = least_squares(residuals, start, bounds=(lower, upper), x_scale=scale, method="trf", max_nfev=200)
        self.values_ = dict(zip(paths, result.x))
        self.profile_ = with_values(base_profile, self.values_, f"{self.source} ({len(runs)} runs)")
        self.cost_ = float(result.cost)
        return self


@dataclass(frozen=True)
class RunError:
    run_id: str
    family: str
    time_error: float  # (predicted - measured) / measured
    energy_error: float | None
    memory_error: float | None


def relative_errors(run: MeasuredRun, profile: HardwareProfile) -> RunError:
    p = predict(run.workload, run.strategy, profile)

    def rel(predicted, measured):
        return None if measured is None else (predicted - measured) / measured

    return RunError(
        run_id=run.run_id,
        family=run.family,
        time_error=rel(p.step_time_s, run.step_time_s),
        energy_error=rel(p.gpu_energy_j, run.gpu_energy_j),
        memory_error=rel(p.peak_gpu_mem_gib, run.peak_gpu_mem_gib),
    )


def leave_one_out(runs: list[MeasuredRun], base_profile: HardwareProfile, fit: ProfileFit | None = None) -> list[RunError]:
    """Refit without each run and predict it: the honest estimate of error on unseen runs."""
    template = fit or ProfileFit()
    errors = []
    for i, held_out in enumerate(runs):
        model = ProfileFit(parameters=template.parameters, memory_weight=template.memory_weight)
        model.fit(runs[:i] + runs[i + 1 :], base_profile)
        errors.append(relative_errors(held_out, model.profile_))
    return errors
