"""`advisor validate`: candidates from a DeepSpeed config or a sweep file, predictions made
before each run, and the end-to-end command on a tiny model."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from harness_helpers import ds_config

from advisor.cli import main
from advisor.validate import (
    SweepFileError,
    candidate_from_ds_config,
    candidates_from_sweep,
    compare,
    make_predictor,
    predicted_sweep,
)
from runs.record import Candidate, RunRecord, RunResult
from runs.store import RunStore


def write_sweep(tmp_path, *lines) -> str:
    path = tmp_path / "sweep.jsonl"
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return str(path)


def test_a_strategy_line_gets_its_config_from_advisor_ds_config(tmp_path):
    strategy = {"gpus": 2, "gpus_per_node": 2, "zero_stage": 3, "sp": 2, "checkpoint_every": 1,
                "offload_optimizer": "cpu", "super_offload": True}
    (c,) = candidates_from_sweep(write_sweep(tmp_path, {"model": "qwen2.5-0.5b", "seq": 16384, "strategy": strategy}))
    zero = c.ds_config["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_optimizer"]["super_offload"] is True
    assert c.ds_config["sequence_parallel_size"] == 2 and "activation_checkpointing" in c.ds_config
    assert (c.gpus, c.sp, c.checkpoint_every) == (2, 2, 1)
    assert c.strategy["super_offload"] is True and c.label.startswith("z3 off-super")


def test_a_ds_config_line_is_read_back_into_a_strategy(tmp_path):
    cfg = {**ds_config(2, micro_batch=2, grad_accum=4), "train_batch_size": 16}
    (c,) = candidates_from_sweep(write_sweep(tmp_path, "# comment", {"model": "qwen2.5-0.5b", "seq": 2048,
                                                                      "ds_config": cfg}))
    assert c.ds_config == cfg  # run as given
    assert c.gpus == 2  # 16 sequences = 2 x 4 x dp 2
    assert (c.strategy["zero_stage"], c.strategy["micro_batch"], c.strategy["grad_accum"]) == (2, 2, 4)


@pytest.mark.parametrize("line, message", [
    ({"model": "qwen2.5-0.5b", "seq": 4096, "strategy": {}, "colour": "red"}, "unknown keys"),
    ({"model": "qwen2.5-0.5b", "strategy": {}}, "needs 'seq'"),
    ({"model": "qwen2.5-0.5b", "seq": 4096}, "needs 'strategy' or 'ds_config'"),
    ({"model": "qwen2.5-0.5b", "seq": 4096, "strategy": {"zero_stage": 0, "offload_optimizer": "cpu"}},
     "optimizer offload needs ZeRO stage 1, 2 or 3"),
    ({"model": "no-such-model", "seq": 4096, "strategy": {}}, "unknown model"),
    # found by fuzzing sweep lines (2026-12-04): each ended in a traceback
    ({"model": None, "seq": 4096, "strategy": {}}, "needs 'model'"),
    ({"model": "qwen2.5-0.5b", "seq": True, "strategy": {}}, "'seq' is a positive whole number"),
    ({"model": "qwen2.5-0.5b", "seq": 4096, "strategy": [2]}, "'strategy' is a JSON object"),
    ({"model": "qwen2.5-0.5b", "seq": 4096, "strategy": {"gpus_per_node": False}}, "gpus_per_node must be a whole"),
    ({"model": "qwen2.5-0.5b", "seq": 4096, "strategy": {"zero_stage": "2"}}, "zero_stage must be a whole"),
    ({"model": "qwen2.5-0.5b", "seq": 4096, "images": -1, "strategy": {}}, "'images' is a whole number"),
    ([1, 2], "a line is a JSON object"),
])
def test_a_bad_sweep_line_is_named(tmp_path, line, message):
    path = write_sweep(tmp_path, {"model": "qwen2.5-0.5b", "seq": 4096, "strategy": {}}, line)
    with pytest.raises(SweepFileError, match=rf"sweep.jsonl:2: .*{message}"):
        candidates_from_sweep(path)


ANY_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-3, 70), st.floats(-2, 100), st.just(float("nan")),
                     st.sampled_from(["cpu", "none", "nvme", "", "2"]), st.lists(st.integers(), max_size=1))
STRATEGY_FIELDS = st.sampled_from(["zero_stage", "gpus", "gpus_per_node", "micro_batch", "grad_accum", "sp",
                                   "checkpoint_every", "offload_optimizer", "offload_param", "offload_ratio",
                                   "super_offload", "cpu_checkpointing", "cpu_threads_per_rank", "overlap_comm"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(strategy=st.dictionaries(STRATEGY_FIELDS, ANY_VALUE, max_size=5),
       seq=st.one_of(st.integers(-1, 70000), ANY_VALUE), model=st.sampled_from(["tiny-cpu", None, "", 7]))
def test_any_sweep_line_is_a_candidate_with_a_prediction_or_one_named_error(tmp_path, strategy, seq, model):
    """A sweep file's JSON can hold anything: a line is refused with its file and line, or becomes a
    candidate the model predicts (or says why not); never a traceback."""
    path = write_sweep(tmp_path, {"model": model, "seq": seq, "strategy": strategy})
    try:
        (c,) = candidates_from_sweep(path)
    except SweepFileError as exc:
        assert "sweep.jsonl:1: " in str(exc)
        return
    prediction, _, notes = make_predictor("h200")(c)
    assert prediction is not None or notes


def test_freezing_is_dropped_for_a_model_without_vision():
    c = candidate_from_ds_config("qwen2.5-0.5b", 4096, ds_config(2), freeze_vision=True)
    assert c.freeze_vision is False and c.gpus == 1


def test_the_predictor_uses_the_cost_model_and_records_why_when_it_cannot():
    c = candidate_from_ds_config("qwen2.5-0.5b", 4096, ds_config(2))
    pred, profile, notes = make_predictor("gh200")(c)
    assert notes == [] and profile == "gh200"
    assert pred["step_time_s"] > 0 and pred["gpu_energy_j"] > 0
    pred, _, notes = make_predictor("no-such-profile")(c)
    assert pred is None and notes[0].startswith("no prediction:")
    bare = Candidate(model="qwen2.5-0.5b", seq_len=4096, ds_config=ds_config(2))
    assert make_predictor("gh200")(bare)[2] == ["no prediction: the candidate carries no strategy"]


def test_a_predicted_sweep_pairs_each_line_with_its_prediction_in_order(tmp_path):
    strategy = {"zero_stage": 2, "checkpoint_every": 1}
    path = write_sweep(tmp_path, {"model": "qwen2.5-0.5b", "seq": 4096, "strategy": strategy},
                       {"model": "qwen2.5-0.5b", "seq": 8192, "strategy": strategy})
    first, second = predicted_sweep(path, "gh200")
    assert (first.candidate.seq_len, second.candidate.seq_len) == (4096, 8192)
    assert first.profile == "gh200" and first.notes == []
    assert 0 < first.prediction["step_time_s"] < second.prediction["step_time_s"]
    missing = predicted_sweep(path, "no-such-profile")[0]
    assert missing.prediction is None and missing.notes[0].startswith("no prediction:")
    with pytest.raises(SweepFileError):
        predicted_sweep(write_sweep(tmp_path, "{not json"), "gh200")


def test_compare_gives_signed_percentage_errors():
    c = Candidate(model="m", seq_len=1, ds_config={}, label="x")
    r = RunRecord.now(c, RunResult(status="ok", step_time_s=2.0, gpu_energy_j=1000.0, peak_gpu_mem_gib=None,
                                   peak_gpu_reserved_gib=40.0),
                      prediction={"step_time_s": 2.5, "gpu_energy_j": 900.0, "allocated_gpu_mem_gib": 30.0,
                                  "reserved_gpu_mem_gib": 44.0, "peak_gpu_mem_gib": 46.0})
    cmp = compare(r)
    assert cmp.error_pct["step_time_s"] == pytest.approx(25.0)
    assert cmp.error_pct["gpu_energy_j"] == pytest.approx(-10.0)
    assert cmp.error_pct["allocated_gpu_mem_gib"] is None  # not measured: no error, not -100%
    # like with like, as advisor report: the allocator's predicted pool against reserved memory
    assert cmp.error_pct["reserved_gpu_mem_gib"] == pytest.approx(10.0)
    assert cmp.step_time_rel_sem is None  # no steps recorded: nothing to tell


def test_compare_says_how_well_the_mean_step_is_known():
    c = Candidate(model="m", seq_len=1, ds_config={}, label="x")
    noisy = RunRecord.now(c, RunResult(status="ok", step_time_s=2.5, step_times_s=[2.0, 3.0, 2.0, 3.0]))
    assert compare(noisy).step_time_rel_sem == pytest.approx((0.5774 / 2.5) / 2, rel=1e-2)
    steady = RunRecord.now(c, RunResult(status="ok", step_time_s=1.0, step_times_s=[1.0] * 6))
    assert compare(steady).step_time_rel_sem == 0.0
    short = RunRecord.now(c, RunResult(status="ok", step_time_s=0.15, step_times_s=[0.1, 0.2, 0.1, 0.2]))
    assert compare(short).step_time_rel_sem is None  # within one host spell: not known
    assert compare(short).window_s == pytest.approx(0.6) and compare(noisy).window_s == pytest.approx(10.0)


@pytest.mark.slow
def test_validate_end_to_end_on_a_tiny_model(tmp_path, tiny_model):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps(ds_config(2, checkpoint=True)))
    args = ["validate", "--model", tiny_model, "--seq", "64", "--ds-config", str(cfg), "--store",
            str(tmp_path / "runs.db"), "--workdir", str(tmp_path / "work"), "--warmup", "1", "--steps", "2",
            "--min-window-s", "0", "--precision", "0"]
    result = CliRunner().invoke(main, args + ["--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    (run,) = report["runs"]
    assert run["status"] == "ok" and run["measured"]["step_time_s"] > 0
    assert run["measured"]["gpu_energy_j"] is None  # no GPU: not measured
    assert run["predicted"]["step_time_s"] > 0  # predicted before the run, with the default profile
    assert run["error_pct"]["step_time_s"] is not None
    assert 0 < run["window_s"] < 2 and run["step_time_rel_sem"] is None  # two tiny steps: within one host spell
    with RunStore(tmp_path / "runs.db") as store:
        (stored,) = store.runs()
    assert stored.prediction["step_time_s"] == run["predicted"]["step_time_s"]
    assert stored.result.layout["checkpoint_every"] == 1
    assert (tmp_path / "work" / "runs.jsonl").read_text().count("\n") == 1

    again = CliRunner().invoke(main, args)  # already stored: nothing runs, the table shows the stored run
    assert again.exit_code == 0, again.output
    assert "ok (stored)" in again.output and "candidate(s) not run" not in again.output
    fresh = [a if a != str(tmp_path / "runs.db") else str(tmp_path / "fresh.db") for a in args]
    table = CliRunner().invoke(main, [a if a != str(tmp_path / "work") else str(tmp_path / "fresh") for a in fresh])
    assert table.exit_code == 0, table.output
    said = " ".join(table.output.split())  # rich wraps the lines
    assert "shorter than two 2-s host spells" in said
    # a tiny model's step is all the host's: one run does not say how it repeats in another process
    assert run["host_share"] > 0.5 and "repeats to about +-16% (one sd) from one run to the next" in said


def test_validate_needs_exactly_one_source(tmp_path):
    result = CliRunner().invoke(main, ["validate", "--store", str(tmp_path / "r.db")])
    assert result.exit_code == 2 and "either --ds-config" in result.output


def test_a_sweep_naming_a_repository_config_is_predicted_from_any_folder(tmp_path, monkeypatch):
    """Sweep files name their configs by repository path (data/sweeps/gqa-2.4b.json): from another
    folder the prediction, and the run it goes with, find the config all the same."""
    from advisor.validate import candidates_from_sweep, make_predictor

    sweep = tmp_path / "s.jsonl"
    sweep.write_text(json.dumps({"model": "data/sweeps/gqa-2.4b.json", "seq": 1024,
                                 "strategy": {"gpus": 1, "zero_stage": 2}}) + "\n")
    monkeypatch.chdir(tmp_path)
    (c,) = candidates_from_sweep(sweep)
    prediction, _, notes = make_predictor("h200")(c)
    assert prediction is not None and prediction["step_time_s"] > 0, notes
    assert c.model == "data/sweeps/gqa-2.4b.json"  # the key stays the one earlier runs of it have


@pytest.mark.slow
def test_a_stopped_validate_takes_its_run_with_it_and_says_so(tmp_path, tiny_model):
    """SIGTERM (kill, a scheduler's stop) during a run: the command ends as Ctrl-C ends it, non-zero and
    saying so, and the run's own session (torchrun, its ranks) is gone with it, not left computing."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import psutil

    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps(ds_config(2)))
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "advisor.cli", "validate", "--model", tiny_model, "--seq", "64", "--ds-config", str(cfg),
         "--store", str(tmp_path / "runs.db"), "--workdir", str(tmp_path / "work"), "--warmup", "1",
         "--steps", "1000000", "--timeout", "600"],  # a window far longer than the test
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=repo)
    try:
        deadline, run = time.monotonic() + 120, []
        while time.monotonic() < deadline and not run:  # the harness's processes start
            run = [p for p in psutil.Process(proc.pid).children(recursive=True)
                   if "calibration.harness" in " ".join(p.cmdline())]
            time.sleep(0.2)
        assert run, "the run never started"
        run = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) != 0
        _, alive = psutil.wait_procs(run, timeout=30)
        assert not alive, [p.cmdline() for p in alive]
        assert "Aborted" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_run_whose_allocator_retried_is_named_as_at_the_memory_limit():
    """An uncapped run whose allocator had to free its cache and retry hit the GPU's memory: the
    comparison says so, and says nothing for a run that never retried, failed or did not record it."""
    c = Candidate(model="m", seq_len=1, ds_config={}, label="x")
    tight = compare(RunRecord.now(c, RunResult(status="ok", step_time_s=1.0, gpu_alloc_retries=3)))
    assert tight.gpu_alloc_retries == 3 and "3 time(s)" in tight.memory_note
    assert tight.to_dict()["gpu_alloc_retries"] == 3  # --json carries it
    for result in (RunResult(status="ok", step_time_s=1.0, gpu_alloc_retries=0), RunResult(status="ok", step_time_s=1.0),
                   RunResult(status="oom", reason="CUDA out of memory", gpu_alloc_retries=2)):
        assert compare(RunRecord.now(c, result)).memory_note is None
