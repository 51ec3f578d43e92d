"""What DeepSpeed's ZeRO-3 parameter coordinator did over the measured window: how often it dropped
its recorded module order, and how many parameters it gathered.

Why recorded: the same host-bound ZeRO-3 checkpointed step (qwen2.5-1.5b at 1k tokens, one H200) ran
1.00, 1.38 and 1.68 times its uncheckpointed twin on three lent hosts of one kind, within the hour
(2026-12-04), where the host probe differed by 20%. The coordinator keeps a gathered parameter
(no release, no second gather) when its recorded trace says the parameter is used again soon
(`stage3_max_reuse_distance`); with no valid trace it releases every module's parameters after
each use and gathers them again for the checkpointed recompute and the backward. The record says
which of the two a run was in, and how many gathers its steps paid.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Zero3Trace:
    invalidations: int  # times the coordinator dropped its trace (module order differed from the recorded)
    gathers: int  # calls gathering parameters (one a fetched module or prefetch batch)
    gathered_params: int  # parameters gathered, summed over those calls
    complete_at_end: bool  # the trace was valid (recorded and followed) when the window ended

    def per_step(self, steps: int) -> dict:
        """The window's counts a measured step, for the run's record."""
        return {"invalidations": self.invalidations, "complete_at_end": self.complete_at_end,
                "gathers_per_step": self.gathers / steps, "gathered_params_per_step": self.gathered_params / steps}


class Zero3TraceWatch:
    """Counts a ZeRO-3 engine's trace invalidations and parameter gathers, from `start()` to `stop()`.
    Wraps two methods of the engine's one parameter coordinator (DeepSpeed 0.19); an engine that is
    not ZeRO-3, or whose coordinator has neither, is not watched (`watching` False)."""

    _GATHER = "_PartitionedParameterCoordinator__all_gather_params"

    def __init__(self, engine):
        offload = getattr(getattr(engine, "optimizer", None), "parameter_offload", None)
        self._coordinator = offload.get_param_coordinator() if offload is not None else None
        self.watching = (self._coordinator is not None and hasattr(self._coordinator, "_invalidate_trace")
                         and hasattr(self._coordinator, self._GATHER))
        self._counting = False
        self._invalidations = self._gathers = self._params = 0
        if self.watching:
            self._wrap()

    def _wrap(self) -> None:
        coordinator = self._coordinator
        invalidate, gather = coordinator._invalidate_trace, getattr(coordinator, self._GATHER)

        def counted_invalidate():
            if self._counting:
                self._invalidations += 1
            return invalidate()

        def counted_gather(params, forward, *args, **kwargs):
            if self._counting:
                self._gathers += 1
                self._params += len(params)
            return gather(params, forward, *args, **kwargs)

        coordinator._invalidate_trace = counted_invalidate
        setattr(coordinator, self._GATHER, counted_gather)

    def start(self) -> None:
        self._counting = True

    def stop(self) -> Zero3Trace | None:
        """The counts since `start()`; None when not watching."""
        self._counting = False
        if not self.watching:
            return None
        return Zero3Trace(self._invalidations, self._gathers, self._params, bool(self._coordinator.is_complete_trace()))
