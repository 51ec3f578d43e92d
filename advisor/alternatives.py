"""What a user weighs against the pick: the best strategy of each family.

On one GPU count the least time and the least energy nearly coincide, so the Pareto front is
often a single point. The choices that matter (offload or not, how much checkpointing, the
Ulysses degree, how many GPUs) are then better shown as families: the best evaluated strategy
of each, with its predicted cost and its gap to the pick.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from advisor.search import SearchResult
from models.strategy import Strategy


def offload_family(s: Strategy) -> tuple[int, str]:
    if s.offload_param == "cpu":
        return 3, "parameter offload"
    if s.offload_optimizer == "cpu":
        return (2, "SuperOffload") if s.super_offload else (1, "optimizer offload")
    return 0, "no offload"


def checkpointing_family(s: Strategy) -> tuple[int, str]:
    if s.checkpoint_every == 0:
        return 0, "no checkpointing"
    return (2, "full checkpointing") if s.checkpoint_every == 1 else (1, "partial checkpointing")


# Each axis a user weighs, and where a strategy falls on it: (order for display, family name).
FAMILY_AXES = {
    "offload": offload_family,
    "checkpointing": checkpointing_family,
    "sp": lambda s: (s.sp, f"sp {s.sp}"),
    "gpus": lambda s: (s.gpus, f"{s.gpus} GPUs"),
}


@dataclass(frozen=True)
class Alternative:
    """The best evaluated strategy of one family, against the pick (gaps: alternative / pick - 1)."""

    axis: str
    family: str
    index: int  # into result.candidates
    is_pick: bool
    time_gap: float
    energy_gap: float
    within_slowdown: bool  # as fast as the pick's limit allows (max_slowdown of the fastest)

    def to_dict(self, result: SearchResult) -> dict:
        c = result.candidates
        s = c.strategies[self.index]
        return {
            "axis": self.axis, "family": self.family, "label": s.label(), "is_pick": self.is_pick,
            "step_time_s": float(c.metrics["step_time_s"][self.index]),
            "energy_j": float(c.metrics["energy_j"][self.index]),
            "peak_gpu_mem_gib": float(c.metrics["peak_gpu_mem_gib"][self.index]),
            "run_time_s": float(c.run_time_s[self.index]), "run_energy_j": float(c.run_energy_j[self.index]),
            "time_gap": self.time_gap, "energy_gap": self.energy_gap, "within_slowdown": self.within_slowdown,
        }


def _objective_key(objective: str, time_s: np.ndarray, energy_j: np.ndarray):
    return {"time": lambda i: (time_s[i], energy_j[i]), "energy": lambda i: (energy_j[i], time_s[i]),
            "edp": lambda i: (time_s[i] * energy_j[i], time_s[i])}[objective]


def alternatives(result: SearchResult, objective: str, max_slowdown: float) -> list[Alternative]:
    """For every axis on which the feasible strategies differ, the best of each family by `objective`
    (over the whole run), the pick's own family included."""
    c = result.candidates
    feasible = np.flatnonzero(c.feasible)
    if not len(feasible):
        return []
    key = _objective_key(objective, c.run_time_s, c.run_energy_j)
    fastest = float(c.run_time_s[feasible].min())
    pick_t, pick_e = float(c.run_time_s[result.pick]), float(c.run_energy_j[result.pick])
    out = []
    for axis, family_of in FAMILY_AXES.items():
        families: dict[tuple[int, str], list[int]] = {}
        for i in feasible:
            families.setdefault(family_of(c.strategies[i]), []).append(int(i))
        if len(families) < 2:
            continue  # the axis does not vary here: nothing to weigh
        for (_, family), members in sorted(families.items()):
            best = min(members, key=key)
            if family == family_of(c.strategies[result.pick])[1]:
                best = result.pick  # the pick stands for its own family
            out.append(Alternative(
                axis, family, best, best == result.pick, float(c.run_time_s[best]) / pick_t - 1.0,
                float(c.run_energy_j[best]) / pick_e - 1.0,
                bool(c.run_time_s[best] <= fastest * (1 + max_slowdown) * (1 + 1e-12))))
    return out
