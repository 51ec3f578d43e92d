"""The run store: versioned schema, transactional writes, JSONL import/export."""
from __future__ import annotations

import json
import sqlite3

import pytest

from runs.jsonl import RunFileError
from runs.record import Candidate, RunRecord, RunResult
from runs.store import MIGRATIONS, SCHEMA_VERSION, RunStore, StoreError, default_store_path


def ds_config(stage: int) -> dict:
    return {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": stage}}


def record(seq: int, status: str = "ok", step: float | None = 1.5, date: str = "2026-11-29T10:00:00+00:00",
           prediction: dict | None = None) -> RunRecord:
    c = Candidate(model="qwen2.5-0.5b", seq_len=seq, ds_config=ds_config(2), strategy={"zero_stage": 2})
    r = RunResult(status=status, reason="" if status == "ok" else "boom", step_time_s=step,
                  gpu_energy_j=900.0 if step else None, peak_host_mem_gib=3.0, machine={"gpu": "NVIDIA H200"})
    return RunRecord(c.key(), date, c, r, prediction, "gh200" if prediction else None)


def test_new_store_has_the_current_schema_and_reopens(tmp_path):
    path = tmp_path / "runs.db"
    with RunStore(path) as store:
        assert store.schema_version == SCHEMA_VERSION
        store.add_run(record(1024))
    with RunStore(path) as store:
        assert store.count() == 1


def test_a_store_from_a_newer_version_is_refused(tmp_path):
    path = tmp_path / "runs.db"
    RunStore(path).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="newer"):
        RunStore(path)


def test_a_file_that_is_not_a_store_is_refused(tmp_path):
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="not a usable run store"):
        RunStore(path)


def test_runs_round_trip_with_measurements_and_prediction(tmp_path):
    with RunStore(tmp_path / "runs.db") as store:
        rec = record(2048, prediction={"step_time_s": 1.2, "gpu_energy_j": 800.0})
        assert store.add_run(rec)
        assert not store.add_run(rec)  # same key and date: already there
        (back,) = store.runs()
        assert back == rec
        columns = "status, step_time_s, gpu_energy_j, profile, model, seq_len"
        row = store._db.execute(f"SELECT {columns} FROM runs").fetchone()
        assert row == ("ok", 1.5, 900.0, "gh200", "qwen2.5-0.5b", 2048)


def test_a_batch_with_a_bad_record_writes_nothing(tmp_path):
    good = record(1024)
    bad = record(2048)
    object.__setattr__(bad.result, "status", "exploded")  # bypasses RunResult's own check
    with RunStore(tmp_path / "runs.db") as store:
        with pytest.raises(sqlite3.IntegrityError):
            store.add_runs([good, bad])
        assert store.count() == 0


def test_done_keys_and_filters(tmp_path):
    with RunStore(tmp_path / "runs.db") as store:
        store.add_runs([record(1024), record(2048, status="oom", step=None), record(4096, status="timeout", step=None)])
        assert store.done_keys() == {record(s).key for s in (1024, 2048, 4096)}
        assert store.done_keys(["ok", "oom"]) == {record(1024).key, record(2048).key}
        assert [r.candidate.seq_len for r in store.runs(status="oom")] == [2048]
        assert store.runs(model="llama-2-7b") == []


def test_jsonl_export_import_is_lossless_and_idempotent(tmp_path):
    records = [record(1024), record(2048, status="crash", step=None), record(1024, date="2026-11-30T10:00:00+00:00")]
    with RunStore(tmp_path / "a.db") as a:
        a.add_runs(records)
        assert a.export_jsonl(tmp_path / "runs.jsonl") == 3
    lines = (tmp_path / "runs.jsonl").read_text().splitlines()
    assert [json.loads(line)["result"]["status"] for line in lines] == ["ok", "crash", "ok"]
    with RunStore(tmp_path / "b.db") as b:
        assert b.import_jsonl(tmp_path / "runs.jsonl") == 3
        assert b.import_jsonl(tmp_path / "runs.jsonl") == 0
        assert b.runs() == a_runs_sorted(records)


def a_runs_sorted(records):
    return sorted(records, key=lambda r: r.date)


def test_a_malformed_jsonl_line_is_named(tmp_path):
    path = tmp_path / "runs.jsonl"
    path.write_text(record(1024).to_json_line() + '{"key": "x"}\n')
    with RunStore(tmp_path / "runs.db") as store:
        with pytest.raises(RunFileError, match=r"runs.jsonl:2"):
            store.import_jsonl(path)
        assert store.count() == 0  # the good line was not half-imported either


@pytest.mark.parametrize("edit, named", [
    (lambda d: d["candidate"].update(model=None), "candidate.model"),
    (lambda d: d["candidate"].update(seq_len="long"), "candidate.seq_len"),
    (lambda d: d["result"].update(status="weird"), "status must be one of"),
    (lambda d: d.update(result=None), "result"),
    (lambda d: d["result"].update(step_time_s=[1.0]), "result.step_time_s"),
])
def test_a_record_of_the_wrong_types_is_named_by_line_and_field(tmp_path, edit, named):
    """A record edited by hand failed deep inside the model (a null model: AttributeError in `advisor
    report`, 2026-12-04); every field's type is now checked as the line is read."""
    from runs.jsonl import read_records

    data = json.loads(record(1024).to_json_line())
    edit(data)
    path = tmp_path / "runs.jsonl"
    path.write_text(record(512).to_json_line() + json.dumps(data) + "\n" + record(2048).to_json_line())
    with pytest.raises(RunFileError, match=rf"runs.jsonl:2: not a run record \(.*{named}"):
        read_records(path)


def test_a_record_from_a_newer_harness_keeps_what_it_knows_and_an_old_one_its_loss():
    data = json.loads(record(1024).to_json_line())
    data["result"]["a_field_from_the_future"] = 1
    del data["candidate"]["loss_dtype"]
    again = RunRecord.from_dict(data)
    assert again.result == record(1024).result and again.candidate.loss_dtype == "bf16"


def test_a_version_1_store_is_migrated_and_keeps_its_runs(tmp_path):
    path = tmp_path / "runs.db"
    db = sqlite3.connect(path)
    for statement in MIGRATIONS[0]:
        db.execute(statement)
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    with RunStore(path) as store:  # version 1 had a calibration table nothing wrote
        store.add_run(record(2048))
    with RunStore(path) as store:
        assert store.schema_version == SCHEMA_VERSION and store.count() == 1
        tables = {row[0] for row in store._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert tables == {"runs"}


def test_two_stores_on_one_file_see_each_others_writes(tmp_path):
    path = tmp_path / "runs.db"
    with RunStore(path) as writer, RunStore(path) as reader:
        writer.add_run(record(1024))
        assert reader.count() == 1


def test_default_store_path_prefers_the_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_store_path() == tmp_path / "cache" / "energy-advisor" / "runs.db"
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))  # a file where the folder would go
    assert str(default_store_path()) == "runs.db"


def test_a_torn_last_line_is_skipped_said_and_any_other_bad_line_named(tmp_path):
    from runs.jsonl import TornLineWarning, append_record, read_records

    path = tmp_path / "runs.jsonl"
    append_record(path, record(1024))
    with open(path, "a") as f:
        f.write('{"key": "half a reco')  # the sweep was killed while writing
    with pytest.warns(TornLineWarning, match="runs.jsonl:2: the last line is cut short"):
        assert [r.candidate.seq_len for r in read_records(path)] == [1024]
    append_record(path, record(2048))  # the resumed sweep's next run: the torn line is cut, not continued
    with open(path, "a") as f:
        f.write('{"key": "half')  # killed again
    append_record(path, record(4096))
    assert [r.candidate.seq_len for r in read_records(path)] == [1024, 2048, 4096]
    path.write_text(record(1024).to_json_line() + '{"key": "half a reco\n')  # ends as a line does: not torn
    with pytest.raises(RunFileError, match="runs.jsonl:2: not valid JSON"):
        read_records(path)
    path.write_text('{"key": "half"\n' + record(1024).to_json_line())
    with pytest.raises(RunFileError, match="runs.jsonl:1"):
        read_records(path)
    assert read_records(tmp_path / "none.jsonl", missing_ok=True) == []
    with pytest.raises(RunFileError, match="not found"):
        read_records(tmp_path / "none.jsonl")


def test_the_thread_count_is_part_of_what_a_run_is():
    one = Candidate(model="m", seq_len=64, ds_config=ds_config(2), strategy={"cpu_threads_per_rank": 1})
    many = Candidate(model="m", seq_len=64, ds_config=ds_config(2), strategy={"cpu_threads_per_rank": 16})
    default = Candidate(model="m", seq_len=64, ds_config=ds_config(2), strategy={"cpu_threads_per_rank": 0})
    assert len({one.key(), many.key(), default.key()}) == 3
    assert default.key() == Candidate(model="m", seq_len=64, ds_config=ds_config(2)).key()
