"""The host probe: the job's rates are its slowest rank's, and an unmeasured rank leaves CPUAdam unmeasured."""
from __future__ import annotations

import torch

from calibration.harness.host_probe import combine, issue_us_per_layer


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
