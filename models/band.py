"""An uncertainty band on every prediction, from the fit's leave-one-out errors.

Each run held out of `advisor fit` leaves a log ratio, log(measured / predicted). Under the
usual exchangeability assumption a new run's ratio falls between two order statistics of those
ratios with a known probability (split-conformal prediction, jackknife form): with n ratios,
the ceil((n + 1)(1 - a/2))-th largest and as many from the bottom hold a new one with probability
at least 1 - a. So the band needs no model of its own: it is as wide as the model's errors on
runs it had not seen, and `coverage` checks that claim, leave-one-out, on the runs themselves.

The ratios are not exchangeable across all steps, though: a step that waits on the host follows
the host's drift, which no profile knows (lent H200 hosts ran one host-bound step 1.5-1.75x apart).
So the runs are split by the share of their predicted step spent on the host (Mondrian conformal
prediction): steps under HOST_BOUND_SHARE take the band of such runs, which was about +-5% on H200,
and the others the wider one of theirs. A regime with too few runs for the level falls back to the
band of all runs.

Torch's pool (max_memory_reserved) has a band of its own, of all runs that measured it with the
default allocator: the pool depends on the allocator's blocks, not on the host, so it has no regimes.
It says how far a step's pool may reach beyond the prediction (on H200, each run held out by fold,
90% of the pools came to 0.90-1.17 times the predicted): past the GPU's memory torch frees its cache
and retries, slower, or runs out.

A band belongs to one profile: it records the profile's content hash, and one fitted to another
version of the profile is not used.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from models.input_file import parse_json, read_text

BAND_METRICS = ("step_time_s", "gpu_energy_j")
POOL_METRIC = "reserved_gpu_mem_gib"  # torch's pool: one band for every step, where runs measured it
DEFAULT_LEVEL = 0.9
# A predicted step with this share or more of its time on the host (DeepSpeed's host work and the
# GPU's waits on it, the exposed CPU optimizer: models.predict.HOST_PHASES) is host-bound. On H200 the
# 51 fitted runs under a fifth came to 2.5% (time) and 2.5% (energy) leave-one-out, the 104 others to
# 9.0% and 7.0% (2026-12-02); the split at a tenth or at three tenths told the two apart no better.
HOST_BOUND_SHARE = 0.2
REGIMES = ("gpu_bound", "host_bound")


def regime_of(host_share: float) -> str:
    """The band a prediction takes: host-bound at HOST_BOUND_SHARE of its step on the host, else GPU-bound."""
    return "host_bound" if host_share >= HOST_BOUND_SHARE else "gpu_bound"


class BandError(ValueError):
    """A band file that cannot be used; the message says why."""


def conformal_bounds(log_ratios, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
    """(low, high) log ratios holding a new run's with probability >= `level` (both tails alike);
    -inf / inf when there are too few ratios for that level."""
    r = np.sort(np.asarray(log_ratios, dtype=float))
    n = len(r)
    rank = math.ceil((n + 1) * (1 - (1 - level) / 2))  # 1-based, from the top and from the bottom
    if rank > n:
        return -math.inf, math.inf
    return float(r[n - rank]), float(r[rank - 1])


def coverage(log_ratios, level: float = DEFAULT_LEVEL) -> float:
    """Share of runs inside the band made from the other runs' ratios: the band's claim, checked."""
    r = np.asarray(log_ratios, dtype=float)
    inside = []
    for i in range(len(r)):
        low, high = conformal_bounds(np.delete(r, i), level)
        inside.append(low <= r[i] <= high)
    return float(np.mean(inside)) if inside else math.nan


@dataclass(frozen=True)
class MetricBand:
    low_log: float
    high_log: float
    runs: int
    loo_coverage: float  # share of the runs inside the band made without them

    def around(self, predicted):
        """[low, high] around a predicted value (arrays broadcast)."""
        p = np.asarray(predicted, dtype=float)
        return p * math.exp(self.low_log), p * math.exp(self.high_log)


@dataclass(frozen=True)
class MetricBands:
    """The bands of step time and GPU energy for one kind of step."""

    step_time_s: MetricBand
    gpu_energy_j: MetricBand


@dataclass(frozen=True)
class Band:
    level: float
    profile_sha256: str  # the profile's content this band was fitted with
    step_time_s: MetricBand  # of all runs
    gpu_energy_j: MetricBand
    source: str
    regimes: dict[str, MetricBands] = field(default_factory=dict)  # REGIMES with enough runs for the level
    reserved_gpu_mem_gib: MetricBand | None = None  # POOL_METRIC; None: too few runs measured it, or an older band

    def regime_for(self, host_share: float | None) -> str | None:
        """The regime whose band a prediction with this share of its step on the host takes; None for
        the band of all runs (the share unknown, or its regime without a band: too few runs)."""
        if host_share is None or not math.isfinite(host_share):
            return None
        regime = regime_of(host_share)
        return regime if regime in self.regimes else None

    def for_share(self, host_share: float | None) -> MetricBands:
        """The bands for a prediction with this share of its step on the host (`regime_for`)."""
        regime = self.regime_for(host_share)
        return self.regimes[regime] if regime else MetricBands(self.step_time_s, self.gpu_energy_j)

    @classmethod
    def from_residuals(cls, residuals: dict[str, list[float]], profile_json: str, source: str,
                       level: float = DEFAULT_LEVEL, host_shares: dict[str, list[float]] | None = None) -> "Band":
        """From each metric's held-out log ratios, and where given the host share of each ratio's run
        (as predicted by the profile), each regime's band besides; and the pool's, where `residuals`
        has POOL_METRIC's ratios, enough of them for the level."""
        overall = {metric: _metric_band(residuals[metric], level) for metric in BAND_METRICS}
        pool = _metric_band(residuals[POOL_METRIC], level) if residuals.get(POOL_METRIC) else None
        if pool is not None and not (math.isfinite(pool.low_log) and math.isfinite(pool.high_log)):
            pool = None
        regimes = {}
        for regime in REGIMES if host_shares else ():
            own = {metric: [r for r, share in zip(residuals[metric], host_shares[metric], strict=True)
                            if regime_of(share) == regime] for metric in BAND_METRICS}
            bands = {metric: _metric_band(own[metric], level) for metric in BAND_METRICS}
            if all(math.isfinite(b.low_log) and math.isfinite(b.high_log) for b in bands.values()):
                regimes[regime] = MetricBands(**bands)
        return cls(level, profile_digest(profile_json), source=source, regimes=regimes, reserved_gpu_mem_gib=pool,
                   **overall)

    def to_json(self) -> str:
        return json.dumps({"kind": "energy-advisor prediction band", "version": 3, **asdict(self)}, indent=1)

    @classmethod
    def from_json(cls, text: str, origin: str) -> "Band":
        """Version 3; version 2 (no pool band); version 1 (nor regimes: every prediction takes the band
        of all runs). Every key's type and range is checked (`_BandFile`): a band edited by hand widens or
        narrows every prediction's, so a bad one is refused, naming its key."""
        data = parse_json(text, origin, BandError)
        try:
            file = _BandFile.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            key = ".".join(str(part) for part in first["loc"]) or "(top level)"
            raise BandError(f"{origin}: not a prediction band: bad key '{key}': "
                            f"{first['msg'].removeprefix('Value error, ')}") from None
        metric = lambda m: MetricBand(**m.model_dump())  # noqa: E731
        regimes = {name: MetricBands(**{m: metric(getattr(bands, m)) for m in BAND_METRICS})
                   for name, bands in file.regimes.items()}
        pool = file.reserved_gpu_mem_gib
        return cls(file.level, file.profile_sha256, metric(file.step_time_s), metric(file.gpu_energy_j),
                   file.source, regimes, metric(pool) if pool else None)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class _MetricBandFile(_Strict):
    """A metric's band as written: bounds within a factor of e^10 of the prediction, or open (too few
    runs for the level); a coverage in [0, 1], NaN for no runs."""

    low_log: float
    high_log: float
    runs: int = Field(ge=0)
    loo_coverage: float

    @model_validator(mode="after")
    def _bounds(self) -> "_MetricBandFile":
        low_ok = self.low_log == -math.inf or abs(self.low_log) <= 10
        high_ok = self.high_log == math.inf or abs(self.high_log) <= 10
        if not (low_ok and high_ok and self.low_log <= self.high_log):
            raise ValueError(f"low_log and high_log must rise, each within +-10 (or open), got {self.low_log} and "
                             f"{self.high_log}")
        if not (math.isnan(self.loo_coverage) or 0 <= self.loo_coverage <= 1):
            raise ValueError(f"loo_coverage must lie in [0, 1], got {self.loo_coverage}")
        return self


class _MetricBandsFile(_Strict):
    step_time_s: _MetricBandFile
    gpu_energy_j: _MetricBandFile


class _BandFile(_Strict):
    kind: Literal["energy-advisor prediction band"]
    version: Literal[1, 2, 3]
    level: float = Field(gt=0, lt=1)
    profile_sha256: str = Field(pattern="^[0-9a-f]{64}$")
    step_time_s: _MetricBandFile
    gpu_energy_j: _MetricBandFile
    source: str
    regimes: dict[Literal["gpu_bound", "host_bound"], _MetricBandsFile] = {}
    reserved_gpu_mem_gib: _MetricBandFile | None = None


def _metric_band(log_ratios: list[float], level: float) -> MetricBand:
    low, high = conformal_bounds(log_ratios, level)
    return MetricBand(low, high, len(log_ratios), coverage(log_ratios, level))


def profile_digest(profile_json: str) -> str:
    return hashlib.sha256(profile_json.encode()).hexdigest()


def band_path(profile_path: str | Path) -> Path:
    """The band beside a profile: PROFILE.band.json."""
    path = Path(profile_path)
    return path.with_name(path.stem + ".band.json")


def load_band(profile_path: str | Path, profile_json: str) -> tuple[Band | None, str]:
    """The band beside the profile, if there is one fitted to this very profile; and why not, when not."""
    path = band_path(profile_path)
    if not path.exists():
        return None, f"no band beside the profile ({path.name}): run advisor fit to make one"
    band = Band.from_json(read_text(path, BandError), str(path))
    if band.profile_sha256 != profile_digest(profile_json):
        return None, f"{path.name} was fitted with another version of the profile: not used"
    return band, ""
