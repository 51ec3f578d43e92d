"""Which shown strategies rest on terms this machine never measured (`models.term_basis`), for the
recommendation's notes and JSON and for the validation loop, which measures those first."""
from __future__ import annotations

from advisor.search import SearchResult
from models.profile import HardwareProfile
from models.strategy import StrategyBatch
from models.term_basis import Reliance, reliance
from models.workload import Workload


def rests_on(result: SearchResult, indices, workload: Workload, profile: HardwareProfile) -> dict[int, list[Reliance]]:
    """Candidate index -> the carried or placeholder terms its predicted step time rests on (empty: none)."""
    indices = sorted({int(i) for i in indices})
    if not indices:
        return {}
    batch = StrategyBatch.from_strategies([result.candidates.strategies[i] for i in indices])
    return dict(zip(indices, reliance(workload, batch, profile)))


def pick_note(terms: list[Reliance], profile: HardwareProfile) -> str | None:
    """One line for a pick that rests on unmeasured terms; None for one that does not."""
    if not terms:
        return None
    return (f"the pick rests on terms profile '{profile.name}' did not measure: "
            + "; ".join(t.describe() for t in terms)
            + ". `--validate K` measures it (and others resting on such terms) first; `--refit` then fits them")
