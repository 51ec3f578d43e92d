"""The raw measurement file beside a profile: append-only JSONL, one result per line.

Every benchmark result is appended (and fsync'd) as soon as it is measured, so an
interrupted calibration resumes where it stopped: results already in the file with status
"ok" or "skipped" (does not apply to this machine) are not run again; failed ones are retried. The first line is a header naming
the machine, so a raw file from another machine is never silently mixed in.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
from dataclasses import dataclass
from pathlib import Path

RAW_VERSION = 1
# Header fields that must match for a raw file to be resumed.
IDENTITY_KEYS = ("kind", "device", "gpus_per_node", "nodes", "quick")


class RawLogMismatch(RuntimeError):
    """The raw file belongs to another machine or mode; the message says what differs."""


def raw_path_for(profile_path: str | Path) -> Path:
    p = Path(profile_path)
    return p.with_name(p.name + ".raw.jsonl") if p.suffix != ".json" else p.with_suffix(".raw.jsonl")


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class RawResult:
    key: str
    family: str
    status: str  # "ok" | "failed" | "skipped"
    data: dict
    reason: str | None
    elapsed_s: float
    time: str

    def to_json(self) -> str:
        return json.dumps({"type": "result", **self.__dict__}, sort_keys=True)


class RawLog:
    """Append-only raw results with resume. Only one process (rank 0) writes it."""

    def __init__(self, path: str | Path, header: dict, *, fresh: bool = False):
        self.path = Path(path)
        self.header = dict(header)
        self._results: dict[str, RawResult] = {}
        if self.path.exists() and not fresh:
            self._load()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists():
                self.path.replace(self.path.with_name(self.path.name + ".old"))
            self._write_line(json.dumps({"type": "header", "version": RAW_VERSION, "started": now_iso(), **header}))

    def _load(self) -> None:
        lines = self.path.read_text().splitlines()
        records, truncated = [], False
        for n, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                if n == len(lines) - 1:  # a line cut short by the interruption: measure it again
                    truncated = True
                    continue
                raise RawLogMismatch(f"{self.path}:{n + 1}: not valid JSON") from None
        if not records or records[0].get("type") != "header":
            raise RawLogMismatch(f"{self.path}: no header line; use --fresh to start over")
        old = records[0]
        if old.get("version") != RAW_VERSION:
            raise RawLogMismatch(f"{self.path}: raw version {old.get('version')}, this code writes {RAW_VERSION}")
        diffs = [f"{k}: file has {old.get(k)!r}, this run {self.header.get(k)!r}"
                 for k in IDENTITY_KEYS if old.get(k) != self.header.get(k)]
        if diffs:
            raise RawLogMismatch(
                f"{self.path} was written by another calibration ({'; '.join(diffs)}); "
                "use another --out or --fresh to start over"
            )
        self.header = {k: v for k, v in old.items() if k not in ("type", "version")}
        for r in records[1:]:
            if r.get("type") == "result":
                r = {k: v for k, v in r.items() if k != "type"}
                self._results[r["key"]] = RawResult(**r)
        # Rewrite without a truncated tail so later appends start on a clean line.
        if truncated:
            self.path.write_text("\n".join(lines[:-1]) + "\n")

    def _write_line(self, line: str) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def done(self, key: str) -> bool:
        r = self._results.get(key)
        return r is not None and r.status in ("ok", "skipped")

    def done_keys(self) -> set[str]:
        return {k for k, r in self._results.items() if r.status in ("ok", "skipped")}

    def append(self, result: RawResult) -> None:
        self._write_line(result.to_json())
        self._results[result.key] = result

    def results(self) -> dict[str, RawResult]:
        """The latest result of each key."""
        return dict(self._results)


def read_raw(path: str | Path) -> tuple[dict, dict[str, RawResult]]:
    """Header and latest results of a raw file, for rebuilding a profile offline."""
    log = RawLog.__new__(RawLog)
    log.path, log._results = Path(path), {}
    first = json.loads(Path(path).read_text().splitlines()[0])
    log.header = {k: first.get(k) for k in IDENTITY_KEYS}
    log._load()
    return log.header, log.results()
