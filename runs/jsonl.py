"""Run records as JSONL, one `RunRecord` a line: how runs are shipped (`data/runs/*.jsonl`) and
how a sweep appends each run the moment it is measured."""
from __future__ import annotations

import os
import warnings
from pathlib import Path

from models.input_file import MAX_LINES_BYTES, cut_short, parse_json, read_text
from runs.record import RunRecord, RunRecordError


class RunFileError(ValueError):
    """A line of a run file that is not a run record; the message names the file and line."""


class TornLineWarning(UserWarning):
    """A run file's last line cut short by a killed writer, skipped: its run is not in the file."""


def read_records(path: str | Path, missing_ok: bool = False) -> list[RunRecord]:
    """The records of a JSONL file. A torn last line (no newline at its end, not JSON: a sweep killed
    while writing it) is skipped with a TornLineWarning naming it, since a resumed sweep runs it again;
    a malformed line anywhere else is an error naming its line number."""
    path = Path(path)
    if not path.exists():
        if missing_ok:
            return []
        raise RunFileError(f"run file not found: {path}")
    text = read_text(path, RunFileError, MAX_LINES_BYTES)
    lines = text.splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(RunRecord.from_dict(parse_json(line, f"{path}:{number}", RunFileError)))
        except RunFileError:
            if number == len(lines) and not text.endswith("\n") and cut_short(line):
                warnings.warn(f"{path}:{number}: the last line is cut short (a writer killed mid-line?); "
                              "skipped, its run is not read", TornLineWarning, stacklevel=2)
                break
            raise
        except RunRecordError as exc:
            raise RunFileError(f"{path}:{number}: not a run record ({exc})") from None
    return records


def append_record(path: str | Path, record: RunRecord) -> None:
    """One line, flushed and synced: a killed sweep loses at most the run in flight."""
    with open(path, "a") as f:
        f.write(record.to_json_line())
        f.flush()
        os.fsync(f.fileno())
