"""How well a profile predicts real runs: stored run records in, an accuracy table out.

Records (from `data/runs/*.jsonl` or the SQLite store) become `models.measured_run.MeasuredRun`s; runs
that failed (oom, crash, timeout) cannot be compared and are counted, not used. The table gives,
per strategy family and overall, step-time and GPU-energy MAPE, the largest error, Spearman rank
correlation, and allocated GPU memory against torch's max_memory_allocated (like with like: the
prediction's `allocated_gpu_mem_gib`, not its peak with fragmentation and reserve), and torch's pool,
max_memory_reserved, against the predicted pool (`reserved_gpu_mem_gib`; runs of the default
allocator only, `runs.measured.default_allocator_reserved_gib`). The ranking
check asks what the advisor is for: in each group of alternatives (same model, context, inputs
and GPUs), is the strategy predicted to need the least energy per token within 3% of the best
measured one? `targets` compares all this with the project's targets, PASS or MISS.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.stats import spearmanr

from models.band import regime_of
from models.fit import RunEvaluator
from models.measured_run import MeasuredRun
from models.held_out import HeldOutPrediction
from models.predict import predict
from models.profile import HardwareProfile

@dataclass(frozen=True)
class Compared:
    """One run, measured and predicted (per optimizer step)."""

    run: MeasuredRun
    step_time_s: float
    gpu_energy_j: float
    allocated_gpu_mem_gib: float
    # of the step on the host, as the profile predicts it for a user (models.band); nan: not known
    host_share: float = float("nan")
    reserved_gpu_mem_gib: float = float("nan")  # torch's pool; nan: not predicted

    def measured(self, metric: str) -> float | None:
        """The run's figure of `metric` (time, energy, memory: allocated, reserved: torch's pool)."""
        return {"time": self.run.step_time_s, "energy": self.run.gpu_energy_j, "memory": self.run.peak_gpu_mem_gib,
                "reserved": self.run.peak_gpu_reserved_gib}[metric]

    def error(self, metric: str) -> float | None:
        """(predicted - measured) / measured; None when not measured."""
        measured = self.measured(metric)
        predicted = {"time": self.step_time_s, "energy": self.gpu_energy_j, "memory": self.allocated_gpu_mem_gib,
                     "reserved": self.reserved_gpu_mem_gib}[metric]
        if measured is None or not measured > 0 or not np.isfinite(predicted):
            return None
        return float((predicted - measured) / measured)


def compare_as_is(runs: list[MeasuredRun], profile: HardwareProfile) -> list[Compared]:
    """Predictions of `profile` as it is (in-sample if it was fitted to these runs)."""
    p = RunEvaluator(runs)(profile)
    return [Compared(r, float(p.step_time_s[i]), float(p.gpu_energy_j[i]), float(p.allocated_gpu_mem_gib[i]),
                     user_host_share(r, profile), float(p.reserved_gpu_mem_gib[i])) for i, r in enumerate(runs)]


def compare_held_out(held: list[HeldOutPrediction]) -> list[Compared]:
    """Leave-one-out predictions (`models.fit.leave_one_out`) as comparisons."""
    return [Compared(h.run, h.step_time_s, h.gpu_energy_j, h.allocated_gpu_mem_gib, user_host_share(h.run, h.profile),
                     h.reserved_gpu_mem_gib) for h in held]


def user_host_share(run: MeasuredRun, profile: HardwareProfile) -> float:
    """The run's host share as `profile` predicts it at the profile's own host, not the run's: what
    picks a user's band (models.band's regimes)."""
    return predict(run.workload, run.strategy, profile).host_share


@dataclass(frozen=True)
class ErrorStats:
    n: int
    mape: float | None  # mean |relative error|
    max_abs: float | None  # largest |relative error|
    worst: str  # the run with the largest error
    spearman: float | None  # rank correlation of predicted and measured (None under 3 runs)


def _spearman(predicted, measured) -> float | None:
    """Rank correlation; None where it is undefined (a constant column)."""
    if np.ptp(predicted) == 0 or np.ptp(measured) == 0:
        return None
    return float(spearmanr(predicted, measured).statistic)


def error_stats(compared: list[Compared], metric: str) -> ErrorStats:
    pairs = [(c, c.error(metric)) for c in compared]
    pairs = [(c, e) for c, e in pairs if e is not None]
    if not pairs:
        return ErrorStats(0, None, None, "", None)
    errors = np.array([e for _, e in pairs])
    worst = int(np.argmax(np.abs(errors)))
    rho = None
    if len(pairs) >= 3:
        meas = [c.measured(metric) for c, _ in pairs]
        pred = [m * (1 + e) for m, (_, e) in zip(meas, pairs)]
        rho = _spearman(pred, meas)
    return ErrorStats(len(pairs), float(np.mean(np.abs(errors))), float(np.abs(errors).max()),
                      pairs[worst][0].run.label, rho)


@dataclass(frozen=True)
class FamilyRow:
    family: str
    n: int
    time: ErrorStats
    energy: ErrorStats
    memory: ErrorStats  # allocated, like with like
    reserved: ErrorStats  # torch's pool against the predicted pool


@dataclass(frozen=True)
class RankCheck:
    """In one group of alternatives: the least-predicted-energy pick against the best measured."""

    group: str
    n: int
    pick: str
    best: str
    regret: float  # measured energy per token of the pick / the least measured - 1
    spearman: float | None  # of energy per token within the group


def rank_checks(compared: list[Compared]) -> list[RankCheck]:
    groups: dict[tuple, list[Compared]] = {}
    for c in compared:
        if c.run.gpu_energy_j is not None and np.isfinite(c.gpu_energy_j):
            groups.setdefault(c.run.group, []).append(c)
    out = []
    for key, members in groups.items():
        if len(members) < 2:
            continue
        meas = np.array([c.run.gpu_energy_j / c.run.tokens_per_step for c in members])
        pred = np.array([c.gpu_energy_j / c.run.tokens_per_step for c in members])
        pick, best = int(np.argmin(pred)), int(np.argmin(meas))
        rho = _spearman(pred, meas) if len(members) >= 3 else None
        inputs = f" {key[3]}f" if key[3] else (f" {key[2]}img" if key[2] else "")
        if inputs:
            inputs += " trained" if key[5] else " frozen"
        name = f"{key[0]} seq {key[1]} {key[6]} GPU{inputs}"
        out.append(RankCheck(name, len(members), members[pick].run.strategy.label(),
                             members[best].run.strategy.label(), float(meas[pick] / meas[best] - 1),
                             rho))
    return out


@dataclass(frozen=True)
class Target:
    name: str
    value: float | None
    limit: float
    passed: bool | None  # None: nothing measured to check
    strict: bool = False  # value < limit rather than <=

    @property
    def verdict(self) -> str:
        return {True: "PASS", False: "MISS", None: "n/a"}[self.passed]


@dataclass(frozen=True)
class AccuracyReport:
    mode: str  # "leave-one-out" or "as-is"
    profile: str
    families: list[FamilyRow]  # "all" first
    ranks: list[RankCheck]
    targets: list[Target]
    compared: list[Compared] = field(repr=False)
    # across families: by GPU count, multimodal, GPU-bound and host-bound steps (models.band's regimes)
    slices: list[FamilyRow] = field(default_factory=list)

    def to_dict(self) -> dict:
        def stats(s: ErrorStats) -> dict:
            return {"n": s.n, "mape": s.mape, "max_abs_error": s.max_abs, "worst_run": s.worst, "spearman": s.spearman}

        def row(f: FamilyRow) -> dict:
            return {"family": f.family, "n": f.n, "step_time": stats(f.time), "gpu_energy": stats(f.energy),
                    "allocated_gpu_mem": stats(f.memory), "reserved_gpu_mem": stats(f.reserved)}

        return {
            "mode": self.mode, "profile": self.profile,
            "families": [row(f) for f in self.families],
            "slices": [row(f) for f in self.slices],
            "ranking": [vars(r) for r in self.ranks],
            "targets": [{"name": t.name, "value": t.value, "limit": t.limit, "verdict": t.verdict} for t in self.targets],
            "runs": [{"run_id": c.run.run_id, "label": c.run.label, "family": c.run.family,
                      "measured": {"step_time_s": c.run.step_time_s, "gpu_energy_j": c.run.gpu_energy_j,
                                   "peak_gpu_mem_gib": c.run.peak_gpu_mem_gib,
                                   "peak_gpu_reserved_gib": c.run.peak_gpu_reserved_gib},
                      "predicted": {"step_time_s": c.step_time_s, "gpu_energy_j": c.gpu_energy_j,
                                    "allocated_gpu_mem_gib": c.allocated_gpu_mem_gib,
                                    "reserved_gpu_mem_gib": c.reserved_gpu_mem_gib
                                    if np.isfinite(c.reserved_gpu_mem_gib) else None}} for c in self.compared],
        }


def targets(overall: FamilyRow, ranks: list[RankCheck]) -> list[Target]:
    """The project's accuracy targets (issue 4): MAPE <= 5%, worst < 15%, memory within 10%, pick within 3%;
    and issue 12's: the reserved pool within 10% of torch's."""
    def check(name, value, limit, strict=False):
        if value is None:
            return Target(name, None, limit, None, strict)
        return Target(name, value, limit, value < limit if strict else value <= limit, strict)

    worst_regret = max((r.regret for r in ranks), default=None)
    return [
        check("step time MAPE", overall.time.mape, 0.05),
        check("GPU energy MAPE", overall.energy.mape, 0.05),
        check("worst step time error", overall.time.max_abs, 0.15, strict=True),
        check("worst GPU energy error", overall.energy.max_abs, 0.15, strict=True),
        check("worst allocated GPU memory error", overall.memory.max_abs, 0.10),
        check("worst reserved pool error (the predicted pool against max_memory_reserved)", overall.reserved.max_abs, 0.10),
        check("least-energy pick vs best measured (worst group)", worst_regret, 0.03),
    ]


def accuracy_report(compared: list[Compared], mode: str, profile: str) -> AccuracyReport:
    by_family: dict[str, list[Compared]] = {}
    for c in compared:
        by_family.setdefault(c.run.family, []).append(c)

    def row(name, members):
        return FamilyRow(name, len(members), error_stats(members, "time"), error_stats(members, "energy"),
                         error_stats(members, "memory"), error_stats(members, "reserved"))

    by_gpus: dict[int, list[Compared]] = {}
    for c in compared:
        by_gpus.setdefault(c.run.strategy.gpus, []).append(c)
    vision = [c for c in compared if c.run.workload.arch.vision is not None]
    overall = row("all", compared)
    rows = [overall] + [row(name, by_family[name]) for name in sorted(by_family)]
    slices = [row(f"{n} GPU{'s' if n > 1 else ''}", by_gpus[n]) for n in sorted(by_gpus)]
    slices += [row("multimodal", vision)] if vision else []
    for regime, name in (("gpu_bound", "GPU-bound steps"), ("host_bound", "host-bound steps")):
        members = [c for c in compared if np.isfinite(c.host_share) and regime_of(c.host_share) == regime]
        slices += [row(name, members)] if members else []
    ranks = rank_checks(compared)
    return AccuracyReport(mode, profile, rows, ranks, targets(overall, ranks), compared, slices)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _rho(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def format_report(report: AccuracyReport) -> str:
    """Plain-text tables: errors per family, the ranking groups, and the targets."""
    head = (f"{'family':<22}{'n':>4}  {'time MAPE':>9} {'max':>7} {'rho':>5}  {'energy MAPE':>11} {'max':>7} "
            f"{'rho':>5}  {'mem MAPE':>8} {'max':>7}  {'pool MAPE':>9} {'max':>7}")
    lines = [f"Accuracy ({report.mode}) of {report.profile}", head, "-" * len(head)]
    for f in report.families[:1] + report.slices + report.families[1:]:
        lines.append(f"{f.family:<22}{f.n:>4}  {_pct(f.time.mape):>9} {_pct(f.time.max_abs):>7} {_rho(f.time.spearman):>5}"
                     f"  {_pct(f.energy.mape):>11} {_pct(f.energy.max_abs):>7} {_rho(f.energy.spearman):>5}"
                     f"  {_pct(f.memory.mape):>8} {_pct(f.memory.max_abs):>7}"
                     f"  {_pct(f.reserved.mape):>9} {_pct(f.reserved.max_abs):>7}")
    overall = report.families[0]
    for metric, stats in (("time", overall.time), ("energy", overall.energy), ("memory", overall.memory),
                          ("reserved pool", overall.reserved)):
        if stats.worst:
            lines.append(f"worst {metric}: {stats.worst}")
    if report.ranks:
        lines += ["", "Least predicted energy per token in each group of alternatives:"]
        for r in report.ranks:
            lines.append(f"  {r.group} ({r.n} runs): pick {r.pick}; best measured {r.best}; "
                         f"regret {_pct(r.regret)}; rho {_rho(r.spearman)}")
    lines += ["", "Targets:"]
    for t in report.targets:
        lines.append(f"  {t.verdict:<4} {t.name}: {_pct(t.value)} (target {'<' if t.strict else '<='} {_pct(t.limit)})")
    return "\n".join(lines)
