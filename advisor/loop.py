"""The closed loop: measure the candidates the model cannot tell apart, pick by measurement.

The search narrows thousands of strategies to a few; those few often differ by less than the
model's error. So `recommend --validate K` runs up to K of them for a few steps on the local GPUs:

1. the pick;
2. the fastest strategy, whose measured time sets the slowdown limit the pick must keep;
3. strategies statistically tied with the pick: their prediction band on the objective overlaps
   the pick's, and they could be within the slowdown limit (each strategy's band is that of steps
   with as much of their time on the host: narrow for GPU-bound steps, wide for host-bound ones);
4. for diversity, the best of each family the user would weigh (offload or not, checkpointing,
   each sp, each GPU count) that could be within the limit.

Each is predicted first and stored as it finishes (`advisor.validate`, `runs.store`); a rerun of
the same command runs only what is not stored. The measured least-energy strategy (or fastest, or
least energy-delay product) within the slowdown limit of the fastest measured becomes the pick.
Those a first round cannot rank (within the tie margin of the pick, by default how far one run each
of two equal candidates of their regimes comes apart on one host: `advisor.rounds`) run again in
later rounds, interleaved; the pick then compares each candidate over its rounds with the rounds'
drift taken out (`advisor.rounds.round_adjusted`: the geometric mean of its rounds when every
candidate ran every round), and the pick's lead over each comes with its standard error.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np

from advisor.alternatives import alternatives
from advisor.rounds import (DEFAULT_ROUNDS, Lead, contenders, lead, repeat_margin, round_adjusted,
                            round_order)
from advisor.search import SearchResult
from calibration.harness.window import WindowSettings
from models.band import Band, regime_of
from runs.record import RunRecord, geometric_mean


@dataclass(frozen=True)
class Chosen:
    """A strategy the loop measures, and why it was chosen."""

    index: int  # into the search result's candidates
    why: str


def _log_band(band: Band | None, objective: str, host_share: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each candidate's (low, high) log ratio for the objective's figure, from the band of steps with
    as much of their time on the host; (0, 0) without a band."""
    zeros = np.zeros(len(host_share))
    if band is None:
        return zeros, zeros
    low, high = zeros.copy(), zeros.copy()
    for i, share in enumerate(host_share):
        b = band.for_share(float(share))
        t, e = (b.step_time_s.low_log, b.step_time_s.high_log), (b.gpu_energy_j.low_log, b.gpu_energy_j.high_log)
        low[i], high[i] = {"time": t, "energy": e, "edp": (t[0] + e[0], t[1] + e[1])}[objective]  # edp: ratios multiply
    return low, high


def choose(result: SearchResult, band: Band | None, objective: str, max_slowdown: float, k: int,
           unmeasured: dict[int, list] | None = None) -> list[Chosen]:
    """Up to `k` strategies to measure, most telling first (see the module docstring). `unmeasured` names,
    by candidate, the terms its prediction rests on that this machine never measured: after the pick and
    the fastest, the best candidate resting on each term they do not test comes first, since its run
    tests a price the model only assumed."""
    c = result.candidates
    t, e = c.run_time_s, c.run_energy_j
    value = {"time": t, "energy": e, "edp": t * e}[objective]
    feasible = np.flatnonzero(c.feasible)
    t_low, t_high = _log_band(band, "time", c.metrics["host_share"])
    fastest = int(feasible[np.argmin(t[feasible])])
    # Could it keep the slowdown limit? Its optimistic time against the fastest's pessimistic one.
    limit = t[fastest] * math.exp(t_high[fastest]) * (1 + max_slowdown)
    eligible = [int(i) for i in feasible if t[i] * math.exp(t_low[i]) <= limit]
    low, high = _log_band(band, objective, c.metrics["host_share"])
    pick = result.pick
    tied = sorted((i for i in eligible if value[i] * math.exp(low[i]) <= value[pick] * math.exp(high[pick])),
                  key=lambda i: value[i])
    out = [Chosen(pick, "the model's pick")]
    if t[pick] > t[fastest] * (1 + 1e-3):
        out.append(Chosen(fastest, "the fastest: its measured time sets the slowdown limit"))
    why_tied = "tied with the pick: their bands overlap"
    # Tied strategies of another kind first (ZeRO stage, offload, checkpointing, sp, micro-batch):
    # a variant of a measured one (overlap_comm alone, say) teaches least, so it waits its turn.
    kinds = {_kind(c.strategies[ch.index]) for ch in out}
    unmeasured = unmeasured or {}
    tested = {t.term for ch in out for t in unmeasured.get(ch.index, [])}
    for i in sorted(eligible, key=lambda i: value[i]):
        untested = [t.term for t in unmeasured.get(i, []) if t.term not in tested]
        if untested:  # its run tests a term no chosen run does
            tested.update(untested)
            kinds.add(_kind(c.strategies[i]))
            out.append(Chosen(i, "rests on unmeasured terms: " + ", ".join(t.split(".")[-1] for t in untested)))
    for i in tied:
        if _kind(c.strategies[i]) not in kinds:
            kinds.add(_kind(c.strategies[i]))
            out.append(Chosen(i, why_tied))
    eligible_set = set(eligible)
    for a in sorted(alternatives(result, objective, max_slowdown), key=lambda a: value[a.index]):
        if a.index in eligible_set:
            out.append(Chosen(a.index, f"best of its family ({a.family})"))
    out += [Chosen(i, why_tied) for i in tied]
    seen, unique = set(), []
    for chosen in out:
        strategy = c.strategies[chosen.index]
        if strategy not in seen:  # one strategy can come from several trials
            seen.add(strategy)
            unique.append(chosen)
    return unique[:k]


def _kind(s) -> tuple:
    """What makes two strategies different kinds of layout (not bucket sizes or overlap_comm; nor
    ZeRO-1 against ZeRO-2 with one data-parallel rank, where neither has anything to partition)."""
    stage = 1 if s.dp == 1 and s.zero_stage == 2 else s.zero_stage
    return (s.gpus, stage, s.offload_optimizer, s.offload_ratio, s.super_offload, s.offload_param,
            s.checkpoint_every, s.cpu_checkpointing, s.sp, s.micro_batch)


@dataclass(frozen=True)
class Measured:
    """One chosen strategy, as measured in each round it ran (None where it failed or was not run)."""

    chosen: Chosen
    record: RunRecord | None  # its first round's run (or the one stored before)
    repeats: tuple[RunRecord | None, ...] = ()  # its runs of later rounds, in round order (None: not run)
    not_run_reason: str = ""  # why its first round did not start (here: more host memory than this host has)

    @property
    def ok(self) -> bool:
        return self.record is not None and self.record.result.status == "ok"

    @property
    def rounds(self) -> list[RunRecord | None]:
        """Its run of each round it took part in, None where that run failed."""
        return [r if r and r.result.status == "ok" else None for r in (self.record, *self.repeats)] if self.ok else []

    @property
    def tokens_per_step(self) -> int:
        s, c = self.record.candidate.strategy, self.record.candidate
        return s["micro_batch"] * (s["gpus"] // s["sp"]) * s["grad_accum"] * c.seq_len

    def round_time_s(self) -> list[float | None]:
        return [r.result.step_time_s if r else None for r in self.rounds]

    def round_energy_j(self) -> list[float | None]:
        """GPU energy plus the host's (estimated where there is no sensor), as the objective counts it."""
        return [r.result.gpu_energy_j + (r.result.cpu_energy_j or 0.0) if r and r.result.gpu_energy_j is not None
                else None for r in self.rounds]

    @property
    def time_s(self) -> float | None:
        """The geometric mean over the rounds it ran."""
        return geometric_mean([t for t in self.round_time_s() if t]) if self.ok else None

    @property
    def energy_j(self) -> float | None:
        """The geometric mean over the rounds it ran; None where its first run has no GPU energy."""
        if not self.ok or self.record.result.gpu_energy_j is None:
            return None
        return geometric_mean([e for e in self.round_energy_j() if e])


@dataclass(frozen=True)
class Verdict:
    measured_pick: int | None  # into the Measured list; None when nothing ran ok
    by: str  # the measured figure the pick was chosen on
    regret: dict[int, float]  # Measured index -> its measured objective / the measured pick's - 1
    note: str
    leads: dict[int, Lead] = field(default_factory=dict)  # Measured index -> how far behind the pick, per round


def _per_round_scores(measured: list[Measured], by: str) -> dict[int, list[float | None]]:
    """Each measured candidate's figure per token, one a round it ran (None where it did not)."""
    def scored(t, e, tokens):
        if t is None or (by != "time" and e is None):
            return None
        return {"time": t / tokens, "energy": (e or 0.0) / tokens, "edp": t * (e or 0.0) / tokens**2}[by]

    return {i: [scored(t, e, m.tokens_per_step) for t, e in zip(m.round_time_s(), m.round_energy_j())]
            for i, m in enumerate(measured) if m.ok}


def _scores(measured: list[Measured], by: str) -> dict[int, float]:
    """Each measured candidate's figure per token over its rounds, the rounds' drift taken out
    (`advisor.rounds.round_adjusted`): what the pick compares."""
    return round_adjusted(_per_round_scores(measured, by))


def measured_pick(measured: list[Measured], objective: str, max_slowdown: float) -> Verdict:
    """The least measured energy (time, energy-delay) within `max_slowdown` of the fastest measured.
    Per step: the candidates share the workload, so per step ranks as the whole run does, up to
    the rounding of the global batch, which the ratio to tokens per step removes."""
    ok = [i for i, m in enumerate(measured) if m.ok]
    if not ok:
        return Verdict(None, objective, {}, "nothing was measured: no pick by measurement")
    by, note = objective, ""
    if objective in ("energy", "edp") and any(measured[i].energy_j is None for i in ok):
        by, note = "time", "GPU energy was not measured (no NVML here): picked by time"
    times = _scores(measured, "time")
    score = _scores(measured, by)
    fastest = min(times.values())
    allowed = [i for i in ok if times[i] <= fastest * (1 + max_slowdown) * (1 + 1e-12)]
    best = min(allowed, key=score.get)
    regret = {i: score[i] / score[best] - 1.0 for i in ok}
    per_round = _per_round_scores(measured, by)
    leads = {i: lead(per_round[best], per_round[i]) for i in ok if i != best}
    return Verdict(best, by, regret, note, {i: x for i, x in leads.items() if x is not None})


def to_contend(measured: list[Measured], verdict: Verdict, max_slowdown: float, tie_margin: float | None,
               regimes: list[str]) -> list[int]:
    """The measured candidates a first round cannot rank against the pick (`advisor.rounds.contenders`):
    within `tie_margin` of it, or where None, within how far one run each of two equal candidates of
    their regimes (`regimes`, one a measured candidate: gpu_bound or host_bound) comes apart."""
    pick = verdict.measured_pick
    if pick is None:
        return []
    score = _scores(measured, verdict.by)
    margins = {i: tie_margin if tie_margin is not None else repeat_margin(regimes[i], regimes[pick]) for i in score}
    return contenders(score, _scores(measured, "time"), pick, max_slowdown, margins)


def plan_dict(result: SearchResult, chosen: list[Chosen], band: Band | None, seq_len: int) -> list[dict]:
    """The chosen strategies with their predictions and bands, as committed before any run."""
    from advisor.bands import with_bands

    return [{"why": ch.why, **with_bands(band, result.point(ch.index, seq_len))} for ch in chosen]


def measured_dict(m: Measured, verdict: Verdict, i: int) -> dict:
    """One candidate as measured: its figures (geometric means over its rounds), each round's, its
    regret and its distance behind the pick. `result` is its first round's run."""
    r = m.record
    gpu_j = geometric_mean([x.result.gpu_energy_j for x in m.rounds if x and x.result.gpu_energy_j]) if m.ok else None
    behind = verdict.leads.get(i)
    return {"why": m.chosen.why, "status": r.result.status if r else "not run",
            "reason": r.result.reason if r else m.not_run_reason, "key": r.key if r else None,
            "measured": {"step_time_s": m.time_s, "energy_j": m.energy_j, "gpu_energy_j": gpu_j,
                         "peak_gpu_mem_gib": r.result.peak_gpu_mem_gib if m.ok else None,
                         "peak_gpu_reserved_gib": r.result.peak_gpu_reserved_gib if m.ok else None,
                         "wall_s": sum(x.result.wall_s or 0.0 for x in (r, *m.repeats) if x) if r else None},
            "rounds": [{"step_time_s": t, "energy_j": e} for t, e in zip(m.round_time_s(), m.round_energy_j())],
            "regret": verdict.regret.get(i), "behind_pick": behind.to_dict() if behind else None,
            "is_measured_pick": verdict.measured_pick == i, "result": asdict(r.result) if r else None}


@dataclass(frozen=True)
class LoopSettings:
    """How `recommend --validate K` runs its candidates."""

    k: int
    workdir: str | None  # per-run configs, logs and results; None: advisor.validate.default_workdir()
    store: str | None  # SQLite run store (default: advisor's cache folder)
    jsonl: str | None  # default WORKDIR/runs.jsonl
    budget_s: float | None  # seconds from `started_monotonic_s`: no run starts or runs past them
    script: str | None  # the user's training script (advisor.monitor.StepMeter inside); None: built-in model
    refit: bool  # refit the profile on every stored run, written beside the old one
    plan_only: bool  # print the candidates and their predictions; run nothing
    window: WindowSettings = WindowSettings()
    timeout_s: float = 600.0
    rounds: int = DEFAULT_ROUNDS  # rounds of measurement for the candidates the first cannot rank
    tie_margin: float | None = None  # within this of the pick's figure a candidate runs again; None: by regime
    retry: tuple[str, ...] = ()  # statuses (oom, crash, timeout) of stored runs to run again
    # When the command started (time.monotonic()): the search and the op builds count against the budget,
    # as with `validate --budget`, so a command given N seconds ends within them.
    started_monotonic_s: float = field(default_factory=time.monotonic)
    target: str = "deepspeed"  # hf: a script's runs get the Trainer's config and {training_args} (advisor.hf_trainer)

    def runs_dir(self) -> Path:
        from advisor.validate import default_workdir

        return Path(self.workdir) if self.workdir else default_workdir()


def round_path(jsonl: Path, round_number: int) -> Path:
    """Where a round's runs are kept: the loop's run file for the first, one beside it for each later one."""
    return jsonl if round_number == 1 else jsonl.with_name(f"{jsonl.stem}-round-{round_number}{jsonl.suffix}")


def _latest_by_key(records) -> dict:
    latest = {}
    for record in records:
        latest[record.key] = record  # oldest first: the last one wins
    return latest


def run_chosen(result: SearchResult, chosen: list[Chosen], model: str, workload, profile_name: str,
               settings: LoopSettings, contend: Callable[[list[Measured]], list[int]] = lambda measured: [],
               on_record=None) -> list[Measured]:
    """Run what is not stored yet, predicted first; then, for `settings.rounds - 1` more rounds, what
    `contend` names of the first round's measurements, in alternating order. Every chosen strategy
    with its first round's record (this loop's run, else the latest stored) and its later ones.
    Each round keeps its own run file, so an interrupted loop resumes where it stopped."""
    from advisor.validate import candidate_from_strategy, local_slots, prebuild_local, run_validation
    from calibration.harness.runner import RunSettings
    from runs.jsonl import read_records
    from runs.store import RunStore, default_store_path

    candidates = []
    for ch in chosen:
        strategy = result.candidates.strategies[ch.index]
        c = candidate_from_strategy(model, workload.seq_len, asdict(strategy),
                                    images=workload.images, frames=workload.frames, image_size=workload.image_size,
                                    freeze_vision=not workload.train_vision, loss_dtype=workload.loss_dtype)
        candidates.append(c if settings.script is None else _with_script(c, strategy, settings))
    workdir = settings.runs_dir()
    workdir.mkdir(parents=True, exist_ok=True)
    jsonl = Path(settings.jsonl) if settings.jsonl else workdir / "runs.jsonl"
    slots = local_slots(parallel=True)
    prebuild_local(slots)
    run_settings = RunSettings(window=settings.window, timeout_s=settings.timeout_s)
    end = None if settings.budget_s is None else settings.started_monotonic_s + settings.budget_s

    def left() -> float | None:
        return None if end is None else max(0.0, end - time.monotonic())

    not_started: dict[str, str] = {}

    def skipped(c, why: str) -> None:
        not_started[c.key()] = why

    with RunStore(settings.store or default_store_path()) as store:
        print(f"runs: configs, logs and results in {workdir.resolve()}", file=sys.stderr, flush=True)
        run_validation(candidates, store, jsonl, workdir, run_settings, slots, profile_name,
                       deadline_s=left(), retry=settings.retry, on_record=on_record, on_skip=skipped)
        later = {(r.key, r.date) for path in jsonl.parent.glob(f"{jsonl.stem}-round-*{jsonl.suffix}")
                 for r in read_records(path)}
        first = {**_latest_by_key(r for r in store.runs() if (r.key, r.date) not in later),
                 **_latest_by_key(read_records(jsonl, missing_ok=True))}
        measured = [Measured(ch, first.get(c.key()), not_run_reason=not_started.get(c.key(), ""))
                    for ch, c in zip(chosen, candidates)]
        again = contend(measured) if settings.rounds > 1 else []
        repeats: dict[int, list] = {i: [] for i in again}
        within = (f"{settings.tie_margin:.0%}" if settings.tie_margin is not None
                  else "one run's scatter on one host (by regime)")
        for n in range(2, settings.rounds + 1 if again else 0):
            path = round_path(jsonl, n)
            stored = {r.key for r in read_records(path, missing_ok=True)}  # what the round's sweep skips
            todo = sum(candidates[i].key() not in stored for i in again)
            print(f"round {n} of {settings.rounds}: " + (
                f"measuring again the {todo} candidates within {within} of the measured pick" if todo else
                f"its {len(again)} runs are stored ({path}): nothing to measure"), file=sys.stderr, flush=True)
            run_validation(round_order([candidates[i] for i in again], n), store, path, workdir, run_settings, slots,
                           profile_name, deadline_s=left(), on_record=on_record, skip_stored=False)
            this_round = _latest_by_key(read_records(path, missing_ok=True))
            for i in again:  # None where the budget ended first: rounds stay paired by position
                repeats[i].append(this_round.get(candidates[i].key()))
    return [replace(m, repeats=_without_trailing_none(repeats.get(i, []))) for i, m in enumerate(measured)]


def _without_trailing_none(runs: list) -> tuple:
    while runs and runs[-1] is None:
        runs = runs[:-1]
    return tuple(runs)


def _with_script(candidate, strategy, settings: LoopSettings):
    """The candidate run by the user's script; for the Trainer, with the config it takes (with "auto")
    and its TrainingArguments in place of {training_args}."""
    if settings.target != "hf":
        return replace(candidate, script=settings.script)
    from advisor.hf_trainer import fill_training_args, for_trainer

    config, training = for_trainer(candidate.ds_config, strategy, "ds_config.json")
    return replace(candidate, ds_config=config, script=fill_training_args(settings.script, training.layout_flags()))


@dataclass(frozen=True)
class LoopOutcome:
    chosen: list[Chosen]
    plan: list[dict]  # the chosen strategies with their predictions and bands, before any run
    measured: list[Measured] | None  # None when only planned
    verdict: Verdict | None
    refit_profile: str | None  # where --refit wrote the refitted profile
    refit_note: str
    host_note: str = ""  # advisor.host_check: the runs' host against the profile's, where it strays
    # Each measured candidate predicted again at the host its probes measured (advisor.validate.at_probed_host),
    # None where it was not run or not probed: where the host strayed, whether the model or the host missed.
    at_probed_host: tuple = ()
    workdir: str = ""  # where the runs keep their configs, logs and results

    @property
    def pick_index(self) -> int | None:
        """The measured pick, into the search result's candidates."""
        if self.verdict is None or self.verdict.measured_pick is None:
            return None
        return self.measured[self.verdict.measured_pick].chosen.index

    @property
    def rounds(self) -> int:
        """Rounds of measurement the closest candidates took (1: none was measured again)."""
        return max((1 + len(m.repeats) for m in self.measured or []), default=0)

    @property
    def run_seconds(self) -> float:
        """Wall time of the runs this command measured or found stored (start-up included)."""
        return sum(r.result.wall_s or 0.0 for m in self.measured or [] for r in (m.record, *m.repeats) if r)

    def to_dict(self) -> dict:
        out = {"candidates": self.plan, "refit_profile": self.refit_profile, "refit_note": self.refit_note}
        if self.measured is None:
            return out
        out.update(host_note=self.host_note, workdir=self.workdir)
        v = self.verdict
        at_host = self.at_probed_host or (None,) * len(self.measured)
        for entry, (i, m), again in zip(out["candidates"], enumerate(self.measured), at_host):
            entry.update(measured_dict(m, v, i), at_probed_host=again)
        model_pick = next((i for i, m in enumerate(self.measured) if m.chosen.why == "the model's pick"), None)
        out.update(picked_by=v.by, note=v.note, run_seconds=self.run_seconds, rounds=self.rounds,
                   measured_pick=None if v.measured_pick is None else self.plan[v.measured_pick]["label"],
                   model_pick_regret=v.regret.get(model_pick))
        return out


def close_loop(req, result: SearchResult, band: Band | None) -> LoopOutcome:
    """Choose, predict (before), run (unless only planning), pick by measurement, refit if asked."""
    s = req.loop
    from advisor.unmeasured import rests_on

    unmeasured = rests_on(result, np.flatnonzero(result.candidates.feasible), req.workload, req.profile)
    chosen = choose(result, band, req.objective, req.max_slowdown, s.k, unmeasured)
    plan = plan_dict(result, chosen, band, req.workload.seq_len)
    if s.plan_only:
        return LoopOutcome(chosen, plan, None, None, None, "")
    if s.refit:  # before the runs, not after them
        check_refit_runs(req.profile, s.store)
    from advisor.host_check import worst_host_note
    from advisor.validate import at_probed_host, print_progress

    shares = result.candidates.metrics["host_share"]
    regimes = [regime_of(float(shares[ch.index])) for ch in chosen]

    def contend(first_round: list[Measured]) -> list[int]:
        return to_contend(first_round, measured_pick(first_round, req.objective, req.max_slowdown), req.max_slowdown,
                          s.tie_margin, regimes)

    measured = run_chosen(result, chosen, req.model, req.workload, req.profile_name, s, contend,
                          on_record=print_progress)
    verdict = measured_pick(measured, req.objective, req.max_slowdown)
    refit_path, refit_note = (refit_beside(req.profile_name, req.profile, s) if s.refit else (None, ""))
    host_note = worst_host_note([m.record for m in measured], req.profile)
    again = tuple(at_probed_host(m.record, req.profile) if m.record else None for m in measured)
    return LoopOutcome(chosen, plan, measured, verdict, refit_path, refit_note, host_note, again, str(s.runs_dir()))


def check_refit_runs(profile, store: str | None) -> None:
    """A refit needs the runs the profile was fitted to: in the store, or else in the repository's data/runs."""
    from models.fit import fitted_run_ids
    from runs.measured import gather_records, require_shipped_runs
    from runs.store import default_store_path

    store = store or default_store_path()
    stored = {r.key for r in gather_records([], store)} if Path(store).exists() else set()
    require_shipped_runs(fitted_run_ids(profile) - stored)


def refit_folder(old: Path) -> Path:
    """Where a refit of the profile at `old` goes: beside it; but a shipped one lives in the installed
    package (named by name or by path), which no refit writes into, so its refit goes to this folder."""
    import os

    from models.profile import PROFILES_DIR

    shipped = old.parent.resolve() == PROFILES_DIR.resolve()
    return old.parent if os.access(old.parent, os.W_OK) and not shipped else Path.cwd()


def refit_beside(profile_name: str, profile, settings: LoopSettings) -> tuple[str | None, str]:
    """Refit the profile on every run in the store and the shipped runs it was fitted to; write it (and
    its band) beside the old profile, under a new name, never over it."""
    import os
    from datetime import datetime, timezone

    from advisor.outputs import write_atomic
    from advisor.refit import refit, to_stderr
    from models.band import band_path
    from models.fit import fitted_run_ids
    from models.profile import profile_path
    from runs.measured import gather_records, shipped_records, to_run_set
    from runs.store import default_store_path

    store = settings.store or default_store_path()
    run_set = to_run_set(shipped_records(fitted_run_ids(profile)) + gather_records([], store))
    if len(run_set.runs) < 2:
        return None, f"not refitted: {run_set.summary()} in {store}"
    old = profile_path(profile_name)
    folder = refit_folder(old)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = folder / f"{old.stem}.refit-{stamp}.json"
    to_stderr(f"refitting {profile_name} to {run_set.summary()}, each run left out once...")
    done = refit(run_set.runs, profile, data_note=f"store {store}", jobs=os.cpu_count() or 1,
                 progress=to_stderr)
    write_atomic(out, done.model.profile_.to_json() + "\n")
    if done.band is not None:  # none where too few runs bound 90% of new ones
        write_atomic(band_path(out), done.band.to_json() + "\n")
    loo = done.report.families[0]
    return str(out), (f"refitted to {run_set.summary()}: leave-one-out step time MAPE {loo.time.mape:.1%}, GPU "
                      f"energy {loo.energy.mape or 0:.1%}{'' if done.band else ' (too few runs for a band)'}; "
                      f"use it with --profile {out}")
