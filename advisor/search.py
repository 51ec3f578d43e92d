"""Search the strategy space for the time/energy Pareto front and pick one point.

Two searches over the same `Space`: Optuna's multi-objective samplers (time, energy),
with memory and static refusals as constraints through `trial.set_constraint` (so an
infeasible point never reaches `study.best_trials`), and an exhaustive sweep that predicts
every point at once with `predict_batch`, for comparison. Objectives cover the whole run of
`tokens` tokens: with a fixed GPU count that ranks exactly as per-step figures do, and
when the GPU count is searched it charges more GPUs for the energy they spend.
"""
from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from advisor.space import Space
from advisor.strategy_flags import flags_for
from advisor.study_storage import MirroredStudy
from models.architecture import Architecture
from models.strategy import Strategy, StrategyBatch

OBJECTIVES = ("energy", "time", "edp")
# Optuna trials: enough that the pick lands within 1% of the exhaustive optimum in the
# benchmark scenarios (benchmarks/bench_advisor.py); a searched GPU count doubles the space's reach.
DEFAULT_TRIALS = 600
DEFAULT_TRIALS_GPU_RANGE = 1200
# The most a search may ask for: a hundred times the default, a search of hours. Beyond it a typo
# (--trials 10000000) ran without end.
MAX_TRIALS = 100_000
# `--search auto` predicts every strategy when the space holds at most this many: exact, and under a
# second at the model's ~300,000 strategies/s. Optuna missed the optimum there with 4 of 10 seeds
# (7B at 32k on one node, 2,625 strategies, 600 trials; benchmarks/bench_advisor.py).
EXHAUSTIVE_MAX_STRATEGIES = 50_000


def auto_method(points: StrategyBatch) -> str:
    """`exhaustive` where the whole space (its enumerated `points`) is cheap to predict, else `optuna`."""
    return "exhaustive" if len(points) <= EXHAUSTIVE_MAX_STRATEGIES else "optuna"


METRICS = ("step_time_s", "energy_j", "gpu_energy_j", "cpu_energy_j", "peak_gpu_mem_gib", "reserved_gpu_mem_gib",
           "peak_host_mem_gib", "host_share")
CONSTRAINTS = ("gpu_memory", "host_memory", "static", "other")


class NothingFeasibleError(ValueError):
    """No point of the space fits; the message names the closest miss with its numbers."""


@dataclass(frozen=True)
class Problem:
    """What is searched: a space, how to predict a batch of it, and the run it serves.

    `evaluate(batch)` returns an object with numpy arrays named as in METRICS plus
    `feasible`, and `reasons(i)`; `models.predict.predict_batch` does, bound to a workload
    and profile. Capacities scale the memory constraints."""

    space: Space
    arch: Architecture
    seq_len: int
    tokens: int
    evaluate: Callable[[StrategyBatch], object]
    gpu_memory_gib: float
    host_memory_gib: float
    key: str  # names the workload and profile, for study names
    gpu_memory_margin: float = 0.0  # share of GPU memory a pick leaves free (the prediction's error)

    @property
    def usable_gpu_memory_gib(self) -> float:
        return self.gpu_memory_gib * (1.0 - self.gpu_memory_margin)


@dataclass
class Candidates:
    """Evaluated strategies as columns; `run_*` cover the whole run of `tokens`."""

    strategies: list[Strategy]
    metrics: dict[str, np.ndarray]
    feasible: np.ndarray
    violation: np.ndarray  # summed positive constraint values: 0 when feasible
    run_time_s: np.ndarray
    run_energy_j: np.ndarray
    steps: np.ndarray

    def __len__(self) -> int:
        return len(self.strategies)


@dataclass
class SearchResult:
    method: str
    candidates: Candidates
    pareto: list[int]  # indices into candidates, fastest first
    pick: int
    evaluations: int
    study_name: str | None = None
    study: object | None = None  # the optuna Study, for callers who want the raw trials
    notes: list[str] = field(default_factory=list)
    trials_before: int = 0  # trials a resumed study already held (0: a new study)
    trials_total: int = 0  # trials the study holds now (this run's and earlier ones)

    def point(self, i: int, seq_len: int) -> dict:
        """Candidate i as the JSON of `recommend` shows it: strategy, flags and predicted metrics."""
        c = self.candidates
        s = c.strategies[i]
        m = {k: float(v[i]) for k, v in c.metrics.items()}
        return {
            "label": s.label(),
            "strategy": asdict(s),
            "predict_flags": flags_for(s),
            **m,
            "tokens_per_s": s.global_batch * seq_len / m["step_time_s"],
            "global_batch": s.global_batch,
            "steps": int(c.steps[i]),
            "run_time_s": float(c.run_time_s[i]),
            "run_energy_j": float(c.run_energy_j[i]),
        }


def run_steps(problem: Problem, global_batch: np.ndarray) -> np.ndarray:
    """Optimizer steps to train `tokens` tokens at this many sequences per step."""
    return np.ceil(problem.tokens / (np.asarray(global_batch) * problem.seq_len))


def constraint_values(problem: Problem, pred, static_count: np.ndarray) -> dict[str, np.ndarray]:
    """Constraint values (<= 0 feasible): memory as a fraction over capacity (GPU memory less the
    problem's margin), the number of static refusals, and `other` for anything else the model
    refused. The model's own `feasible` flag and the margin are the truth: feasible points get no
    positive value."""
    peak = np.asarray(pred.peak_gpu_mem_gib, dtype=float)
    feasible = np.asarray(pred.feasible, dtype=bool) & (static_count == 0) & (peak <= problem.usable_gpu_memory_gib)
    gpu = peak / problem.usable_gpu_memory_gib - 1.0
    host = np.asarray(pred.peak_host_mem_gib, dtype=float) / problem.host_memory_gib - 1.0
    values = {"gpu_memory": gpu, "host_memory": host, "static": static_count.astype(float)}
    values = {k: np.where(feasible, np.minimum(np.nan_to_num(v, nan=0.0), 0.0), np.nan_to_num(v, nan=1.0))
              for k, v in values.items()}
    explained = (values["gpu_memory"] > 0) | (values["host_memory"] > 0) | (values["static"] > 0)
    values["other"] = np.where(~feasible & ~explained, 1.0, 0.0)
    return values


def _finite(x: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(x), x, 1e300)


def pareto_front(time_s: np.ndarray, energy_j: np.ndarray, feasible: np.ndarray) -> list[int]:
    """Indices of feasible points no other feasible point dominates, fastest first;
    of identical points only the first is kept."""
    idx = np.flatnonzero(feasible)
    order = idx[np.lexsort((energy_j[idx], time_s[idx]))]
    front, best_energy = [], math.inf
    for i in order:
        if energy_j[i] < best_energy:
            front.append(int(i))
            best_energy = energy_j[i]
    return front


def pick(time_s: np.ndarray, energy_j: np.ndarray, front: list[int], objective: str, max_slowdown: float) -> int:
    """The front point that best serves `objective` within `max_slowdown` of the fastest."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    fastest = min(time_s[i] for i in front)
    allowed = [i for i in front if time_s[i] <= fastest * (1 + max_slowdown) * (1 + 1e-12)]
    key = {
        "time": lambda i: (time_s[i], energy_j[i]),
        "energy": lambda i: (energy_j[i], time_s[i]),
        "edp": lambda i: (time_s[i] * energy_j[i], time_s[i]),
    }[objective]
    return min(allowed, key=key)


def _evaluate(problem: Problem, strategies: list[Strategy] | None, batch: StrategyBatch | None = None):
    """Predict a batch; returns (prediction, static refusal counts)."""
    if batch is None:
        batch = StrategyBatch.from_strategies(strategies)
        static = np.array([len(problem.space.reasons(s, problem.arch)) for s in strategies])
    else:
        static = np.zeros(len(batch), dtype=int)  # enumerate() lists only valid points
    return problem.evaluate(batch), static


def _candidates(problem: Problem, strategies: list[Strategy], metrics: dict, feasible, violation) -> Candidates:
    global_batch = np.array([s.global_batch for s in strategies])
    steps = run_steps(problem, global_batch)
    return Candidates(
        strategies=strategies,
        metrics=metrics,
        feasible=np.asarray(feasible, dtype=bool),
        violation=np.asarray(violation, dtype=float),
        run_time_s=metrics["step_time_s"] * steps,
        run_energy_j=metrics["energy_j"] * steps,
        steps=steps,
    )


def closest_miss(problem: Problem, cands: Candidates, searched: str) -> NothingFeasibleError:
    """The error for an empty front: the point that missed by least, with the model's numbers."""
    i = int(np.argmin(cands.violation))
    s = cands.strategies[i]
    pred, _ = _evaluate(problem, [s])
    reasons = list(pred.reasons(0)) or problem.space.reasons(s, problem.arch)
    peak = float(np.asarray(pred.peak_gpu_mem_gib)[0])
    if not reasons and peak > problem.usable_gpu_memory_gib:
        reasons = [f"needs {peak:.1f} GiB of GPU memory, has {problem.gpu_memory_gib:.1f} of which "
                   f"{problem.usable_gpu_memory_gib:.1f} may be used with a {problem.gpu_memory_margin:.0%} margin"]
    reasons = reasons or ["refused by the cost model"]
    gpus = f"{s.gpus} GPU" + ("s" if s.gpus > 1 else "")
    return NothingFeasibleError(
        f"nothing feasible for {problem.arch.name} at {problem.seq_len} tokens on {gpus} ({searched}); "
        f"the closest, {s.label()}, {'; '.join(reasons)}"
    )


def exhaustive_search(problem: Problem, objective: str = "energy", max_slowdown: float = 0.10,
                      progress: Callable[[int, int], None] | None = None, chunk: int = 20_000,
                      points: StrategyBatch | None = None) -> SearchResult:
    """Predict every valid point of the space (vectorised, in chunks for the progress bar); `points`
    is the space already enumerated, where the caller has it."""
    full = points if points is not None else problem.space.enumerate(problem.arch)
    n = len(full)
    if n == 0:
        raise NothingFeasibleError("the strategy space is empty: no GPU count, sp and micro-batch fit together")
    parts = []
    for start in range(0, n, chunk):
        sl = slice(start, min(n, start + chunk))
        part = StrategyBatch(**{k: v[sl] for k, v in vars(full).items()})
        pred, static = _evaluate(problem, None, part)
        cons = constraint_values(problem, pred, static)
        violation = sum(np.maximum(v, 0) for v in cons.values())
        parts.append(({m: np.asarray(getattr(pred, m), dtype=float) for m in METRICS}, violation == 0, violation))
        if progress:
            progress(sl.stop, n)
    metrics = {m: np.concatenate([p[0][m] for p in parts]) for m in METRICS}
    feasible = np.concatenate([p[1] for p in parts])
    violation = np.concatenate([p[2] for p in parts])
    strategies = [full.strategy(i) for i in range(n)]
    cands = _candidates(problem, strategies, metrics, feasible, violation)
    front = pareto_front(cands.run_time_s, cands.run_energy_j, cands.feasible)
    if not front:
        raise closest_miss(problem, cands, f"all {n} strategies")
    return SearchResult("exhaustive", cands, front, pick(cands.run_time_s, cands.run_energy_j, front, objective,
                                                         max_slowdown), evaluations=n)


def study_name(problem: Problem) -> str:
    """Same problem, same name: a study in shared storage resumes only the same search."""
    return f"advisor-{problem.key}-tokens{problem.tokens}-space{problem.space.fingerprint()}"


def optuna_search(problem: Problem, trials: int, objective: str = "energy", max_slowdown: float = 0.10,
                  storage: str | None = None, seed: int | None = 0, batch: int = 20,
                  polish: float = 0.5, progress: Callable[[int, int], None] | None = None) -> SearchResult:
    """Multi-objective (run time, run energy) Optuna study, asked and told in batches so each
    batch is one vectorised prediction. With `storage` the study resumes (SQLite) or is
    shared between workers (PostgreSQL), mirrored batch by batch (advisor.study_storage); the
    front covers every trial the study holds.

    The last `polish` share of the trials goes to points one or two parameters away from the
    front, near the pick first (enqueued with `study.enqueue_trial`): the sampler finds the
    region, the neighbours settle the exact point."""
    import optuna
    from optuna.distributions import CategoricalDistribution

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.NSGAIISampler(seed=seed, population_size=batch)
    mirror = MirroredStudy(study_name(problem), storage, sampler, ["minimize", "minimize"])
    study = mirror.local
    dists = {k: CategoricalDistribution(list(v)) for k, v in problem.space.choices().items()}
    seen = _seen_points(study)
    before = len(study.get_trials(deepcopy=False))
    notes = ([f"resumed study '{study.study_name}': {before} earlier trials, {len(seen)} distinct strategies"]
             if before else [])
    explore = trials - int(trials * polish)
    done = 0
    while done < trials:
        n = min(batch, trials - done)
        if done >= explore:
            _enqueue_neighbours(study, problem.space, seen, objective, max_slowdown, n)
        asked = [study.ask(dists) for _ in range(n)]
        _tell(problem, mirror, asked, seen)
        if mirror.sync():
            seen = _seen_points(study)  # other workers' trials came in
        done += n
        if progress:
            progress(done, trials)
    result = _result_from_study(problem, study, objective, max_slowdown, done)
    result.notes.extend(notes)
    result.trials_before, result.trials_total = before, len(study.get_trials(deepcopy=False))
    return result


def _tell(problem: Problem, study: MirroredStudy, asked: list, seen: dict) -> None:
    """Predict the asked trials at once; set their constraints and metrics; tell the values."""
    strategies = [problem.space.strategy(t.params) for t in asked]
    pred, static = _evaluate(problem, strategies)
    cons = constraint_values(problem, pred, static)
    steps = run_steps(problem, np.array([s.global_batch for s in strategies]))
    run_time = _finite(np.asarray(pred.step_time_s, dtype=float) * steps)
    run_energy = _finite(np.asarray(pred.energy_j, dtype=float) * steps)
    for j, trial in enumerate(asked):
        for cname in CONSTRAINTS:
            trial.set_constraint(cname, float(cons[cname][j]))
        record = {m: float(np.asarray(getattr(pred, m))[j]) for m in METRICS}
        record["feasible"] = all(cons[cname][j] <= 0 for cname in CONSTRAINTS)
        trial.set_user_attr("metrics", record)
        study.tell(trial, [float(run_time[j]), float(run_energy[j])])
        seen[_params_key(trial.params)] = (float(run_time[j]), float(run_energy[j]), record["feasible"])


def _seen_points(study) -> dict[str, tuple[float, float, bool]]:
    """Points the study already holds (a resumed or shared study): params -> (time, energy, feasible)."""
    from optuna.trial import TrialState

    return {_params_key(t.params): (t.values[0], t.values[1], all(v <= 0 for v in t.constraints.values()))
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))}


# Parameters whose best values move together (memory and batch tie them): two-parameter
# moves try these pairs first.
COUPLED = [("sp", "micro_batch"), ("gpus", "sp"), ("gpus", "micro_batch"), ("zero_offload", "checkpointing"),
           ("checkpointing", "micro_batch"), ("zero_offload", "micro_batch"), ("zero_offload", "sp")]


def _neighbours(params: dict, choices: dict, changes: int):
    """Points `changes` (1 or 2) parameters away from `params`; coupled pairs first."""
    names = list(choices)
    combos = list(itertools.combinations(names, changes))
    if changes == 2:
        first = [c for c in COUPLED if all(n in choices for n in c)]
        combos = first + [c for c in combos if c not in first and c[::-1] not in first]
    for picked in combos:
        options = [[v for v in choices[n] if v != params[n]] for n in picked]
        for values in itertools.product(*options):
            yield {**params, **dict(zip(picked, values))}


def _enqueue_neighbours(study, space: Space, seen: dict, objective: str, max_slowdown: float, limit: int) -> int:
    """Enqueue up to `limit` unseen points near the front: one parameter away from the pick,
    the fastest point (it sets the slowdown limit) and the rest of the front, then two
    parameters away from the pick and the fastest (sp and micro-batch move together)."""
    if not seen:
        return 0
    keys = list(seen)
    time_s, energy_j, feasible = (np.array(col) for col in zip(*seen.values()))
    front = pareto_front(time_s, energy_j, feasible.astype(bool))
    if not front:
        return 0
    chosen = pick(time_s, energy_j, front, objective, max_slowdown)
    near = sorted(front, key=lambda i: abs(time_s[i] - time_s[chosen]))
    rounds = [(i, 1) for i in dict.fromkeys([chosen, front[0], *near])] + [(chosen, 2), (front[0], 2)]
    choices, queued = space.choices(), set()
    for i, changes in rounds:
        for candidate in _neighbours(json.loads(keys[i]), choices, changes):
            key = _params_key(candidate)
            if key in seen or key in queued:
                continue
            study.enqueue_trial(candidate)
            queued.add(key)
            if len(queued) >= limit:
                return len(queued)
    return len(queued)


def _params_key(params: dict) -> str:
    return json.dumps(params, sort_keys=True)


def _result_from_study(problem: Problem, study, objective: str, max_slowdown: float, evaluations: int) -> SearchResult:
    """Candidates from every completed trial (one per distinct point) and their front."""
    from optuna.trial import TrialState

    index: dict[str, int] = {}
    strategies, rows, feasible, violation = [], [], [], []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        key = _params_key(t.params)
        if key in index or "metrics" not in t.user_attrs:
            continue
        index[key] = len(strategies)
        strategies.append(problem.space.strategy(t.params))
        rows.append(t.user_attrs["metrics"])
        feasible.append(all(v <= 0 for v in t.constraints.values()))
        violation.append(sum(max(v, 0.0) for v in t.constraints.values()))
    # A study stored before a metric existed (host_share, 2026-12-02) lacks it: nan, "not known".
    metrics = {m: np.array([r.get(m, np.nan) for r in rows], dtype=float) for m in METRICS}
    cands = _candidates(problem, strategies, metrics, feasible, violation)
    # The front by Optuna's definition (`study.best_trials`: non-dominated among feasible
    # trials), computed here without the deep copy of every trial that property makes;
    # test_search checks the two agree. Identical points appear once.
    front = pareto_front(cands.run_time_s, cands.run_energy_j, cands.feasible)
    if not front:
        raise closest_miss(problem, cands, f"{len(cands)} distinct strategies in {evaluations} Optuna trials;"
                                            " try --search exhaustive or more --trials")
    return SearchResult("optuna", cands, front, pick(cands.run_time_s, cands.run_energy_j, front, objective,
                                                     max_slowdown), evaluations=evaluations,
                        study_name=study.study_name, study=study)
