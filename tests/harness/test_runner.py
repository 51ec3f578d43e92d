"""Real runs of the harness through the runner, on the CPU (gloo, torch Adam): what succeeds
is measured, what fails is recorded as oom, crash or timeout with its reason."""
from __future__ import annotations

import json
import math

import pytest
from harness_helpers import TINY, ds_config

from runs.record import Candidate, RunResult
from calibration.harness.runner import RunSettings, _collect, run_candidate
from calibration.harness.window import WindowSettings

QUICK = RunSettings(WindowSettings(warmup=1, steps=2, min_window_s=0.0, precision=0.0), timeout_s=180)


def check_measured(result: RunResult, steps: int, world: int):
    assert result.status == "ok", result.reason
    assert result.measured_steps == steps and len(result.step_times_s) == steps
    assert result.step_time_s > 0 and result.window_s >= 0.9 * sum(result.step_times_s)
    assert result.world_size == world
    assert result.gpu_energy_j is None and result.peak_gpu_mem_gib is None  # no GPU here: not measured, not 0
    assert result.peak_host_mem_gib > result.host_mem_baseline_gib > 0.05
    assert result.cpu_process_core_s > 0
    # The host's readings, one a measured step (steal is on Linux hosts only: None elsewhere, never 0s)
    assert len(result.step_gc_s) == len(result.step_thread_cpu_s) == steps
    assert sum(result.step_thread_cpu_s) > 0
    assert result.step_steal_cpu_s is None or len(result.step_steal_cpu_s) == steps
    assert math.isfinite(result.loss_first) and math.isfinite(result.loss_last)
    assert any("torch_adam" in a for a in result.config_adjustments) or result.config_adjustments == []
    assert result.wall_s > result.timeline_s["measured"] - result.timeline_s["main"]
    probe = result.host_probe  # every rank probed its host; CPUAdam is not probed without a GPU
    assert len(probe["per_rank"]) == world and 0 < probe["issue_us_per_layer"] < 1e5
    assert 0 < probe["issue_us_per_layer_window_start"] < 1e5  # right before the window
    assert 0 < probe["issue_us_per_layer_after"] < 1e5  # and again after it
    assert probe["issue_probe_linear"] == "torch"  # not the linear deepspeed.zero.Init leaves behind
    assert all(0 < us < 1e5 for us in probe["issue_us_per_layer_in_window"])  # probes between steps, if any
    assert result.machine["boot_id"]  # the machine's boot, which its runs' probes are pooled over
    assert probe["cpu_adam_params_per_s"] is None and probe["threads"] == result.cpu_threads_per_rank


@pytest.mark.slow
def test_a_single_rank_zero3_run_is_measured(tmp_path, tiny_model, monkeypatch):
    """ZeRO 0 runs in test_sweep, 1 with offload and 2 below; 3 here and with Ulysses. Its two
    profiled steps come after the window and name DeepSpeed's ZeRO-3 step; its marked steps time
    each pass."""
    monkeypatch.setenv("ADVISOR_STEP_PROFILE", "1")
    monkeypatch.setenv("ADVISOR_PHASE_TRACE", "1")
    stage = 3
    # No parameter is kept whole for being small (the tiny layers all are): ZeRO-3 gathers each module's.
    c = Candidate(model=tiny_model, seq_len=64, ds_config=ds_config(stage, stage3_param_persistence_threshold=0),
                  strategy={"cpu_threads_per_rank": 1})
    result = run_candidate(c, tmp_path, QUICK)
    check_measured(result, steps=2, world=1)
    assert result.cpu_threads_per_rank == 1  # the candidate's thread count is what the rank ran with
    assert (tmp_path / c.key() / "result.json").exists()
    assert result.layout["zero_stage"] == stage and result.layout["optimizer"] == "AdamW"  # torch_adam on CPU
    coordinator = result.layout["zero3_coordinator"]  # what ZeRO-3 gathered over the window, a step
    assert coordinator["gathers_per_step"] > 0 and coordinator["gathered_params_per_step"] >= coordinator["gathers_per_step"]
    assert coordinator["invalidations"] == 0 and coordinator["complete_at_end"]  # one module order, step after step
    profile = json.loads((tmp_path / c.key() / "step_profile.json").read_text())
    assert any("stage3.py" in r["function"] and r["function"].endswith(" step") for r in profile["deepspeed_functions"])
    trace = json.loads((tmp_path / c.key() / "phase_trace.json").read_text())
    passes = trace["passes"]
    assert [p["name"] for p in passes] == ["forward", "backward", "step"] and all(p["host_s"] > 0 for p in passes)
    assert trace["pass_power"] is None  # no GPU meter here: the passes' power is absent, not invented


@pytest.mark.slow
def test_a_gemma3_shaped_decoder_runs_under_zero3_and_gathers_the_parameters_the_model_counts(tmp_path):
    """Heads of 32 on a 64-wide stream, q/k norms and the sandwich's norms: DeepSpeed's ZeRO-3 gathers,
    each step, one parameter per module the cost model counts (its hooks are priced per module)."""
    from models.architecture import load_architecture
    from models.params import count_params
    from models.workload import Workload

    config = tmp_path / "gemma3-shaped.json"
    config.write_text(json.dumps({**TINY, "model_type": "gemma3_text", "head_dim": 32}))
    c = Candidate(model=str(config), seq_len=64, ds_config=ds_config(3, stage3_param_persistence_threshold=0),
                  strategy={"cpu_threads_per_rank": 1})
    result = run_candidate(c, tmp_path, QUICK)
    check_measured(result, steps=2, world=1)
    counts = count_params(Workload(load_architecture(str(config)), 64))
    assert counts.modules_per_llm_layer == 13  # 9, two q/k norms, the sandwich's two
    assert result.layout["zero3_coordinator"]["gathered_params_per_step"] == counts.modules_llm
    assert result.loss_last < result.loss_first


@pytest.mark.slow
def test_offload_with_accumulation_runs_and_learns(tmp_path, tiny_model):
    cfg = ds_config(1, grad_accum=2, offload_optimizer={"device": "cpu"})
    result = run_candidate(Candidate(model=tiny_model, seq_len=64, ds_config=cfg), tmp_path,
                           RunSettings(WindowSettings(warmup=1, steps=3, min_window_s=0.0, precision=0.0)))
    check_measured(result, steps=3, world=1)
    assert result.loss_last < result.loss_first  # same batch every step: AdamW must fit it
    assert result.tokens_per_s == pytest.approx(2 * 64 / result.step_time_s)


@pytest.mark.slow
def test_ulysses_on_two_ranks_with_zero3_checkpointing_and_video(tmp_path, tiny_vl_model):
    """torchrun with two ranks on gloo: DeepSpeed's all-to-all works there, so sp=2 is tested."""
    c = Candidate(model=tiny_vl_model, seq_len=64, ds_config=ds_config(3, sp=2, checkpoint=True), gpus=2,
                  frames=4, freeze_vision=False)
    probing = RunSettings(WindowSettings(warmup=1, steps=2, min_window_s=0.0, precision=0.0, probe_every_s=1e-6),
                          timeout_s=180)
    result = run_candidate(c, tmp_path, probing)
    check_measured(result, steps=2, world=2)
    # both ranks probed the host after each step, on no step's clock: the slowest rank's each time
    assert len(result.host_probe["issue_us_per_layer_in_window"]) == 2
    assert result.window_s < sum(result.step_times_s) + 0.05
    assert result.layout["sp"] == 2 and result.layout["dp"] == 1 and result.layout["checkpoint_every"] == 1
    assert result.layout["zero_stage"] == 3 and result.layout["engine_optimizer"] == "DeepSpeedZeroOptimizer_Stage3"
    assert result.layout["vision_groups_rank0"] == 1  # 2 groups at 0 and 32: one per shard


@pytest.mark.slow
def test_short_steps_are_repeated_until_the_window_is_long_enough(tmp_path, tiny_model):
    result = run_candidate(Candidate(model=tiny_model, seq_len=64, ds_config=ds_config(2)), tmp_path,
                           RunSettings(WindowSettings(warmup=1, steps=1, min_window_s=0.5, max_steps=500, precision=0.0)))
    check_measured(result, steps=result.measured_steps, world=1)
    assert result.window_s >= 0.5
    assert result.measured_steps > 1 or result.step_times_s[0] >= 0.5  # one step suffices only if that long


@pytest.mark.slow
def test_host_out_of_memory_is_recorded_as_oom(tmp_path):
    huge = {**TINY, "vocab_size": 2**24, "hidden_size": 2**15}  # a 2 TB embedding: the allocation itself fails
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(huge))
    result = run_candidate(Candidate(model=str(path), seq_len=64, ds_config=ds_config(0)), tmp_path, QUICK)
    assert result.status == "oom", result.reason
    assert "rank 0" in result.reason and result.step_time_s is None


@pytest.mark.slow
def test_a_failing_run_is_a_crash_with_its_error(tmp_path, tiny_model):
    # Ulysses degree 2 on one rank: DeepSpeed's parallel_state_sp refuses it.
    c = Candidate(model=tiny_model, seq_len=64, ds_config=ds_config(0), sp=2)
    result = run_candidate(c, tmp_path, QUICK)
    assert result.status == "crash"
    assert "world_size (1) is less than sequence_parallel_size 2" in result.reason


@pytest.mark.slow
def test_a_run_past_its_timeout_is_stopped_and_recorded(tmp_path, tiny_model):
    c = Candidate(model=tiny_model, seq_len=64, ds_config=ds_config(0))
    # a window of a minute, so no start-up is quick enough to finish inside the timeout
    result = run_candidate(c, tmp_path, RunSettings(WindowSettings(min_window_s=60.0), timeout_s=2.0))
    assert result.status == "timeout" and "2 s" in result.reason
    assert result.wall_s < 20  # the whole process group went down, not just torchrun


def test_failures_without_error_files_are_classified_from_the_log(tmp_path):
    out, log = tmp_path / "result.json", tmp_path / "log.txt"
    log.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    assert _collect(out, log, 1, False, 60).status == "oom"
    log.write_text("[1]:\n  exitcode  : -9 (pid: 123)\n")
    assert _collect(out, log, 1, False, 60).status == "oom"
    log.write_text("UserWarning: barrier(): using the device under current context\n")
    killed = _collect(out, log, -9, False, 60)  # one rank, no torchrun to report the signal: the exit code says it
    assert killed.status == "oom" and "SIGKILL" in killed.reason
    log.write_text("ValueError: something else\n")
    crash = _collect(out, log, 1, False, 60)
    assert crash.status == "crash" and "something else" in crash.reason
    log.write_text("training done\n")  # a script that ran its own steps out before the window was measured
    short = _collect(out, log, 0, False, 60)
    assert short.status == "crash" and "before its measured window was complete" in short.reason


def test_a_ranks_oom_wins_over_its_peers_broken_collectives(tmp_path):
    out, log = tmp_path / "result.json", tmp_path / "log.txt"
    log.write_text("")
    RunResult(status="crash", reason="rank 0: gloo connection closed").write(f"{out}.rank0.error.json")
    RunResult(status="oom", reason="rank 1: CUDA out of memory").write(f"{out}.rank1.error.json")
    got = _collect(out, log, 1, False, 60)
    assert got.status == "oom" and got.reason.startswith("rank 1")


def test_threads_come_from_the_candidate_then_the_environment_then_the_cores():
    from calibration.harness.runner import run_threads

    plain = Candidate(model="m", seq_len=64, ds_config={}, gpus=2)
    asked = Candidate(model="m", seq_len=64, ds_config={}, gpus=2, strategy={"cpu_threads_per_rank": 3})
    assert run_threads(asked, [0, 1, 2, 3], {"OMP_NUM_THREADS": "7"}) == 3
    assert run_threads(plain, [0, 1, 2, 3], {"OMP_NUM_THREADS": "7"}) == 7
    assert run_threads(plain, list(range(16)), {}) == 8  # the run's cores over its ranks, as the launch lines
