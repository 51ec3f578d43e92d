import cProfile
import json
import pstats
import time

import torch

from calibration.harness import step_profile


def _slow_copy(dst, src):
    dst.copy_(src)
    time.sleep(0.02)


def test_builtins_name_their_heaviest_caller():
    prof = cProfile.Profile()
    prof.enable()
    _slow_copy(torch.zeros(4), torch.ones(4))
    prof.disable()
    summary = step_profile.summarize_host(pstats.Stats(prof).stats)
    sleep = next(r for r in summary["builtins"] if "sleep" in r["function"])
    assert sleep["own_s"] >= 0.015
    assert sleep["callers"][0]["function"].endswith("_slow_copy")
    assert summary["builtins"][0]["own_s"] >= summary["builtins"][-1]["own_s"]


def test_every_rank_runs_two_steps_and_the_profiling_rank_writes_them(tmp_path):
    calls = []

    def step():
        calls.append(1)
        torch.randn(64, 64) @ torch.randn(64, 64)

    step_profile.profile_steps(step, lambda: None, False, tmp_path / "p.json", cuda=False)
    assert len(calls) == 2 and not (tmp_path / "p.json").exists()
    step_profile.profile_steps(step, lambda: None, True, tmp_path / "p.json", cuda=False)
    assert len(calls) == 4
    summary = json.loads((tmp_path / "p.json").read_text())
    assert summary["cprofile_step_s"] > 0 and summary["torch_profiler_step_s"] > 0
    assert any(r["op"] == "aten::mm" for r in summary["device_ops"])


def test_the_environment_switch(monkeypatch):
    monkeypatch.setenv(step_profile.ENV, "0")
    assert not step_profile.wanted()
    monkeypatch.setenv(step_profile.ENV, "1")
    assert step_profile.wanted()
