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
    """One line, flushed and synced: a killed sweep loses at most the run in flight. A torn last line
    (that run's, skipped by `read_records`) is cut off first, so the new record starts a line of its own
    rather than finish the torn one, which would make both unreadable."""
    with open(path, "ab+") as f:
        _cut_torn_tail(f)
        f.write(record.to_json_line().encode())
        f.flush()
        os.fsync(f.fileno())


def _cut_torn_tail(f, block: int = 65536) -> None:
    """Truncate `f` after its last newline, where it does not end with one (a line a killed writer tore)."""
    end = f.seek(0, os.SEEK_END)
    if end == 0:
        return
    f.seek(end - 1)
    if f.read(1) == b"\n":
        return
    stop = end
    while stop > 0:
        start = max(0, stop - block)
        f.seek(start)
        newline = f.read(stop - start).rfind(b"\n")
        if newline >= 0:
            f.truncate(start + newline + 1)
            return
        stop = start
    f.truncate(0)
