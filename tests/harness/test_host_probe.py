"""The host probe: the job's rates are its slowest rank's, and an unmeasured rank leaves CPUAdam unmeasured."""
from __future__ import annotations

import math

import pytest
import torch

from calibration.harness.host_probe import combine, reprobe_issue
from calibration.microbench.cpu import issue_us_per_layer
from runs.record import probed_issue_us, probes_read_window


def test_the_job_takes_its_slowest_rank():
    ranks = [{"issue_us_per_layer": 30.0, "cpu_adam_params_per_s": 4e9, "threads": 16},
             {"issue_us_per_layer": 45.0, "cpu_adam_params_per_s": 3e9, "threads": 16}]
    job = combine(ranks)
    assert job["issue_us_per_layer"] == 45.0 and job["cpu_adam_params_per_s"] == 3e9
    assert job["per_rank"] == ranks


def test_one_rank_without_a_cpu_adam_rate_leaves_it_unmeasured():
    ranks = [{"issue_us_per_layer": 30.0, "cpu_adam_params_per_s": 4e9, "threads": 1},
             {"issue_us_per_layer": 31.0, "cpu_adam_params_per_s": None, "threads": 1}]
    assert combine(ranks)["cpu_adam_params_per_s"] is None


def test_the_issue_time_is_measured_on_the_cpu_path_too():
    """Without a GPU the layers' compute is in the time; it is still a per-layer microsecond figure."""
    assert 0 < issue_us_per_layer(torch.device("cpu"), lambda: None) < 1e4


def test_a_probe_that_fails_is_recorded_and_the_run_goes_on(monkeypatch):
    import calibration.harness.host_probe as host_probe
    import calibration.microbench.cpu as cpu

    def broken(device, sync, rounds):
        raise RuntimeError("no launch")

    monkeypatch.setattr(cpu, "issue_us_per_layer", broken)
    probe = host_probe.probe(torch.device("cpu"), lambda: None, offloads_optimizer=True)
    assert probe.issue_us_per_layer is None and "RuntimeError: no launch" in probe.failed
    assert probe.cpu_adam_params_per_s is None  # no GPU: not probed, not failed
    assert combine([probe.to_dict(), {**probe.to_dict(), "issue_us_per_layer": 30.0}])["issue_us_per_layer"] is None


def test_the_issue_time_after_the_window_is_the_slowest_ranks_and_unknown_if_any_rank_lacks_it():
    ranks = [{"issue_us_per_layer": 30.0, "cpu_adam_params_per_s": None, "threads": 16}] * 2
    assert combine(ranks, [50.0, 40.0])["issue_us_per_layer_after"] == 50.0
    assert combine(ranks, [50.0, None])["issue_us_per_layer_after"] is None
    assert combine(ranks)["issue_us_per_layer_after"] is None  # records from before the second probe


def test_a_run_is_taken_at_the_geometric_mean_of_its_probes_before_and_after_the_window():
    assert probed_issue_us({"issue_us_per_layer": 100.0, "issue_us_per_layer_after": 400.0}, 2) == 200.0
    assert probed_issue_us({"issue_us_per_layer": 100.0, "issue_us_per_layer_after": None}, 2) == 100.0
    assert probed_issue_us({"issue_us_per_layer": 100.0}, 2) == 100.0  # a record from before the second probe
    assert probed_issue_us({"issue_us_per_layer": None, "issue_us_per_layer_after": 90.0}, 2) is None
    assert probed_issue_us(None, 2) is None


def test_a_zero3_after_probe_counts_only_where_it_timed_torchs_own_linear():
    legacy = {"issue_us_per_layer": 100.0, "issue_us_per_layer_after": 400.0}
    assert probed_issue_us(legacy, 3) == 100.0  # timed deepspeed.zero.Init's wrapper: not the host
    assert probed_issue_us({**legacy, "issue_probe_linear": "torch"}, 3) == 200.0
    ranks = [{"issue_us_per_layer": 30.0, "cpu_adam_params_per_s": None, "threads": 16}]
    assert probed_issue_us(combine(ranks, [120.0]), 3) == 60.0  # the harness marks its probes


def test_the_probe_right_before_the_window_stands_for_the_one_before_the_model():
    ranks = [{"issue_us_per_layer": 300.0, "cpu_adam_params_per_s": None, "threads": 16}] * 2
    probe = combine(ranks, [150.0, 100.0], [40.0, 60.0])
    assert probe["issue_us_per_layer_window_start"] == 60.0  # the slowest rank
    assert probed_issue_us(probe, 2) == pytest.approx(math.sqrt(60.0 * 150.0))
    assert combine(ranks, [150.0, 100.0], [40.0, None])["issue_us_per_layer_window_start"] is None
    assert probed_issue_us(combine(ranks, [150.0, 100.0], [40.0, None]), 2) == pytest.approx(math.sqrt(300.0 * 150.0))


def test_probes_bracket_the_window_only_where_both_sides_count():
    both = {"issue_us_per_layer": 100.0, "issue_us_per_layer_after": 120.0}
    assert probes_read_window(both, 2)
    assert not probes_read_window({**both, "issue_us_per_layer_after": None}, 2)
    assert not probes_read_window({**both, "issue_us_per_layer": None}, 2)  # an after-probe alone is no measure
    assert not probes_read_window(both, 3)  # ZeRO-3's unmarked after-probe timed the wrapper
    assert probes_read_window({**both, "issue_probe_linear": "torch"}, 3)
    assert not probes_read_window(None, 0)
    assert probes_read_window({"issue_us_per_layer": 100.0, "issue_us_per_layer_in_window": [90.0, 95.0]}, 3)
    assert not probes_read_window({"issue_us_per_layer": 100.0, "issue_us_per_layer_in_window": [90.0]}, 2)


def test_a_run_probed_within_its_window_is_taken_at_those_probes_else_at_the_probes_around_it():
    around = {"issue_us_per_layer": 100.0, "issue_us_per_layer_after": 400.0}
    assert probed_issue_us({**around, "issue_us_per_layer_in_window": [150.0, None, 130.0, 170.0]}, 2) == 150.0
    assert probed_issue_us({**around, "issue_us_per_layer_in_window": [150.0]}, 2) == 200.0  # one reading: around
    assert probed_issue_us({"issue_us_per_layer": None, "issue_us_per_layer_in_window": [90.0, 110.0]}, 2) == 100.0


def test_the_probe_times_torchs_linear_and_leaves_a_replacement_in_place(monkeypatch):
    """deepspeed.zero.Init leaves its own linear in torch.nn.functional for good; the probe must not
    time it, and must not take it away from the run either."""
    import calibration.microbench.cpu as cpu

    seen = []

    def wrapper(x, weight, bias=None):
        seen.append(1)
        return torch._C._nn.linear(x, weight, bias)

    monkeypatch.setattr(torch.nn.functional, "linear", wrapper)
    assert cpu.issue_us_per_layer(torch.device("cpu"), lambda: None) > 0
    assert not seen
    assert torch.nn.functional.linear is wrapper


def test_a_second_probe_that_fails_leaves_the_first(monkeypatch):
    import calibration.microbench.cpu as cpu

    assert reprobe_issue(torch.device("cpu"), lambda: None) > 0

    def broken(device, sync):
        raise RuntimeError("no launch")

    monkeypatch.setattr(cpu, "issue_us_per_layer", broken)
    assert reprobe_issue(torch.device("cpu"), lambda: None) is None
