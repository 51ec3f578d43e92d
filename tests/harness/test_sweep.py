"""The sweep runner: order, resumption, failures, GPU slots, deadline; and a real sweep killed
midway loses nothing it finished and, resumed, runs only what is left."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from harness_helpers import ds_config

import calibration.harness.runner as runner
from calibration.harness.runner import Slot, run_sweep, split_slots
from runs.jsonl import read_records
from runs.record import Candidate, RunRecord, RunResult

REPO = Path(__file__).resolve().parents[2]


def cand(label: str, gpus: int = 1, seq: int = 64) -> Candidate:
    return Candidate(model="qwen2.5-0.5b", seq_len=seq, ds_config={**ds_config(2), "label": label}, gpus=gpus,
                     label=label)


class FakeRuns:
    """Stands in for run_candidate: sleeps, records when and where each run went."""

    def __init__(self, seconds: dict[str, float], status: dict[str, str] | None = None):
        self.seconds, self.status = seconds, status or {}
        self.events: dict[str, tuple[float, float, list]] = {}
        self.lock = threading.Lock()

    def __call__(self, c, workdir, settings, slots):
        start = time.monotonic()
        wanted = self.seconds.get(c.label, 0.05)
        time.sleep(min(wanted, settings.timeout_s))
        with self.lock:
            self.events[c.label] = (start, time.monotonic(), [s.gpu for s in slots])
        if wanted > settings.timeout_s:
            return RunResult(status="timeout", reason="slow")
        status = self.status.get(c.label, "ok")
        ok = status == "ok"
        return RunResult(status=status, reason="" if ok else "boom", step_time_s=0.1 if ok else None)


@pytest.fixture
def fake(monkeypatch):
    def install(seconds=None, status=None):
        f = FakeRuns(seconds or {}, status)
        monkeypatch.setattr(runner, "run_candidate", f)
        return f
    return install


def test_failures_do_not_stop_the_sweep_and_every_run_is_appended_in_order(tmp_path, fake):
    fake(status={"b": "crash", "c": "oom"})
    jsonl = tmp_path / "runs.jsonl"
    seen = []
    new = run_sweep([cand("a"), cand("b"), cand("c"), cand("d")], jsonl, tmp_path, on_record=seen.append)
    assert [r.candidate.label for r in read_records(jsonl)] == ["a", "b", "c", "d"]
    assert [r.result.status for r in new] == ["ok", "crash", "oom", "ok"]
    assert seen == new


def test_a_resumed_sweep_skips_recorded_runs_and_a_torn_last_line(tmp_path, fake):
    f = fake()
    jsonl = tmp_path / "runs.jsonl"
    done = [RunRecord.now(cand(label), RunResult(status="ok")).to_json_line() for label in ("a", "b")]
    torn = RunRecord.now(cand("c"), RunResult(status="ok")).to_json_line()[:40]
    jsonl.write_text("".join(done) + torn)  # the sweep was killed while writing c
    new = run_sweep([cand("a"), cand("b"), cand("c"), cand("d")], jsonl, tmp_path)
    assert sorted(f.events) == ["c", "d"]
    assert [r.candidate.label for r in new] == ["c", "d"]


def test_retry_reruns_the_statuses_asked_for(tmp_path, fake):
    f = fake()
    jsonl = tmp_path / "runs.jsonl"
    jsonl.write_text(RunRecord.now(cand("a"), RunResult(status="timeout")).to_json_line()
                     + RunRecord.now(cand("b"), RunResult(status="oom")).to_json_line())
    run_sweep([cand("a"), cand("b")], jsonl, tmp_path, retry=("timeout",))
    assert list(f.events) == ["a"]


def test_single_gpu_runs_share_the_machine_and_a_two_gpu_run_waits_for_both(tmp_path, fake):
    f = fake(seconds={"a": 0.6, "big": 0.2, "c": 0.3, "d": 0.1})
    slots = [Slot(0, (0,)), Slot(1, (1,))]
    new = run_sweep([cand("a"), cand("big", gpus=2), cand("c"), cand("d")], tmp_path / "r.jsonl", tmp_path,
                    slots=slots)
    (a0, a1, a_gpus), (b0, b1, b_gpus), (c0, c1, c_gpus) = (f.events[k] for k in ("a", "big", "c"))
    assert c0 < a1  # c used the idle GPU while "big" waited for both
    assert b0 >= max(a1, c1) - 0.01 and sorted(b_gpus) == [0, 1]
    assert sorted(a_gpus + c_gpus) == [0, 1]
    assert f.events["d"][0] >= b1 - 0.01  # one backfill per waiting run: d waited its turn
    by_label = {r.candidate.label: r.result for r in new}
    assert by_label["a"].concurrent_runs == 2 and by_label["big"].concurrent_runs == 1


def test_serial_mode_runs_one_at_a_time(tmp_path, fake):
    f = fake(seconds={"a": 0.2, "b": 0.2})
    run_sweep([cand("a"), cand("b")], tmp_path / "r.jsonl", tmp_path, slots=[Slot(0), Slot(1)], concurrent=False)
    assert f.events["b"][0] >= f.events["a"][1] - 0.01


def test_a_run_needing_more_gpus_than_the_machine_has_is_recorded_not_run(tmp_path, fake):
    f = fake()
    new = run_sweep([cand("huge", gpus=4), cand("a")], tmp_path / "r.jsonl", tmp_path, slots=[Slot(0), Slot(1)])
    assert new[0].result.status == "crash" and "needs 4 GPUs, the machine has 2" in new[0].result.reason
    assert list(f.events) == ["a"]


def predicting_host(gib: dict[str, float]):
    """A predictor giving each candidate the host peak named for its label."""
    return lambda c: ({"peak_host_mem_gib": gib.get(c.label, 1.0)}, "h200", [])


def test_a_run_predicted_past_the_hosts_memory_is_neither_run_nor_recorded(tmp_path, fake):
    f = fake()
    skipped = []
    settings = runner.RunSettings(host_memory_gib=125.0)
    new = run_sweep([cand("7b-offload"), cand("a")], tmp_path / "r.jsonl", tmp_path, settings,
                    predict=predicting_host({"7b-offload": 140.6}), on_skip=lambda c, why: skipped.append((c.label, why)))
    assert list(f.events) == ["a"] and [r.candidate.label for r in new] == ["a"]
    assert skipped[0][0] == "7b-offload" and "140.6 GiB" in skipped[0][1] and "125.0 GiB" in skipped[0][1]
    assert [r.candidate.label for r in read_records(tmp_path / "r.jsonl")] == ["a"]  # a bigger host runs it later


def test_without_gpus_a_runs_gpu_memory_counts_against_the_host(tmp_path, fake):
    f = fake()
    skipped = []
    settings = runner.RunSettings(host_memory_gib=20.0)
    predicted = {"7b": {"peak_host_mem_gib": 1.9, "allocated_gpu_mem_gib": 120.0},
                 "tiny": {"peak_host_mem_gib": 1.9, "allocated_gpu_mem_gib": 0.1}}
    run_sweep([cand("7b"), cand("tiny")], tmp_path / "r.jsonl", tmp_path, settings,
              predict=lambda c: (predicted[c.label], "h200", []), on_skip=lambda c, why: skipped.append(c.label))
    assert skipped == ["7b"] and list(f.events) == ["tiny"]


def test_runs_start_side_by_side_only_while_their_host_peaks_fit_together(tmp_path, fake):
    f = fake(seconds={"a": 0.3, "b": 0.3, "c": 0.3})
    settings = runner.RunSettings(host_memory_gib=125.0)
    run_sweep([cand("a"), cand("b"), cand("c")], tmp_path / "r.jsonl", tmp_path, settings,
              slots=[Slot(0), Slot(1)], predict=predicting_host({"a": 70.0, "b": 70.0, "c": 40.0}))
    (a0, a1, _), (b0, _, _), (c0, _, _) = (f.events[k] for k in "abc")
    assert c0 < a1  # c (40 GiB) joined a (70 GiB) on the idle GPU
    assert b0 >= a1 - 0.01  # b (70 GiB) waited: a and b together need 140


def test_without_gpus_multi_rank_runs_share_the_cpu_one_at_a_time(tmp_path, fake):
    f = fake(seconds={"two": 0.2, "one": 0.1})
    run_sweep([cand("two", gpus=2), cand("one")], tmp_path / "r.jsonl", tmp_path)
    assert f.events["one"][0] >= f.events["two"][1] - 0.01


def test_the_deadline_stops_the_sweep_and_a_run_it_cut_is_not_recorded(tmp_path, fake):
    f = fake(seconds={"a": 0.1, "long": 5.0, "never": 0.1})
    jsonl = tmp_path / "r.jsonl"
    start = time.monotonic()
    new = run_sweep([cand("a"), cand("long"), cand("never")], jsonl, tmp_path, deadline_s=1.0, min_run_s=0.2)
    assert time.monotonic() - start < 3
    assert [r.candidate.label for r in new] == ["a"]
    assert "never" not in f.events
    assert [r.candidate.label for r in read_records(jsonl)] == ["a"]  # "long" runs again next time


def test_cores_are_split_evenly_between_gpus():
    slots = split_slots([0, 1], cpus=list(range(32)))
    assert slots[0] == Slot(0, tuple(range(16))) and slots[1] == Slot(1, tuple(range(16, 32)))


@pytest.mark.slow
def test_a_killed_sweep_keeps_what_it_finished_and_resumes_with_the_rest(tmp_path, tiny_model):
    """A real `advisor validate --sweep`, killed while its second run is in flight."""
    sweep = tmp_path / "sweep.jsonl"
    lines = [{"model": tiny_model, "seq": seq, "ds_config": ds_config(stage)} for seq, stage in
             ((32, 0), (64, 1), (128, 2))]
    sweep.write_text("".join(json.dumps(x) + "\n" for x in lines))
    store, jsonl = tmp_path / "runs.db", tmp_path / "runs.jsonl"
    cmd = [sys.executable, "-m", "advisor.cli", "validate", "--sweep", str(sweep), "--store", str(store),
           "--jsonl", str(jsonl), "--workdir", str(tmp_path / "work"), "--warmup", "1", "--steps", "1",
           "--min-window-s", "0", "--json"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while len(read_records(jsonl, missing_ok=True)) < 1 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    time.sleep(1.0)  # the second run is starting
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = read_records(jsonl)
    assert 1 <= len(finished) < 3 and all(r.result.status == "ok" for r in finished)

    from runs.store import RunStore

    with RunStore(store) as s:
        assert {r.key for r in s.runs()} == {r.key for r in finished}  # the store lost nothing either

    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert len(report["runs"]) == 3 and report["not_run"] == 0  # what the killed sweep finished shows as stored
    assert [r["stored"] for r in report["runs"]] == [True] * len(finished) + [False] * (3 - len(finished))
    assert [r.candidate.seq_len for r in read_records(jsonl)] == [32, 64, 128]
    with RunStore(store) as s:
        assert s.count() == 3


def test_a_harness_that_cannot_start_records_nothing_and_stops_the_sweep(tmp_path, monkeypatch):
    def broken(c, workdir, settings, slots):
        return RunResult(status="crash", reason="FileNotFoundError: ds_config.json", harness_error=True)

    monkeypatch.setattr(runner, "run_candidate", broken)
    jsonl = tmp_path / "runs.jsonl"
    with pytest.raises(runner.HarnessError, match="the harness could not start.*FileNotFoundError"):
        run_sweep([cand("a"), cand("b"), cand("c")], jsonl, tmp_path / "work")
    assert read_records(jsonl, missing_ok=True) == []  # a rerun after the fix runs all three, no --retry needed


def test_missing_files_and_modules_are_the_harness_not_the_candidate():
    from calibration.harness.train import classify_failure, is_harness_error

    assert is_harness_error(FileNotFoundError("work/x/ds_config.json")) and is_harness_error(ImportError("deepspeed"))
    assert not is_harness_error(RuntimeError("CUDA out of memory"))
    assert classify_failure(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB")) == "oom"


def test_a_relative_workdir_is_resolved_before_the_run_changes_folder(tmp_path, monkeypatch):
    seen = {}

    class Proc:
        returncode = 0
        pid = 0

        def __init__(self, cmd, cwd, **kw):
            seen["cmd"], seen["cwd"] = cmd, cwd

        def wait(self, timeout=None):
            return 0

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runner.subprocess, "Popen", Proc)
    runner.run_candidate(cand("a"), Path("work"))
    config = seen["cmd"][seen["cmd"].index("--ds-config") + 1]
    assert Path(config).is_absolute() and Path(config).exists()
    assert Path(seen["cwd"]).is_absolute()
