"""What each of a profile's constants stands on, and which unmeasured ones a prediction rests on.

A search finds the cheapest price. A DeepSpeed overhead that no run on this machine measured, left
at a placeholder of zero, makes its strategy look free, and the search picks exactly that strategy
(a calibrated H100 profile picked SuperOffload for two of three workloads that way). So every
constant has a basis, read from the source it carries:

- `measured`: a microbenchmark or a datasheet figure of this machine;
- `fitted`: least squares to real runs (`advisor fit`);
- `carried`: another machine's value, taken over (and, where said, rescaled by what was measured here);
- `placeholder`: nothing stands behind it; a prediction that needs it is refused or flagged.

`reliance` tells which carried or placeholder terms move a prediction: those a pick rests on.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from models.fit import TIME_PARAMETERS
from models.predict import predict_batch
from models.profile import HardwareProfile, sourced
from models.profile_values import get_value, getattr_path, with_values
from models.strategy import StrategyBatch
from models.workload import Workload

Basis = Literal["measured", "fitted", "carried", "placeholder"]
UNMEASURED: tuple[Basis, ...] = ("carried", "placeholder")

# How the writers of profiles begin a source they did not measure (calibration.profile_writer,
# calibration.derive, calibration.merge's relabel of either).
_CARRIED_PREFIXES = ("carried from ", "from profile ", "from the ", "derived: ", "assumption: ")
_PLACEHOLDER_MARKS = ("placeholder", "not measured", "not fitted", "neutral value")


def basis_of(source: str) -> Basis:
    """The basis a constant's source states (see the module's docstring)."""
    text = source.strip().lower()
    # a raw file's name may stand before the source (calibration.merge): "h200-x4.raw.jsonl: measured: ..."
    head, sep, rest = text.partition(": ")
    if sep and head.endswith((".jsonl", ".json")):
        text = rest
    if text.startswith(_CARRIED_PREFIXES):
        return "carried"
    if any(mark in text for mark in _PLACEHOLDER_MARKS):
        return "placeholder"
    if text.startswith("fitted"):
        return "fitted"
    return "measured"


def bases(profile: HardwareProfile) -> dict[str, Basis]:
    """Every constant's and curve's dotted name and basis."""
    return {name: basis_of(source) for name, source in sourced(profile).items()}


_NETWORK_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def unmeasured_network(profile: HardwareProfile, network: Literal["intra_node", "inter_node"]) -> str | None:
    """Why `network`'s collectives cannot be used for a plan, or None where they can: a placeholder
    (a one-GPU calibration times no group; a single-node one crosses no network) prices nothing."""
    for op in _NETWORK_OPS:
        collective = getattr(getattr(profile, network), op)
        for q in (collective.alpha, collective.bus_bandwidth):
            if basis_of(q.source) == "placeholder":
                return f"{network}.{op} is {q.source.partition(': ')[0]}"
    return None


def network_refusal(profile: HardwareProfile, gpus: int, gpus_per_node: int | None = None) -> str | None:
    """One line refusing a plan on `gpus` GPUs whose collectives `profile` never measured; None where
    the plan needs none or the profile has them (measured, fitted, or carried: carried ones are flagged)."""
    if gpus <= 1:
        return None
    per_node = int(gpus_per_node or profile.gpus_per_node.value)
    needed = ["intra_node"] + (["inter_node"] if gpus > per_node else [])
    for network in needed:
        why = unmeasured_network(profile, network)
        if why is not None:
            scope, where = (("across nodes", "on several nodes") if network == "inter_node"
                            else ("between a node's GPUs", "on the node's GPUs (advisor calibrate --gpus N)"))
            return (f"profile '{profile.name}' has no measured collectives {scope}, which {gpus} GPUs need ({why}): "
                    f"calibrate {where}, or take them from another profile, flagged as carried "
                    "(advisor calibrate --fill-from PROFILE)")
    return None


@dataclass(frozen=True)
class Reliance:
    """An unmeasured term a prediction rests on: how far the step time moves when the term moves by
    the width the fit gives it (`models.fit.FitParameter.scale`)."""

    term: str  # dotted path in the profile
    basis: Basis
    source: str
    step_time_share: float  # |change of the step time| / step time, per prior width

    def to_dict(self) -> dict:
        return {"term": self.term, "basis": self.basis, "source": self.source,
                "step_time_share": self.step_time_share}

    def describe(self) -> str:
        return f"{self.term} ({self.basis}; moves the step {self.step_time_share:.0%})"


def reliance(workload: Workload, batch: StrategyBatch, profile: HardwareProfile,
             min_share: float = 0.02) -> list[list[Reliance]]:
    """For each strategy of `batch`, the carried or placeholder time terms (DeepSpeed overheads and
    overlap: what real runs fit) that move its predicted step time by at least `min_share` when
    moved by their prior width. A placeholder of 0 is moved up: its cost is unknown, not absent."""
    sources = {p.name: getattr_path(profile, p.name).source for p in TIME_PARAMETERS}
    terms = [p for p in TIME_PARAMETERS if basis_of(sources[p.name]) in UNMEASURED]
    base = predict_batch(workload, batch, profile).step_time_s
    out: list[list[Reliance]] = [[] for _ in range(len(base))]
    for p in terms:
        moved = p.moved(get_value(profile, p.name))
        step = predict_batch(workload, batch, with_values(profile, {p.name: moved})).step_time_s
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.abs(step - base) / base
        source = sources[p.name]
        for i in np.flatnonzero(np.isfinite(share) & (share >= min_share)):
            out[i].append(Reliance(p.name, basis_of(source), source, float(share[i])))
    return [sorted(r, key=lambda x: -x.step_time_share) for r in out]

