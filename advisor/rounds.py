"""Rounds of measurement: which measured candidates a first round cannot rank, in what order later
rounds run them, and how far the pick stands from each over the rounds both ran.

A host-bound step repeats poorly on a lent host: on one H200 machine the same 256-token ZeRO-2 step
ran 0.112-0.207 s within eleven minutes, pinned to a CPU or not (machine AD, 2026-12-02,
data/runs/README.md), while a GPU-bound step repeats within about 2%. One run each cannot rank two
candidates a few percent apart, so `advisor.loop` measures the close ones again, interleaved, and
gives the pick's lead with its standard error over the rounds. Figures here are per token, as the
pick compares them (`advisor.loop.measured_pick`).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

from models.band import regime_of

DEFAULT_ROUNDS = 3
# How far one setting's measured step time scatters from one run to the next on one host, sd of log:
# the raw times, as the first round compares them (within one lease: 31 GPU-bound and 27 host-bound
# measurements, `benchmarks/repeat_scatter.py --keep-chosen`, its raw column, 2026-12-04; one host-bound
# ZeRO-3 step ran 0.52-0.65 s in three processes on one machine). The same runs set at the hosts their
# probes read scatter 0.032 and 0.098; that reading (0.041 and 0.098 over fewer runs) was the figure
# until later on 2026-12-04, too narrow for the raw times a first round compares.
REPEAT_SD_LOG = {"gpu_bound": 0.022, "host_bound": 0.155}
# A lead of this many standard errors over the rounds is taken as a real one.
SEPARATED_AT_STDERRS = 2.0


@dataclass(frozen=True)
class Lead:
    """How much worse a candidate measured than the pick: the mean over the rounds both ran of the
    log ratio of their figures, and its standard error (None from a single round)."""

    rounds: int
    log_ratio: float
    stderr: float | None

    @property
    def separated(self) -> bool | None:
        """Whether the lead is beyond the rounds' scatter; None where one round cannot say."""
        if self.stderr is None:
            return None
        return self.log_ratio > SEPARATED_AT_STDERRS * self.stderr

    def to_dict(self) -> dict:
        return {"rounds": self.rounds, "ratio": math.exp(self.log_ratio),
                "stderr_log": self.stderr, "separated": self.separated}


def lead(pick_rounds: list[float | None], other_rounds: list[float | None]) -> Lead | None:
    """The other's lead over the pick (positive: the pick is ahead), paired round by round, so a host
    that drifts between rounds moves both figures of a round alike; None without a shared round."""
    logs = [math.log(o / p) for p, o in zip(pick_rounds, other_rounds) if p and o]
    if not logs:
        return None
    stderr = statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else None
    return Lead(len(logs), statistics.fmean(logs), stderr)


def round_adjusted(per_round: dict[int, list[float | None]]) -> dict[int, float]:
    """Each candidate's figure over all its rounds, as if every candidate had run every round.

    A round that the budget cut short leaves some candidates without it; the plain geometric mean of
    each one's own rounds would then compare, say, a candidate's slow-host third round with another's
    two earlier ones. So the log figures are fitted as a candidate effect plus a round effect (least
    squares over the runs made; every candidate ran round 1, which anchors the rounds), and each
    candidate's figure is its effect, in round 1's terms. With every round complete this is the
    geometric mean of the candidate's rounds, scaled by one factor common to all. A candidate with
    no figure at all is left out."""
    per_round = {key: values for key, values in per_round.items() if any(values)}
    keys = list(per_round)
    rounds = max((len(v) for v in per_round.values()), default=0)
    cells = [(k, r, math.log(x)) for k, values in enumerate(per_round.values())
             for r, x in enumerate(values) if x]
    design = np.zeros((len(cells), len(keys) + max(rounds - 1, 0)))
    for row, (k, r, _) in enumerate(cells):
        design[row, k] = 1.0
        if r > 0:
            design[row, len(keys) + r - 1] = 1.0
    effects = np.linalg.lstsq(design, np.array([y for _, _, y in cells]), rcond=None)[0]
    return {key: math.exp(effects[k]) for k, key in enumerate(keys)}


def repeat_note(host_share: float | None) -> str | None:
    """For people: how a run whose step is mostly the host's repeats in another process on the same
    host, which its window's precision does not say; None for a GPU-bound step or an unknown share."""
    if host_share is None or regime_of(host_share) != "host_bound":
        return None
    return (f"its step is mostly the host's ({host_share:.0%} predicted): such a step repeats to about "
            f"+-{REPEAT_SD_LOG['host_bound']:.0%} (one sd) from one run to the next on one host, beyond its window's "
            "precision; one run each cannot rank two such candidates closer than "
            f"{repeat_margin('host_bound', 'host_bound'):.0%} (recommend --validate measures them again).")


def repeat_margin(regime: str, pick_regime: str) -> float:
    """How far apart one run each of two equal candidates can come out (two standard deviations of
    their log difference, `REPEAT_SD_LOG`): closer than this, a first round cannot rank them. Two
    GPU-bound steps 6%, two host-bound ones 44%."""
    return 2.0 * math.hypot(REPEAT_SD_LOG[regime], REPEAT_SD_LOG[pick_regime])


def contenders(score: dict[int, float], time: dict[int, float], pick: int, max_slowdown: float,
               margins: dict[int, float]) -> list[int]:
    """Candidates (of `score`, the measured ones) that another round could put ahead of `pick` or
    behind it: those within their margin (`margins`, each candidate's against the pick) of its figure
    that could keep the slowdown limit, the pick, and the fastest where any of them sits within its
    margin of the limit it sets. In `score`'s order."""
    fastest = min(time, key=time.get)
    limit = time[fastest] * (1 + max_slowdown)
    close = {i for i in score
             if score[i] <= score[pick] * (1 + margins[i]) and time[i] <= limit * (1 + margins[i])}
    close.add(pick)
    if any(time[i] * (1 + margins[i]) > limit for i in close):
        close.add(fastest)
    return [i for i in score if i in close] if len(close) > 1 else []


def round_order(items: list, round_number: int) -> list:
    """Later rounds alternate direction (ABC, CBA, ABC): a host drifting steadily through the rounds
    then favours no candidate on average."""
    return list(items) if round_number % 2 == 1 else list(reversed(items))
