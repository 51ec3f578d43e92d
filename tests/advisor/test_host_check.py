"""`advisor validate` compares the CPU optimizer rate each run probed with the profile's, and names
the commands that measure the host when they differ by more than the thread test's bound."""
import dataclasses

import pytest

from advisor.host_check import HOST_TOLERANCE, check_host
from advisor.validate import compare
from models.architecture import load_architecture
from models.predict import predict_batch
from models.profile import load_profile
from models.strategy import Strategy, StrategyBatch
from models.workload import Workload
from runs.record import Candidate, RunRecord, RunResult

H200 = load_profile("h200")
TWO_RANKS_ONE_THREAD = Strategy(gpus=2, gpus_per_node=2, zero_stage=2, offload_optimizer="cpu", cpu_threads_per_rank=1)


def profile_rate(threads, ranks):
    return float(H200.host.cpu_adam_per_rank(threads, ranks, H200.gpus_per_node.value))


def test_a_host_as_fast_as_the_profile_passes():
    probe = {"cpu_adam_params_per_s": profile_rate(1, 2) * (1 + HOST_TOLERANCE / 2), "threads": 1}
    checked = check_host(probe, TWO_RANKS_ONE_THREAD, H200)
    assert checked.what == "CPU optimizer" and "2 ranks" in checked.conditions and not checked.differs


@pytest.mark.parametrize("factor, word", [(0.55, "slower"), (1.3, "faster")])
def test_a_host_off_the_profile_is_named_with_the_commands_that_measure_it(factor, word):
    probe = {"cpu_adam_params_per_s": profile_rate(1, 2) * factor, "threads": 1}
    checked = check_host(probe, TWO_RANKS_ONE_THREAD, H200)
    assert checked.differs and checked.ratio == pytest.approx(factor)
    assert f"is {word} than predicted" in checked.note and "--fill-from h200" in checked.note and "calibration.merge" in checked.note
    assert "--only host_issue" in checked.note


def test_the_profile_rate_is_the_one_for_the_runs_threads():
    """16 threads step far faster than 1: a probe at 16 threads is held to the 16-thread rate."""
    probe = {"cpu_adam_params_per_s": profile_rate(16, 1), "threads": 16}
    checked = check_host(probe, Strategy(gpus=1, zero_stage=2, offload_optimizer="cpu"), H200)
    assert "16 threads a rank" in checked.conditions and checked.ratio == pytest.approx(1.0)
    assert profile_rate(16, 1) > 3 * profile_rate(1, 1)


def test_no_probe_no_check():
    assert check_host(None, TWO_RANKS_ONE_THREAD, H200) is None
    assert check_host({"cpu_adam_params_per_s": None, "threads": 1}, TWO_RANKS_ONE_THREAD, H200) is None


def test_a_run_that_does_not_offload_is_not_held_to_the_cpu_optimizer():
    """Its step does not use CPUAdam (2026-12-01: such runs' probes said 1.3x and their steps were on time)."""
    probe = {"cpu_adam_params_per_s": profile_rate(16, 1) * 1.3, "threads": 16}
    assert check_host(probe, Strategy(gpus=1, zero_stage=2), H200) is None


def test_every_probed_run_is_held_to_the_profiles_issue_time_and_the_furthest_check_speaks():
    issue_us = H200.host.issue_per_layer.value * 1e6
    probe = {"cpu_adam_params_per_s": profile_rate(16, 1) * 0.9, "threads": 16, "issue_us_per_layer": issue_us * 1.5}
    checked = check_host(probe, Strategy(gpus=1, zero_stage=3), H200)
    assert checked.what == "issue time" and checked.differs and checked.ratio == pytest.approx(1 / 1.5)
    assert "slower than predicted" in checked.note
    offload = check_host(dict(probe, issue_us_per_layer=issue_us), Strategy(gpus=1, zero_stage=2, offload_optimizer="cpu"),
                         H200)
    assert offload.what == "CPU optimizer" and offload.ratio == pytest.approx(0.9)  # further off than the issue time
    unprobed_profile = H200.model_copy(update={"host": H200.host.model_copy(update={"issue_per_layer": None})})
    assert check_host(probe, Strategy(gpus=1, zero_stage=3), unprobed_profile) is None


def test_validate_reports_the_host_beside_the_errors():
    c = Candidate(model="qwen2.5-1.5b", seq_len=8192, ds_config={}, label="x",
                  strategy={"gpus": 2, "gpus_per_node": 2, "zero_stage": 2, "offload_optimizer": "cpu",
                            "cpu_threads_per_rank": 1})
    probe = {"cpu_adam_params_per_s": profile_rate(1, 2) * 0.6, "threads": 1,
             "issue_us_per_layer": H200.host.issue_per_layer.value * 1e6}
    r = RunRecord.now(c, RunResult(status="ok", step_time_s=2.0, host_probe=probe), prediction={"step_time_s": 1.5})
    assert compare(r).host is None  # without the profile there is nothing to hold it to
    host = compare(r, H200).host
    assert host["differs"] and host["ratio"] == pytest.approx(0.6) and "slower than predicted" in host["note"]


def test_validate_predicts_a_run_again_at_the_host_its_probes_measured():
    """A host-bound step on a host twice as slow as the profile's: the prediction made before the run
    misses it, the one at the probed host does not."""
    strategy = Strategy(gpus=1, gpus_per_node=2, zero_stage=3, cpu_threads_per_rank=16)
    slow_us = 2 * H200.host.issue_per_layer.value * 1e6
    workload = Workload(load_architecture("qwen2.5-0.5b"), 512)
    at = predict_batch(workload, StrategyBatch.from_strategies([strategy]), H200.on_host(slow_us * 1e-6))
    before = predict_batch(workload, StrategyBatch.from_strategies([strategy]), H200)
    c = Candidate(model="qwen2.5-0.5b", seq_len=512, ds_config={}, label="x", strategy=dataclasses.asdict(strategy))
    measured = RunResult(status="ok", step_time_s=float(at.step_time_s[0]), gpu_energy_j=float(at.gpu_energy_j[0]),
                         host_probe={"issue_us_per_layer": slow_us, "threads": 16, "issue_probe_linear": "torch"})
    r = RunRecord.now(c, measured, prediction={"step_time_s": float(before.step_time_s[0])})
    compared = compare(r, H200)
    assert compared.error_pct["step_time_s"] < -20  # made at the profile's host: far under
    again = compared.at_probed_host
    assert again["issue_us_per_layer"] == pytest.approx(slow_us)
    assert again["error_pct"]["step_time_s"] == pytest.approx(0, abs=1e-6)
    assert again["error_pct"]["gpu_energy_j"] == pytest.approx(0, abs=1e-6)
    unprobed = RunRecord.now(c, RunResult(status="ok", step_time_s=1.0), prediction={"step_time_s": 1.0})
    assert compare(unprobed, H200).at_probed_host is None and compare(r).at_probed_host is None
    failed = RunRecord.now(c, RunResult(status="oom", host_probe=measured.host_probe), prediction={})
    assert compare(failed, H200).at_probed_host is None


def test_a_loop_names_the_run_whose_host_strayed_furthest():
    from advisor.host_check import worst_host_note

    def record(factor):
        c = Candidate(model="qwen2.5-1.5b", seq_len=8192, ds_config={}, label=f"x{factor}",
                      strategy={"gpus": 2, "gpus_per_node": 2, "zero_stage": 2, "offload_optimizer": "cpu",
                                "cpu_threads_per_rank": 1})
        probe = {"cpu_adam_params_per_s": profile_rate(1, 2) * factor, "threads": 1}
        return RunRecord.now(c, RunResult(status="ok", step_time_s=1.0, host_probe=probe))

    assert worst_host_note([record(1.05), None], H200) == ""
    assert "0.50x" in worst_host_note([record(0.8), record(0.5), record(1.1)], H200)


def test_a_step_the_host_sets_is_named_and_a_gpu_bound_one_is_not():
    from advisor.host_check import host_bound_notes
    from models.architecture import load_architecture
    from models.predict import predict
    from models.workload import Workload

    short = predict(Workload(load_architecture("qwen2.5-1.5b"), 512), Strategy(gpus=1, zero_stage=3), H200)
    (note,) = host_bound_notes(short)
    share_pct = int(note.removeprefix("note: ").split("%")[0])
    assert share_pct >= 85 and "wider one of host-bound steps" in note  # 0.46-0.71 s measured, nearly all host
    assert "--validate K" in note  # where one run each cannot rank them, measuring in rounds can
    long = predict(Workload(load_architecture("llama-2-7b"), 32768), Strategy(gpus=4, gpus_per_node=4, zero_stage=3,
                                                                             sp=4, checkpoint_every=1), H200)
    assert host_bound_notes(long) == []


def test_validate_prints_the_prediction_at_the_probed_host_beside_a_host_that_strayed(capsys):
    from advisor.cmd_validate import WINDOW, _show

    strategy = Strategy(gpus=1, gpus_per_node=2, zero_stage=3, cpu_threads_per_rank=16)
    slow_us = 2 * H200.host.issue_per_layer.value * 1e6
    at = predict_batch(Workload(load_architecture("qwen2.5-0.5b"), 512), StrategyBatch.from_strategies([strategy]),
                       H200.on_host(slow_us * 1e-6))
    c = Candidate(model="qwen2.5-0.5b", seq_len=512, ds_config={}, label="slow run", strategy=dataclasses.asdict(strategy))
    r = RunRecord.now(c, RunResult(status="ok", step_time_s=float(at.step_time_s[0]) * 1.1,
                                   gpu_energy_j=float(at.gpu_energy_j[0]),
                                   host_probe={"issue_us_per_layer": slow_us, "threads": 16,
                                               "issue_probe_linear": "torch"}), prediction={})
    _show([compare(r, H200)], "h200", 0, WINDOW, 0)
    text = " ".join(capsys.readouterr().out.split())
    assert f"slow run: at the host its probes measured ({slow_us:.0f} us a layer) the model predicts" in text
    assert "(-9%) and" in text and "J (+0%)." in text
