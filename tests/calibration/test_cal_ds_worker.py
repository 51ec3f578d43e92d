"""The calibration's DeepSpeed worker: one process for the engines, its failures said in one line, and
the steps it runs marked as sharing a process (their memory is not theirs)."""
from __future__ import annotations

import os
import stat
import sys
import time

import pytest
import torch

from calibration.calibrate import _worker
from calibration.ds_worker import DeepSpeedWorker, WorkerError, _request_scope
from calibration.microbench import ds_steps
from calibration.microbench.common import BenchContext, sizes_for
from runs.measured import to_measured_run
from runs.record import Candidate, RunRecord, RunResult


@pytest.fixture(scope="module")
def cpu_steps():
    """Two CPU-path steps run one after the other in one worker, and the worker's process id each time."""
    ctx = BenchContext(device=torch.device("cpu"), sizes=sizes_for(True, True))
    ctx.worker = _worker(ctx)
    try:
        z0 = ds_steps.bench_step(ctx, next(c for c in ds_steps.CASES if c.name == "z0"))
        pid_after_z0 = ctx.worker._proc.pid
        z3 = ds_steps.bench_step(ctx, next(c for c in ds_steps.CASES if c.name == "z3"))
        pid_after_z3 = ctx.worker._proc.pid
    finally:
        ctx.worker.close()
    return z0, z3, pid_after_z0, pid_after_z3


def test_the_steps_run_in_one_long_lived_process_and_record_as_runs(cpu_steps):
    z0, z3, pid0, pid3 = cpu_steps
    assert pid0 == pid3  # DeepSpeed's start-up paid once
    for row, stage in ((z0, 0), (z3, 3)):
        result = RunResult.from_dict(row["result"])
        assert result.status == "ok" and result.step_time_s > 0 and result.measured_steps >= 2
        assert result.layout["zero_stage"] == stage
        assert Candidate(**row["candidate"]).strategy["cpu_threads_per_rank"] == 1  # the CPU path's issue threads


def test_a_step_that_shared_its_process_gives_the_fit_no_memory(cpu_steps):
    z0 = cpu_steps[0]
    record = RunRecord.now(Candidate(**z0["candidate"]), RunResult.from_dict(z0["result"]))
    assert record.result.shared_process
    run = to_measured_run(record)
    assert run.step_time_s > 0
    assert (run.peak_gpu_mem_gib, run.peak_gpu_reserved_gib, run.peak_host_mem_gib) == (None, None, None)


def test_a_request_leaves_torch_s_own_linear_behind():
    import torch.nn.functional as F

    own = F.linear
    with _request_scope():
        F.linear = lambda *a, **k: None  # what deepspeed.zero.Init leaves for good
    assert F.linear is own


def _fake_python(tmp_path, body: str) -> str:
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_a_worker_that_dies_is_one_line_with_its_last_words(tmp_path):
    worker = DeepSpeedWorker({}, python=_fake_python(tmp_path, "echo 'no module named deepspeed' >&2; exit 3"))
    try:
        with pytest.raises(WorkerError, match=r"exit 3\): no module named deepspeed"):
            worker.request({"op": "warm"}, timeout_s=20)
    finally:
        worker.close()


def test_a_worker_that_overruns_is_stopped(tmp_path):
    worker = DeepSpeedWorker({}, python=_fake_python(tmp_path, "sleep 60"))
    started = time.monotonic()
    try:
        with pytest.raises(WorkerError, match="no reply within 1 s"):
            worker.request({"op": "warm"}, timeout_s=1)
    finally:
        worker.close()
    assert time.monotonic() - started < 15


def test_an_unknown_request_is_the_reply_s_error_and_the_worker_goes_on():
    worker = DeepSpeedWorker({"OMP_NUM_THREADS": "1"})
    try:
        with pytest.raises(WorkerError, match="unknown request 'nothing'"):
            worker.request({"op": "nothing"}, timeout_s=60)
        pid = worker._proc.pid
        with pytest.raises(WorkerError, match="unknown request"):
            worker.request({"op": "nothing again"}, timeout_s=60)
        assert worker._proc.pid == pid
    finally:
        worker.close()


def test_closing_the_worker_ends_the_processes_it_started(tmp_path):
    """SuperOffload's CPU-optimizer processes may outlive the worker; closing ends its whole session."""
    pid_file = tmp_path / "child.pid"
    reply = '@@calibration-worker@@ {"ok": true, "data": {"ran": true}}'
    body = (f"sleep 300 & echo $! > {pid_file}\nread line\necho '{reply}'\nread line\nexit 0")
    worker = DeepSpeedWorker({}, python=_fake_python(tmp_path, body))
    assert worker.request({"op": "warm"}, timeout_s=20) == {"ran": True}
    child = int(pid_file.read_text())
    worker.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.1)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"  # a zombie is dead, waiting for its parent to read it
    except FileNotFoundError:
        return False
