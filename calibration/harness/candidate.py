"""A candidate to run for real, and the record of one run as it is stored and shipped (JSONL).

A `RunRecord` line is what `data/runs/*.jsonl` holds and what `advisor.store` imports: the
workload, the strategy and DeepSpeed config it ran, the prediction made before the run, and
the measured `RunResult`. The key hashes what determines the run, so a resumed sweep skips
runs already recorded.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

from calibration.harness.result import RunResult


@dataclass(frozen=True)
class Candidate:
    """One real run: a workload, and the DeepSpeed config (plus harness knobs) that lays it out."""

    model: str  # preset name or config.json path
    seq_len: int
    ds_config: dict
    gpus: int = 1
    sp: int | None = None  # None: the ds_config's sequence_parallel_size
    checkpoint_every: int | None = None  # None: from the ds_config (advisor.ds_config's convention)
    images: int = 0
    frames: int = 0
    image_size: int | None = None
    freeze_vision: bool = False
    strategy: dict | None = None  # the models.strategy.Strategy fields it came from, if any
    label: str = ""  # for people; not part of the key

    def __post_init__(self):
        if self.gpus < 1 or self.seq_len < 1:
            raise ValueError(f"gpus and seq_len must be positive, got {self.gpus} and {self.seq_len}")
        if self.images and self.frames:
            raise ValueError("give images or frames, not both")

    def workload(self) -> dict:
        return {
            "model": self.model,
            "seq_len": self.seq_len,
            "images": self.images,
            "frames": self.frames,
            "image_size": self.image_size,
            "train_vision": not self.freeze_vision,
        }

    def key(self) -> str:
        """Stable id of what determines the run (not the label, not the strategy's spelling)."""
        what = {
            "workload": self.workload(),
            "ds_config": self.ds_config,
            "gpus": self.gpus,
            "sp": self.sp,
            "checkpoint_every": self.checkpoint_every,
        }
        return hashlib.sha1(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Candidate":
        return cls(**data)


@dataclass(frozen=True)
class RunRecord:
    """One real run, measured or failed, with the prediction made before it."""

    key: str
    date: str  # ISO 8601, UTC, when the run finished
    candidate: Candidate
    result: RunResult
    prediction: dict | None = None  # models.predict.Prediction.to_dict(), made before the run
    profile: str | None = None  # the hardware profile the prediction used
    notes: list[str] = field(default_factory=list)  # e.g. why there is no prediction

    @classmethod
    def now(cls, candidate: Candidate, result: RunResult, prediction=None, profile=None, notes=()) -> "RunRecord":
        date = datetime.now(timezone.utc).isoformat(timespec="seconds")
        return cls(candidate.key(), date, candidate, result, prediction, profile, list(notes))

    def to_dict(self) -> dict:
        return {
            "key": self.key,
            "date": self.date,
            "candidate": self.candidate.to_dict(),
            "result": self.result.to_dict(),
            "prediction": self.prediction,
            "profile": self.profile,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: dict) -> "RunRecord":
        return cls(
            key=data["key"],
            date=data["date"],
            candidate=Candidate.from_dict(data["candidate"]),
            result=RunResult.from_dict(data["result"]),
            prediction=data.get("prediction"),
            profile=data.get("profile"),
            notes=list(data.get("notes", [])),
        )

    def to_json_line(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True) + "\n"
