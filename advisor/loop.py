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
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from advisor.alternatives import alternatives
from advisor.search import SearchResult
from calibration.harness.window import WindowSettings
from models.band import Band
from runs.record import RunRecord


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


def choose(result: SearchResult, band: Band | None, objective: str, max_slowdown: float, k: int) -> list[Chosen]:
    """Up to `k` strategies to measure, most telling first (see the module docstring)."""
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
    """One chosen strategy, as predicted and as measured (None where it failed or was not run)."""

    chosen: Chosen
    record: RunRecord | None

    @property
    def ok(self) -> bool:
        return self.record is not None and self.record.result.status == "ok"

    @property
    def tokens_per_step(self) -> int:
        s, c = self.record.candidate.strategy, self.record.candidate
        return s["micro_batch"] * (s["gpus"] // s["sp"]) * s["grad_accum"] * c.seq_len

    @property
    def time_s(self) -> float | None:
        return self.record.result.step_time_s if self.ok else None

    @property
    def energy_j(self) -> float | None:
        """GPU energy plus the host's (estimated where there is no sensor), as the objective counts it."""
        if not self.ok or self.record.result.gpu_energy_j is None:
            return None
        return self.record.result.gpu_energy_j + (self.record.result.cpu_energy_j or 0.0)


@dataclass(frozen=True)
class Verdict:
    measured_pick: int | None  # into the Measured list; None when nothing ran ok
    by: str  # the measured figure the pick was chosen on
    regret: dict[int, float]  # Measured index -> its measured objective / the measured pick's - 1
    note: str


def measured_pick(measured: list[Measured], objective: str, max_slowdown: float) -> Verdict:
    """The least measured energy (time, energy-delay) within `max_slowdown` of the fastest measured.
    Per step: the candidates share the workload, so per step ranks as the whole run does, up to
    the rounding of the global batch, which the ratio to tokens per step removes."""
    ok = [i for i, m in enumerate(measured) if m.ok]
    if not ok:
        return Verdict(None, objective, {}, "nothing was measured: no pick by measurement")

    def per_token(i, figure):
        return figure / measured[i].tokens_per_step

    times = {i: per_token(i, measured[i].time_s) for i in ok}
    by, note = objective, ""
    if objective in ("energy", "edp") and any(measured[i].energy_j is None for i in ok):
        by, note = "time", "GPU energy was not measured (no NVML here): picked by time"
    energies = {i: per_token(i, measured[i].energy_j) for i in ok} if by != "time" else {}
    score = {"time": lambda i: times[i], "energy": lambda i: energies[i], "edp": lambda i: times[i] * energies[i]}[by]
    fastest = min(times.values())
    allowed = [i for i in ok if times[i] <= fastest * (1 + max_slowdown) * (1 + 1e-12)]
    best = min(allowed, key=score)
    regret = {i: score(i) / score(best) - 1.0 for i in ok}
    return Verdict(best, by, regret, note)


def plan_dict(result: SearchResult, chosen: list[Chosen], band: Band | None, seq_len: int) -> list[dict]:
    """The chosen strategies with their predictions and bands, as committed before any run."""
    from advisor.bands import band_fields

    out = []
    for ch in chosen:
        point = result.point(ch.index, seq_len)
        out.append({"why": ch.why, **point,
                    **band_fields(band, point["step_time_s"], point["energy_j"], point["host_share"])})
    return out


def measured_dict(m: Measured, verdict: Verdict, i: int) -> dict:
    r = m.record
    return {"why": m.chosen.why, "status": r.result.status if r else "not run",
            "reason": r.result.reason if r else "", "key": r.key if r else None,
            "measured": {"step_time_s": m.time_s, "energy_j": m.energy_j,
                         "gpu_energy_j": r.result.gpu_energy_j if m.ok else None,
                         "peak_gpu_mem_gib": r.result.peak_gpu_mem_gib if m.ok else None,
                         "peak_gpu_reserved_gib": r.result.peak_gpu_reserved_gib if m.ok else None,
                         "wall_s": r.result.wall_s if r else None},
            "regret": verdict.regret.get(i), "is_measured_pick": verdict.measured_pick == i,
            "result": asdict(r.result) if r else None}


@dataclass(frozen=True)
class LoopSettings:
    """How `recommend --validate K` runs its candidates."""

    k: int
    workdir: str
    store: str | None  # SQLite run store (default: advisor's cache folder)
    jsonl: str | None  # default WORKDIR/runs.jsonl
    budget_s: float | None  # no run starts or runs past it
    script: str | None  # the user's training script (advisor.monitor.StepMeter inside); None: built-in model
    refit: bool  # refit the profile on every stored run, written beside the old one
    plan_only: bool  # print the candidates and their predictions; run nothing
    window: WindowSettings = WindowSettings()
    timeout_s: float = 600.0


def run_chosen(result: SearchResult, chosen: list[Chosen], model: str, workload, profile_name: str,
               settings: LoopSettings, on_record=None) -> list[Measured]:
    """Run what is not stored yet, predicted first; every chosen strategy with its latest record."""
    from pathlib import Path

    from advisor.validate import candidate_from_strategy, local_slots, prebuild_local, run_validation
    from calibration.harness.runner import RunSettings
    from runs.store import RunStore, default_store_path

    candidates = []
    for ch in chosen:
        c = candidate_from_strategy(model, workload.seq_len, asdict(result.candidates.strategies[ch.index]),
                                    images=workload.images, frames=workload.frames, image_size=workload.image_size,
                                    freeze_vision=not workload.train_vision, loss_dtype=workload.loss_dtype)
        candidates.append(c if settings.script is None else _with_script(c, settings.script))
    workdir = Path(settings.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    jsonl = Path(settings.jsonl) if settings.jsonl else workdir / "runs.jsonl"
    slots = local_slots(parallel=True)
    prebuild_local(slots)
    run_settings = RunSettings(window=settings.window, timeout_s=settings.timeout_s)
    with RunStore(settings.store or default_store_path()) as store:
        run_validation(candidates, store, jsonl, workdir, run_settings, slots, profile_name,
                       deadline_s=settings.budget_s, on_record=on_record)
        latest = {}
        for record in store.runs():
            latest[record.key] = record  # oldest first: the last one wins
    return [Measured(ch, latest.get(c.key())) for ch, c in zip(chosen, candidates)]


def _with_script(candidate, script: str):
    from dataclasses import replace

    return replace(candidate, script=script)


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

    @property
    def pick_index(self) -> int | None:
        """The measured pick, into the search result's candidates."""
        if self.verdict is None or self.verdict.measured_pick is None:
            return None
        return self.measured[self.verdict.measured_pick].chosen.index

    @property
    def run_seconds(self) -> float:
        """Wall time of the runs this command measured or found stored (start-up included)."""
        return sum(m.record.result.wall_s or 0.0 for m in self.measured or [] if m.record)

    def to_dict(self) -> dict:
        out = {"candidates": self.plan, "refit_profile": self.refit_profile, "refit_note": self.refit_note}
        if self.measured is None:
            return out
        out["host_note"] = self.host_note
        v = self.verdict
        for entry, (i, m), again in zip(out["candidates"], enumerate(self.measured), self.at_probed_host):
            entry.update(measured_dict(m, v, i), at_probed_host=again)
        model_pick = next((i for i, m in enumerate(self.measured) if m.chosen.why == "the model's pick"), None)
        out.update(picked_by=v.by, note=v.note, run_seconds=self.run_seconds,
                   measured_pick=None if v.measured_pick is None else self.plan[v.measured_pick]["label"],
                   model_pick_regret=v.regret.get(model_pick))
        return out


def close_loop(req, result: SearchResult, band: Band | None) -> LoopOutcome:
    """Choose, predict (before), run (unless only planning), pick by measurement, refit if asked."""
    s = req.loop
    chosen = choose(result, band, req.objective, req.max_slowdown, s.k)
    plan = plan_dict(result, chosen, band, req.workload.seq_len)
    if s.plan_only:
        return LoopOutcome(chosen, plan, None, None, None, "")
    from advisor.host_check import worst_host_note
    from advisor.validate import at_probed_host, print_progress

    measured = run_chosen(result, chosen, req.model, req.workload, req.profile_name, s, on_record=print_progress)
    verdict = measured_pick(measured, req.objective, req.max_slowdown)
    refit_path, refit_note = (refit_beside(req.profile_name, req.profile, s) if s.refit else (None, ""))
    host_note = worst_host_note([m.record for m in measured], req.profile)
    again = tuple(at_probed_host(m.record, req.profile) if m.record else None for m in measured)
    return LoopOutcome(chosen, plan, measured, verdict, refit_path, refit_note, host_note, again)


def refit_beside(profile_name: str, profile, settings: LoopSettings) -> tuple[str | None, str]:
    """Refit the profile on every run in the store and the shipped runs it was fitted to; write it (and
    its band) beside the old profile, under a new name, never over it."""
    import os
    import sys
    from datetime import datetime, timezone
    from pathlib import Path

    from advisor.refit import refit
    from models.band import band_path
    from models.fit import fitted_run_ids
    from models.profile import PROFILES_DIR, profile_path
    from runs.measured import gather_records, shipped_records, to_run_set
    from runs.store import default_store_path

    store = settings.store or default_store_path()
    run_set = to_run_set(shipped_records(fitted_run_ids(profile)) + gather_records([], store))
    if len(run_set.runs) < 2:
        return None, f"not refitted: {run_set.summary()} in {store}"
    old = profile_path(profile_name)
    # Beside the old profile; a shipped one lives in the package, so its refit goes to this folder.
    folder = old.parent if os.access(old.parent, os.W_OK) and old.parent != PROFILES_DIR else Path.cwd()
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = folder / f"{old.stem}.refit-{stamp}.json"
    print(f"refitting {profile_name} to {run_set.summary()}, each run left out once (about a second a run)...",
          file=sys.stderr, flush=True)
    done = refit(run_set.runs, profile, data_note=f"store {store}")
    out.write_text(done.model.profile_.to_json() + "\n")
    band_path(out).write_text(done.band.to_json() + "\n")
    loo = done.report.families[0]
    return str(out), (f"refitted to {run_set.summary()}: leave-one-out step time MAPE {loo.time.mape:.1%}, GPU "
                      f"energy {loo.energy.mape or 0:.1%}; use it with --profile {out}")
