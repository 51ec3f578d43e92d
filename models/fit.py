"""Fit the profile's efficiency, overlap, DeepSpeed-overhead and power terms to measured runs.

The structure of the cost model stays fixed; only a few physically meaningful constants move,
each inside bounds (an efficiency in [0.3, 1.2], a power between the idle draw and the cap, an
overhead of seconds or less). Two stages, because the constants split cleanly:
time constants are fitted to measured step times first; then GPU power per phase is fitted to
measured average GPU power (energy / step time) with the fitted timing held fixed, so power
constants stay powers instead of absorbing what the timing gets wrong.

Residuals are log ratios, so a 0.3 s run counts as much as a 30 s one, and a soft-L1 loss keeps
one disturbed run from dragging every constant. A prior pulls each constant towards its
starting value (`FitParameter.scale` is how far it may plausibly move): constants the runs say
little about stay where the microbenchmarks or datasheet put them. How strong that prior is,
cross-validation decides (`models.held_out.choose_prior_strength`); `models.held_out.leave_one_out`
refits without each run in turn: that error, not the training error, is the number of record.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
from scipy.optimize import least_squares

from models.energy import PHASE_POWER
from models.measured_run import MeasuredRun
from models.memory import FRAGMENTATION_FIELDS, GIB, start_pool_ratio
from models.pool_fit import collective_pool_of, fragmentation_of, offload_start_pool_of, with_memory_nodes
from models.predict import Prepared, prepare, timed
from models.profile import FitRecord, HardwareProfile, Quantity
from models.profile_values import get_value, getattr_path, with_values
from models.strategy import StrategyBatch
from models.workload import Workload


@dataclass(frozen=True)
class FitParameter:
    """A profile constant the fit may move: dotted path, bounds, prior width, what informs it."""

    name: str  # dotted path in the profile, e.g. "overheads.step"
    lower: float
    upper: float
    scale: float  # how far it may plausibly move from its start (the prior's width, same unit)
    kind: str  # "time" (fitted to step time) or "energy" (fitted to GPU energy)

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(self.name.split("."))

    def moved(self, value: float) -> float:
        """`value` moved by one prior width, up unless that passes the upper bound: how far a probe of
        what the constant moves goes (a finite step, so a regime change past it is still seen)."""
        return float(np.clip(value + self.scale if value + self.scale <= self.upper else value - self.scale,
                             self.lower, self.upper))


TIME_PARAMETERS = (
    FitParameter("overheads.compute_efficiency", 0.3, 1.2, 0.1, "time"),
    FitParameter("overheads.step", 0.0, 5.0, 0.05, "time"),
    FitParameter("overheads.layer_pass", 0.0, 0.02, 1e-3, "time"),
    FitParameter("overheads.zero3_module_pass", 0.0, 5e-3, 1e-4, "time"),
    FitParameter("overheads.zero12_grad_hook", 0.0, 1e-3, 3e-5, "time"),
    FitParameter("overheads.zero12_step_per_tensor", 0.0, 2e-3, 1e-4, "time"),
    FitParameter("overheads.step_per_tensor", 0.0, 2e-3, 1e-4, "time"),
    FitParameter("overheads.zero3_host_serial", 0.0, 1.0, 0.3, "time"),
    FitParameter("overheads.offload_step_per_gparam", 0.0, 10.0, 0.5, "time"),
    FitParameter("overheads.offload_step_serial_per_gparam", 0.0, 10.0, 0.05, "time"),
    FitParameter("overheads.zero3_offload_step_per_tensor", 0.0, 0.01, 1e-4, "time"),
    FitParameter("overheads.super_offload_step_per_gparam", 0.0, 10.0, 0.5, "time"),
    FitParameter("overlap.compute_slowdown_with_collective", 0.0, 1.0, 0.1, "time"),
    FitParameter("overlap.collective_slowdown_with_compute", 0.0, 2.0, 0.3, "time"),
)
POWER_PHASES = tuple(dict.fromkeys(PHASE_POWER.values()))  # the GPU powers a step's phases draw


# What the host probe would have read on the hosts of the runs that carry no probe (the issue
# constants hold there): informed by probed and unprobed host-bound runs together. Lent one-H200
# slices probed 111-186 us; on 100 runs it fitted to 107 +- 8 us (the unprobed 2x H200 hosts).
ISSUE_ANCHOR = FitParameter("overheads.issue_fitted_at_per_layer", 30e-6, 1e-3, 50e-6, "time")


def default_parameters(profile: HardwareProfile, runs: list[MeasuredRun] | None = None) -> tuple[FitParameter, ...]:
    """The time constants above, and GPU power per phase bounded by this profile's idle and cap (the
    range a profile allows, `models.profile`); the issue anchor where the profile has one and some of
    `runs` carry no probe of their own.

    On runs that all probed their host the anchor is no measurement: it scales every issue constant at
    once, those no run informs included. A refit of five probed H100 runs (two models) moved it 16%
    and so priced 0.6B-model ZeRO-1/2/3 steps, none among the five, 23-40% slower than measured."""
    idle, cap = profile.power.gpu.idle.value, profile.gpu.power_cap.value
    power = tuple(FitParameter(f"power.gpu.{k}", idle, cap, 50.0, "energy") for k in POWER_PHASES)
    unprobed = runs is None or any(not r.host_issue_per_layer_s for r in runs)
    anchor = (ISSUE_ANCHOR,) if profile.overheads.issue_fitted_at_per_layer is not None and unprobed else ()
    return TIME_PARAMETERS + anchor + power


@dataclass(frozen=True)
class RunPredictions:
    """Predictions for a list of runs, in the same order, as arrays."""

    step_time_s: np.ndarray
    gpu_energy_j: np.ndarray
    allocated_gpu_mem_gib: np.ndarray
    reserved_gpu_mem_gib: np.ndarray
    phase_time_s: dict[str, np.ndarray]


class RunEvaluator:
    """Predicts a fixed list of runs on any profile: one batch per workload, prepared once while the
    profile's GPU and memory figures stay (`models.predict.prepare`), each run on the host its probe
    measured (`MeasuredRun.on_its_host`, as a scale a run)."""

    def __init__(self, runs: list[MeasuredRun]):
        groups: dict[Workload, list[int]] = {}
        for i, run in enumerate(runs):
            groups.setdefault(run.workload, []).append(i)
        self.n = len(runs)
        self._groups = [(w, StrategyBatch.from_strategies([runs[i].strategy for i in idx]), np.asarray(idx))
                        for w, idx in groups.items()]
        self._probe_s = np.array([r.host_issue_per_layer_s or np.nan for r in runs], dtype=float)
        self._prepared: dict[int, Prepared] = {}

    def issue_scales(self, profile: HardwareProfile) -> np.ndarray:
        """Each run's `host_issue_scale` on its own host: its probe over the probe the issue constants were
        fitted at; 1 for a run without a probe (it ran where they were fitted) or a profile without that anchor."""
        fitted_at = profile.overheads.issue_fitted_at_per_layer
        if fitted_at is None or not fitted_at.value > 0:
            return np.ones(self.n)
        probed = np.isfinite(self._probe_s) & (self._probe_s > 0)
        return np.where(probed, self._probe_s / fitted_at.value, 1.0)

    def __call__(self, profile: HardwareProfile) -> RunPredictions:
        step, energy, alloc, reserved = (np.empty(self.n) for _ in range(4))
        phases: dict[str, np.ndarray] = {}
        scales = self.issue_scales(profile)
        for g, (workload, batch, idx) in enumerate(self._groups):
            prepared = self._prepared.get(g)
            if prepared is None or not prepared.holds_for(profile):  # a fit moves time and power constants only
                prepared = self._prepared[g] = prepare(workload, batch, profile)
            tm, en = timed(prepared, profile, issue_scale=scales[idx])
            step[idx], energy[idx] = tm.step_time_s, en.gpu_energy_j
            alloc[idx] = prepared.memory.allocated_gpu_bytes / GIB
            reserved[idx] = prepared.memory.reserved_gpu_bytes / GIB
            for name, values in tm.phase_time_s.items():
                phases.setdefault(name, np.zeros(self.n))[idx] = values
        return RunPredictions(step, energy, alloc, reserved, phases)


def log_ratio(predicted: np.ndarray, measured: np.ndarray, bad: float = 5.0) -> np.ndarray:
    """log(predicted / measured); `bad` where the model gives no positive finite number."""
    ok = np.isfinite(predicted) & (predicted > 0)
    return np.where(ok, np.log(np.where(ok, predicted, 1.0) / measured), bad)


@dataclass(frozen=True)
class FittedParameter:
    """One constant after the fit: where it started, where it ended, and how sure the fit is."""

    name: str
    kind: str
    start: float
    value: float
    std: float | None  # Gauss-Newton standard error; None when not fitted
    informed: bool  # the runs move predictions when this constant moves; uninformed ones are kept


class ProfileFit:
    """Fit a profile's constants to measured runs (scikit-learn shape: settings in __init__,
    `fit` returns self, fitted state ends in _).

    Extrapolation is explicit: with `uninformed="keep"`, a constant that no run responds to (a
    ZeRO-3 hook cost when no ZeRO-3 run was measured) keeps its starting value and its source,
    so families the runs do not cover are predicted exactly as before the fit; `"fit"` lets the
    prior alone decide (the same value, but marked fitted). Past the measured sizes, the fitted
    constants are used as they are: the cost model's structure does the extrapolating.
    """

    def __init__(self, parameters: tuple[FitParameter, ...] | None = None, prior_strength: float = 1e-3,
                 loss: str = "soft_l1", f_scale: float = 0.1, max_nfev: int | None = None, tol: float = 1e-8,
                 min_effect: float = 1e-3, uninformed: str = "keep", fit_memory: bool = True,
                 energy_target: str = "power", data_note: str = "", released: tuple[str, ...] = (),
                 released_prior_strength: float = 1e-3):
        self.parameters = parameters
        self.prior_strength = prior_strength
        # Constants held by `released_prior_strength` instead (models.held_out.release_constants): the
        # prior per constant, where one strength for all kept every constant because some moved wrongly.
        self.released = released
        self.released_prior_strength = released_prior_strength
        self.loss = loss
        self.f_scale = f_scale
        self.max_nfev = max_nfev
        self.tol = tol
        self.min_effect = min_effect
        self.uninformed = uninformed
        self.fit_memory = fit_memory
        self.energy_target = energy_target
        self.data_note = data_note

    def get_params(self) -> dict:
        return {k: getattr(self, k) for k in ("parameters", "prior_strength", "loss", "f_scale", "max_nfev", "tol",
                                              "min_effect", "uninformed", "fit_memory", "energy_target", "data_note",
                                              "released", "released_prior_strength")}

    def _residual_functions(self, runs: list[MeasuredRun]) -> dict[str, tuple[np.ndarray, Callable]]:
        """For "time" and "energy": (which runs have that measurement, residuals(profile) over them).

        With `energy_target="power"` the energy residual is of average power (energy / step time,
        predicted against measured), so phase powers are not bent to make up for time errors."""
        evaluate = RunEvaluator(runs)
        measured_t = np.array([r.step_time_s for r in runs], dtype=float)
        has_e = np.array([r.gpu_energy_j is not None and r.gpu_energy_j > 0 for r in runs])
        measured_e = np.array([r.gpu_energy_j if h else 1.0 for r, h in zip(runs, has_e)], dtype=float)
        if self.energy_target == "power":
            def energy(p):
                pred = evaluate(p)
                return log_ratio(pred.gpu_energy_j[has_e] / pred.step_time_s[has_e], (measured_e / measured_t)[has_e])
        else:
            def energy(p):
                return log_ratio(evaluate(p).gpu_energy_j[has_e], measured_e[has_e])
        return {
            "time": (np.ones(len(runs), dtype=bool), lambda p: log_ratio(evaluate(p).step_time_s, measured_t)),
            "energy": (has_e, energy),
        }

    def effects(self, runs: list[MeasuredRun], profile: HardwareProfile) -> dict[str, np.ndarray]:
        """|change of each run's log residual| when each constant moves by its prior width, at
        `profile`'s values (0 for runs without that measurement). A constant no run responds to
        is not informed by the runs."""
        params = self.parameters or default_parameters(profile, runs)
        out = {}
        for kind, (mask, residuals) in self._residual_functions(runs).items():
            stage = [p for p in params if p.kind == kind]
            if not stage or not mask.any():
                out.update({p.name: np.zeros(len(runs)) for p in stage})
                continue
            x0 = np.array([get_value(profile, p.name) for p in stage])
            rows = _probe(stage, x0, lambda x, s=stage: with_values(profile, {p.name: v for p, v in zip(s, x)}), residuals)
            for j, p in enumerate(stage):
                out[p.name] = np.zeros(len(runs))
                out[p.name][mask] = rows[:, j]
        return out

    def fit(self, runs: list[MeasuredRun], base_profile: HardwareProfile, warm_start: dict[str, float] | None = None,
            informed: set[str] | None = None) -> ProfileFit:
        """Fit to `runs`, starting from `base_profile` (also the prior's centre). `warm_start` only
        moves the optimizer's starting point (a full fit's values, for leave-one-out); `informed`
        names the constants the runs inform, when already known (else each is probed)."""
        if not runs:
            raise ValueError("no measured runs to fit")
        assert self.uninformed in ("keep", "fit"), self.uninformed
        base_profile = anchored_to_its_host(prefit_profile(base_profile))
        params = self.parameters or default_parameters(base_profile, runs)
        start = {p.name: get_value(base_profile, p.name) for p in params}
        values, fitted = dict(start), {}
        self.nfev_ = 0
        self.held_out_log_ratio_: dict[str, np.ndarray] = {}
        functions = self._residual_functions(runs)
        for kind, (mask, residuals) in functions.items():
            stage = [p for p in params if p.kind == kind]
            if not stage or not mask.any():
                fitted.update({p.name: FittedParameter(p.name, kind, start[p.name], start[p.name], None, False)
                               for p in stage})
                continue
            fitted.update(self._fit_stage(stage, values, base_profile, residuals, start, warm_start or {}, informed))
            values.update({name: f.value for name, f in fitted.items()})
        if "energy" in self.held_out_log_ratio_ and "time" in self.held_out_log_ratio_ and self.energy_target == "power":
            # log energy = log power + log time, each as if left out
            self.held_out_log_ratio_["energy"] = (self.held_out_log_ratio_["energy"]
                                                  + self.held_out_log_ratio_["time"][functions["energy"][0]])

        self.offload_start_pool_ = offload_start_pool_of(runs, base_profile) if self.fit_memory else None
        start_ratio = (self.offload_start_pool_[0] if self.offload_start_pool_ is not None
                       else start_pool_ratio(base_profile.memory))
        self.fragmentation_ = fragmentation_of(runs, start_ratio) if self.fit_memory else None
        self.collective_pool_ = (collective_pool_of(runs, self.fragmentation_, base_profile, start_ratio)
                                 if self.fit_memory else None)
        self.host_process_ = self._host_process(runs) if self.fit_memory else None
        self.host_issue_ = typical_host_issue(runs)
        self.parameters_ = fitted
        self.values_ = {name: f.value for name, f in fitted.items() if f.informed}
        self.n_runs_ = len(runs)
        self.run_ids_ = [r.run_id for r in runs]
        self.profile_ = self._fitted_profile(base_profile, runs)
        return self

    def _fit_stage(self, stage, values, base, residuals, start, warm, known_informed) -> dict[str, FittedParameter]:
        lower = np.array([p.lower for p in stage])
        upper = np.array([p.upper for p in stage])
        scale = np.array([p.scale for p in stage])
        centre = np.clip([start[p.name] for p in stage], lower, upper)
        x0 = np.clip([warm.get(p.name, values[p.name]) for p in stage], lower, upper)
        # A constant sitting on its lower bound may sit where the residuals are flat (a host
        # floor hidden behind GPU work has no gradient): start it one prior width inside.
        x0 = np.where(x0 <= lower, np.minimum(lower + scale, upper), x0)

        def profile_at(x):
            return with_values(base, {**values, **{p.name: v for p, v in zip(stage, x)}})

        if known_informed is None:
            effects = _probe(stage, x0, profile_at, residuals)
            self.nfev_ += len(stage) + 1
            informed = np.max(effects, axis=0, initial=0.0) > self.min_effect
        else:
            informed = np.array([p.name in known_informed for p in stage])
        free = informed if self.uninformed == "keep" else np.ones(len(stage), dtype=bool)
        x_final, std = np.where(free, x0, centre), np.full(len(stage), np.nan)
        leverage = None
        if free.any():
            idx = np.flatnonzero(free)
            prior_w = np.sqrt([self.released_prior_strength if stage[j].name in self.released else self.prior_strength
                               for j in idx])

            def full(z):
                x = x_final.copy()
                x[idx] = z
                return np.concatenate([residuals(profile_at(x)), prior_w * (z - centre[idx]) / scale[idx]])

            result = least_squares(full, x0[idx], bounds=(lower[idx], upper[idx]), x_scale=scale[idx],
                                   method="trf", loss=self.loss, f_scale=self.f_scale, max_nfev=self.max_nfev,
                                   diff_step=1e-4, ftol=self.tol, xtol=self.tol, gtol=self.tol)
            self.nfev_ += int(result.nfev) + int(result.njev or 0) * len(idx)
            x_final[idx] = result.x
            n_data = len(result.fun) - len(idx)
            std[idx] = _standard_errors(result.jac, result.fun, n_data=n_data)
            leverage, r = _leverages(result.jac[:, result.active_mask == 0], n_data), result.fun[:n_data]
        else:
            r = residuals(profile_at(x_final))
        # Each run's residual had it been left out (leverage-corrected: r / (1 - h), the linearised
        # leave-one-out); a run that alone informs a constant has h near 1 and a large held-out error.
        self.held_out_log_ratio_[stage[0].kind] = r / (1.0 - np.minimum(0.0 if leverage is None else leverage,
                                                                         MAX_LEVERAGE))
        return {p.name: FittedParameter(p.name, p.kind, float(start[p.name]), float(x_final[j]),
                                        None if np.isnan(std[j]) else float(std[j]), bool(free[j]))
                for j, p in enumerate(stage)}

    @staticmethod
    def _host_process_runs(runs: list[MeasuredRun]) -> list[MeasuredRun]:
        return [r for r in runs if r.peak_host_mem_gib and r.strategy.offload_optimizer == "none"
                and r.strategy.offload_param == "none" and not r.strategy.cpu_checkpointing]

    @classmethod
    def _host_process(cls, runs: list[MeasuredRun]) -> float | None:
        """A training process's own host memory: median per rank over runs that offload nothing."""
        per_rank = [r.peak_host_mem_gib / r.strategy.gpus for r in cls._host_process_runs(runs)]
        return float(np.median(per_rank)) if per_rank else None

    def _fitted_profile(self, base: HardwareProfile, runs: list[MeasuredRun]) -> HardwareProfile:
        original = base
        date = datetime.now(timezone.utc).date().isoformat()
        n = len(runs)
        values, sources, how = {}, {}, {}
        for f in self.parameters_.values():
            if f.informed:
                spread = f" +- {f.std:.3g}" if f.std is not None else ""
                values[f.name] = f.value
                how[f.name] = f"{f.value:.4g}{spread} by least squares to {f.kind} of {n} measured runs"
        for name, (value, count) in (self.fragmentation_ or {}).items():
            values[name] = value
            runs_of_kind = FRAGMENTATION_FIELDS[name.removeprefix("memory.")]
            how[name] = (f"{value:.4g}, median over {count} {runs_of_kind} of torch (max_memory_reserved - "
                         "the start-up's blocks) / max_memory_allocated - 1")
        if self.offload_start_pool_ is not None:
            value, count = self.offload_start_pool_
            values["memory.offload_start_pool"] = value
            how["memory.offload_start_pool"] = (
                f"{value:.4g} x the bf16 trainable parameters, the multiple whose pool misses the {count} measured "
                "ZeRO-1/2 optimizer-offload runs' torch max_memory_reserved least, the shares refitted beside it")
        if self.collective_pool_ is not None:
            value, count = self.collective_pool_
            values["memory.collective_pool"] = value
            how["memory.collective_pool"] = (
                f"{value:.4g} GiB, median over {count} measured runs on more than one GPU of torch "
                "max_memory_reserved - max_memory_allocated x (1 + their fragmentation share) - the start-up's blocks")
        base = with_memory_nodes(base, values)
        if self.host_process_ is not None:
            values["memory.host_process_per_rank"] = self.host_process_
            how["memory.host_process_per_rank"] = (
                f"{self.host_process_:.4g}, median per rank over {len(self._host_process_runs(runs))} measured runs "
                "without offload of peak resident host memory")
        if self.host_issue_ is not None:
            value, count = self.host_issue_
            base = _with_host_issue(base)
            values["host.issue_per_layer"] = value
            how["host.issue_per_layer"] = (f"{value * 1e6:.4g} us, the median host probe of the {count} probed runs: "
                                           "the typical host, where a prediction has no probe of its own (a "
                                           "calibration's one reading scattered 1.4x from its runs' on one H100)")
        prefit = {name: getattr_path(original, name) for name in how}
        for name, text in how.items():
            sources[name] = f"fitted: {text} (advisor fit, {date})"
        profile = with_values(base, values, sources)
        kept = sorted(f.name for f in self.parameters_.values() if not f.informed)
        p = original.provenance
        notes = (f"Fitted by advisor fit on {date} from profile '{original.name}' ({p.kind}, {p.date}) to {n} measured "
                 f"runs{' from ' + self.data_note if self.data_note else ''} (their ids: fit.run_ids). Time constants "
                 "are fitted to step time, GPU power per phase to GPU energy (bounded log-ratio least squares, soft-L1 "
                 f"loss, prior towards the starting values of strength {self.prior_strength:g}"
                 + (f"; {', '.join(self.released)} at {self.released_prior_strength:g}" if self.released else "")
                 + "). "
                 + (f"Not informed by these runs, kept: {', '.join(kept)}. " if kept else "")
                 + "The values before the fit: fit.prefit.")
        provenance = p.model_copy(update={"kind": "fitted", "date": date, "notes": notes})
        record = FitRecord(date=date, run_ids=[r.run_id or "?" for r in runs], prefit=prefit, prefit_provenance=p)
        return HardwareProfile.model_validate(
            profile.model_copy(update={"provenance": provenance, "fit": record}).model_dump())


MIN_PROBED_RUNS = 3  # fewer probes leave the profile's own host reading as it is


def typical_host_issue(runs: list[MeasuredRun]) -> tuple[float, int] | None:
    """(median host probe in seconds a layer, probed runs) over the runs that probed their host; None
    under `MIN_PROBED_RUNS`. One probe scatters (a host's spells: +-16% a run on one host), so the profile
    takes its runs' median, not its calibration's single reading."""
    probes = [r.host_issue_per_layer_s for r in runs if r.host_issue_per_layer_s]
    return (float(np.median(probes)), len(probes)) if len(probes) >= MIN_PROBED_RUNS else None


def _with_host_issue(profile: HardwareProfile) -> HardwareProfile:
    """The profile with a host probe quantity to set (a copy of the same one, or a new one at 0)."""
    if profile.host.issue_per_layer is not None:
        return profile
    return profile.model_copy(update={"host": profile.host.model_copy(update={
        "issue_per_layer": Quantity(value=0.0, unit="s", source="not measured")})})


def prefit_profile(profile: HardwareProfile) -> HardwareProfile:
    """The profile as it was before `advisor fit` (values, sources, provenance); others unchanged.

    Fitting starts from here, so refitting a fitted profile never stacks one fit on another,
    and a leave-one-out from a shipped fitted profile does not start from values its held-out
    runs helped to make."""
    if profile.fit is None:
        return profile
    data = profile.model_dump()
    for name, quantity in profile.fit.prefit.items():
        *path, last = name.split(".")
        node = data
        for key in path:
            node = node[key]
        node[last] = None if quantity is None else quantity.model_dump()
    data.update(provenance=profile.fit.prefit_provenance.model_dump(), fit=None)
    return HardwareProfile.model_validate(data)


def anchored_to_its_host(profile: HardwareProfile) -> HardwareProfile:
    """The profile with its issue constants tied to its own host's probe, where they are not tied
    yet: where a fit starts the probe reading of the runs without a probe of their own
    (`ISSUE_ANCHOR`); it scales the others by their probes (`HardwareProfile.host_issue_scale`)."""
    here = profile.host.issue_per_layer
    if profile.overheads.issue_fitted_at_per_layer is not None or here is None:
        return profile
    anchor = here.model_copy(update={"source": f"the profile's host probe, where runs without one are taken to have "
                                               f"run ({here.source})"})
    return profile.model_copy(update={"overheads": profile.overheads.model_copy(
        update={"issue_fitted_at_per_layer": anchor})})


def fitted_run_ids(profile: HardwareProfile) -> set[str]:
    """The ids of the runs a fitted profile was fitted to (its latest fit)."""
    return set(profile.fit.run_ids) - {"?"} if profile.fit else set()


def _probe(stage: list[FitParameter], x0: np.ndarray, profile_at: Callable, residuals: Callable) -> np.ndarray:
    """|residual change| per run (rows) when each constant (columns) moves by its prior width.

    A finite step rather than a derivative, so a constant that only matters past a regime change
    (contention, once communication outlasts compute) is still seen."""
    r0 = residuals(profile_at(x0))
    out = np.zeros((len(r0), len(stage)))
    for j, p in enumerate(stage):
        x = x0.copy()
        x[j] = p.moved(x[j])
        out[:, j] = np.abs(residuals(profile_at(x)) - r0)
    return out


MAX_LEVERAGE = 0.95  # past it the linearisation says nothing: the run's error is taken as 20x its residual


def _leverages(jac: np.ndarray, n_data: int) -> np.ndarray:
    """The hat matrix's diagonal for the data rows, J_d (J^T J)^+ J_d^T, with the prior's rows in J (a
    constant the prior holds is not free to follow one run) and the loss's weights (least_squares'
    modified Jacobian)."""
    if jac.shape[1] == 0:
        return np.zeros(n_data)
    inverse = np.linalg.pinv(jac.T @ jac)
    data = jac[:n_data]
    return np.clip(np.einsum("ij,jk,ik->i", data, inverse, data), 0.0, None)


def _standard_errors(jac: np.ndarray, fun: np.ndarray, n_data: int) -> np.ndarray:
    """Gauss-Newton standard errors: sqrt(diag((J^T J)^-1) * residual variance)."""
    dof = max(n_data - jac.shape[1], 1)
    variance = float(np.sum(fun[:n_data] ** 2)) / dof
    cov = np.linalg.pinv(jac.T @ jac) * variance
    return np.sqrt(np.clip(np.diag(cov), 0.0, None))
