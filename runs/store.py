"""The run store: every real training run, in SQLite.

The schema is versioned with `PRAGMA user_version` and migrated forward on open; a store
written by a newer version is refused rather than misread. Each write is one transaction, so
a killed sweep leaves every finished run in place. Runs also travel as JSONL
(`data/runs/*.jsonl`, one `RunRecord` a line) so shipped data stays diffable; importing the
same file twice adds nothing.
"""
from __future__ import annotations

import json
import os
import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable

from models.input_file import parse_json
from runs.jsonl import read_records
from runs.record import RunRecord, RunRecordError

SCHEMA_VERSION = 2

# Index i holds the statements that take a store from version i to i + 1.
MIGRATIONS: list[list[str]] = [
    [
        """CREATE TABLE runs (
            id INTEGER PRIMARY KEY,
            key TEXT NOT NULL,
            date TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('ok', 'oom', 'crash', 'timeout')),
            reason TEXT NOT NULL DEFAULT '',
            model TEXT NOT NULL,
            seq_len INTEGER NOT NULL,
            gpus INTEGER NOT NULL,
            workload_json TEXT NOT NULL,
            strategy_json TEXT,
            ds_config_json TEXT NOT NULL,
            profile TEXT,
            machine_json TEXT NOT NULL,
            step_time_s REAL,
            gpu_energy_j REAL,
            cpu_energy_j REAL,
            cpu_energy_estimated INTEGER NOT NULL DEFAULT 0,
            peak_gpu_mem_gib REAL,
            peak_host_mem_gib REAL,
            prediction_json TEXT,
            record_json TEXT NOT NULL,
            UNIQUE (key, date)
        )""",
        "CREATE INDEX runs_key ON runs (key)",
        "CREATE INDEX runs_model ON runs (model, seq_len)",
        """CREATE TABLE calibration (
            id INTEGER PRIMARY KEY,
            date TEXT NOT NULL,
            name TEXT NOT NULL,
            machine_json TEXT NOT NULL,
            params_json TEXT NOT NULL,
            result_json TEXT NOT NULL
        )""",
        "CREATE INDEX calibration_name ON calibration (name)",
    ],
    # 2: calibration keeps its resumable raw JSONL beside the profile; the table was never written.
    ["DROP INDEX calibration_name", "DROP TABLE calibration"],
]
assert len(MIGRATIONS) == SCHEMA_VERSION


class StoreError(ValueError):
    """A store that cannot be used (written by a newer version, not a store, unreadable, its folder
    not makeable): a ValueError, so the CLI shows it as one line."""


def default_store_path() -> Path:
    """~/.cache/energy-advisor/runs.db where that folder can be made, else ./runs.db."""
    folder = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "energy-advisor"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if os.access(folder, os.W_OK):
            return folder / "runs.db"
    except OSError:
        pass
    return Path("runs.db")


class RunStore:
    """Open (creating or migrating) the store at `path`. Use as a context manager or call close()."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot make its folder ({exc.strerror})") from None
        try:
            # Autocommit mode, with explicit BEGIN/COMMIT in _transaction: Python's implicit
            # transactions would commit each CREATE TABLE of a migration on its own.
            self._db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")  # a reader never blocks the sweep's writes
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: not a usable run store ({exc})") from None

    @contextmanager
    def _transaction(self):
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _migrate(self) -> None:
        with self._transaction():  # all steps or none; a second opener waits, then sees the new version
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path}: schema version {version} is newer than this advisor's {SCHEMA_VERSION}; upgrade it"
                )
            for step in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[step]:
                    self._db.execute(statement)
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @property
    def schema_version(self) -> int:
        return self._db.execute("PRAGMA user_version").fetchone()[0]

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "RunStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- runs -----------------------------------------------------------------------------
    @staticmethod
    def _row(record: RunRecord) -> tuple:
        c, r = record.candidate, record.result
        return (
            record.key, record.date, r.status, r.reason, c.model, c.seq_len, c.gpus,
            json.dumps(c.workload(), sort_keys=True),
            json.dumps(c.strategy, sort_keys=True) if c.strategy is not None else None,
            json.dumps(c.ds_config, sort_keys=True), record.profile, json.dumps(r.machine, sort_keys=True),
            r.step_time_s, r.gpu_energy_j, r.cpu_energy_j, int(r.cpu_energy_estimated),
            r.peak_gpu_mem_gib, r.peak_host_mem_gib,
            json.dumps(record.prediction, sort_keys=True) if record.prediction is not None else None,
            json.dumps(record.to_dict(), sort_keys=True),
        )

    # Only a (key, date) duplicate is skipped; other constraint failures roll the batch back.
    _INSERT = """INSERT INTO runs (key, date, status, reason, model, seq_len, gpus, workload_json,
        strategy_json, ds_config_json, profile, machine_json, step_time_s, gpu_energy_j, cpu_energy_j,
        cpu_energy_estimated, peak_gpu_mem_gib, peak_host_mem_gib, prediction_json, record_json)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
        ON CONFLICT (key, date) DO NOTHING"""

    def add_run(self, record: RunRecord) -> bool:
        """Store one run; False if this exact record (key and date) is already there."""
        return self.add_runs([record]) == 1

    def add_runs(self, records: Iterable[RunRecord]) -> int:
        """Store many runs in one transaction; returns how many were new."""
        rows = [self._row(r) for r in records]
        with self._transaction():
            before = self._db.total_changes
            self._db.executemany(self._INSERT, rows)
            return self._db.total_changes - before

    def runs(self, status: str | None = None, model: str | None = None) -> list[RunRecord]:
        """Stored runs, oldest first, optionally of one status or model."""
        query, args = "SELECT id, record_json FROM runs WHERE 1=1", []
        if status is not None:
            query, args = query + " AND status = ?", args + [status]
        if model is not None:
            query, args = query + " AND model = ?", args + [model]
        rows = self._db.execute(query + " ORDER BY date, id", args).fetchall()
        return [self._record(row_id, text) for row_id, text in rows]

    def _record(self, row_id: int, text: str) -> RunRecord:
        """A stored row's record, checked as a run file's line is: a store can be edited too."""
        where = f"{self.path}: run {row_id}"
        try:
            return RunRecord.from_dict(parse_json(text, where, StoreError))
        except RunRecordError as exc:
            raise StoreError(f"{where}: not a run record ({exc})") from None

    def done_keys(self, statuses: Iterable[str] = ("ok", "oom", "crash", "timeout")) -> set[str]:
        """Keys of candidates with a run of one of these statuses (a resumed sweep skips them)."""
        statuses = list(statuses)
        marks = ",".join("?" * len(statuses))
        rows = self._db.execute(f"SELECT DISTINCT key FROM runs WHERE status IN ({marks})", statuses)
        return {row[0] for row in rows}

    def count(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]

    def import_jsonl(self, path: str | Path) -> int:
        """Add the runs of a JSONL file (one RunRecord a line); returns how many were new."""
        return self.add_runs(read_records(path))

    def export_jsonl(self, path: str | Path, status: str | None = None, model: str | None = None) -> int:
        """Write runs as JSONL (atomically); returns how many."""
        records = self.runs(status=status, model=model)
        path = Path(path)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text("".join(r.to_json_line() for r in records))
        tmp.replace(path)
        return len(records)
