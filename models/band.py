"""An uncertainty band on every prediction, from the fit's leave-one-out errors.

Each run held out of `advisor fit` leaves a log ratio, log(measured / predicted). Under the
usual exchangeability assumption a new run's ratio falls between two order statistics of those
ratios with a known probability (split-conformal prediction, jackknife form): with n ratios,
the ceil((n + 1)(1 - a/2))-th largest and as many from the bottom hold a new one with probability
at least 1 - a. So the band needs no model of its own: it is as wide as the model's errors on
runs it had not seen, and `coverage` checks that claim, leave-one-out, on the runs themselves.

A band belongs to one profile: it records the profile's content hash, and one fitted to another
version of the profile is not used.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

BAND_METRICS = ("step_time_s", "gpu_energy_j")
DEFAULT_LEVEL = 0.9


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
class Band:
    level: float
    profile_sha256: str  # the profile's content this band was fitted with
    step_time_s: MetricBand
    gpu_energy_j: MetricBand
    source: str

    @classmethod
    def from_residuals(cls, residuals: dict[str, list[float]], profile_json: str, source: str,
                       level: float = DEFAULT_LEVEL) -> "Band":
        metrics = {}
        for metric in BAND_METRICS:
            r = residuals[metric]
            low, high = conformal_bounds(r, level)
            metrics[metric] = MetricBand(low, high, len(r), coverage(r, level))
        return cls(level, profile_digest(profile_json), source=source, **metrics)

    def to_json(self) -> str:
        return json.dumps({"kind": "energy-advisor prediction band", "version": 1, **asdict(self)}, indent=1)

    @classmethod
    def from_json(cls, text: str, origin: str) -> "Band":
        try:
            data = json.loads(text)
            assert data.pop("kind") == "energy-advisor prediction band" and data.pop("version") == 1
            metrics = {m: MetricBand(**data.pop(m)) for m in BAND_METRICS}
            return cls(**data, **metrics)
        except (json.JSONDecodeError, AssertionError, KeyError, TypeError) as exc:
            raise BandError(f"{origin}: not a prediction band ({type(exc).__name__}: {exc})") from None


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
    band = Band.from_json(path.read_text(), str(path))
    if band.profile_sha256 != profile_digest(profile_json):
        return None, f"{path.name} was fitted with another version of the profile: not used"
    return band, ""
