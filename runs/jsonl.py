"""Run records as JSONL, one `RunRecord` a line: how runs are shipped (`data/runs/*.jsonl`) and
how a sweep appends each run the moment it is measured."""
from __future__ import annotations

import json
import os
from pathlib import Path

from runs.record import RunRecord, RunRecordError


class RunFileError(ValueError):
    """A line of a run file that is not a run record; the message names the file and line."""


def read_records(path: str | Path, missing_ok: bool = False) -> list[RunRecord]:
    """The records of a JSONL file. A torn last line (a sweep killed while writing it) is skipped;
    a malformed line anywhere else is an error naming its line number."""
    path = Path(path)
    if not path.exists():
        if missing_ok:
            return []
        raise RunFileError(f"run file not found: {path}")
    lines = path.read_text().splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(RunRecord.from_dict(json.loads(line)))
        except (json.JSONDecodeError, RunRecordError) as exc:
            if number == len(lines) and isinstance(exc, json.JSONDecodeError):
                break  # torn by a killed writer: the run it held is run again
            raise RunFileError(f"{path}:{number}: not a run record ({type(exc).__name__}: {exc})") from None
    return records


def append_record(path: str | Path, record: RunRecord) -> None:
    """One line, flushed and synced: a killed sweep loses at most the run in flight."""
    with open(path, "a") as f:
        f.write(record.to_json_line())
        f.flush()
        os.fsync(f.fileno())
