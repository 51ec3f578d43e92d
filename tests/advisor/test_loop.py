"""The closed loop: which candidates it measures, how it picks by measurement, and the whole loop
on the CPU (the built-in model, and a script of one's own through advisor.monitor.StepMeter)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from advisor_process import advisor, rerun_runs_nothing

from advisor.loop import Chosen, LoopSettings, Measured, choose, measured_pick, refit_folder, run_chosen
from advisor.search import exhaustive_search
from models.band import Band
from models.workload import Workload
from runs.record import Candidate, RunRecord, RunResult

REPO = Path(__file__).resolve().parents[2]


def band(time_log: float, energy_log: float) -> Band:
    """A band of +-log on each metric, around any prediction."""
    residuals = {"step_time_s": [-time_log, time_log] * 20, "gpu_energy_j": [-energy_log, energy_log] * 20}
    return Band.from_residuals(residuals, "{}", source="test")


def labels(result, chosen):
    return [result.candidates.strategies[c.index].label() for c in chosen]


def test_the_pick_the_fastest_then_the_tied_then_the_families(tiny_problem):
    """On the hand model (tests/advisor/conftest): within 60% the least energy is C (2.3 s, 1300 J),
    the fastest A (1.5 s, 1500 J). With a 20% band on both, every feasible point is tied with C."""
    result = exhaustive_search(tiny_problem, "energy", 0.60)
    chosen = choose(result, band(0.2, 0.2), "energy", 0.60, k=10)
    assert labels(result, chosen)[:2] == ["z3 off-opt sp1 mb1 ga2 4gpu", "z3 ckpt sp1 mb2 ga1 4gpu"]
    assert [c.why for c in chosen[:2]] == ["the model's pick", "the fastest: its measured time sets the slowdown limit"]
    assert len(chosen) == 5 and len(set(labels(result, chosen))) == 5  # the five feasible points, once each
    assert all(result.candidates.feasible[c.index] for c in chosen)
    tied = [c for c in chosen if c.why.startswith("tied")]
    energies = [result.candidates.run_energy_j[c.index] for c in tied]
    assert energies == sorted(energies)  # the closest to the pick first
    assert len(choose(result, band(0.2, 0.2), "energy", 0.60, k=3)) == 3


def test_without_overlapping_bands_only_the_pick_the_fastest_and_the_families(tiny_problem):
    result = exhaustive_search(tiny_problem, "energy", 0.60)
    chosen = choose(result, band(0.01, 0.01), "energy", 0.60, k=10)
    assert not [c for c in chosen if c.why.startswith("tied")]
    assert {c.why.split(" (")[0] for c in chosen[2:]} <= {"best of its family"}
    # a candidate that cannot keep the slowdown limit, even with the band's help, is not measured
    strict = exhaustive_search(tiny_problem, "energy", 0.10)
    slow = choose(strict, band(0.01, 0.01), "energy", 0.10, k=10)
    times = [strict.candidates.run_time_s[c.index] for c in slow]
    assert max(times) <= min(strict.candidates.run_time_s[strict.candidates.feasible]) * 1.1 * 1.03
    assert len(slow) == 1  # A, the pick and the fastest: B is 13% slower and C 53%


def test_each_candidate_takes_the_band_of_its_own_regime(tiny_problem):
    """GPU-bound steps narrow (+-1%), host-bound ones wide (+-20%): the hand model's steps are all
    GPU-bound and none is tied with the pick, as with a +-1% band; called host-bound, all are, as with +-20%."""
    narrow, wide = [-0.01, 0.01] * 20, [-0.2, 0.2] * 20
    shares = [0.0] * 40 + [0.9] * 40
    regimes = Band.from_residuals({"step_time_s": narrow + wide, "gpu_energy_j": narrow + wide}, "{}", source="test",
                                  host_shares={"step_time_s": shares, "gpu_energy_j": shares})
    result = exhaustive_search(tiny_problem, "energy", 0.60)
    assert labels(result, choose(result, regimes, "energy", 0.60, k=10)) == labels(
        result, choose(result, band(0.01, 0.01), "energy", 0.60, k=10))
    result.candidates.metrics["host_share"][:] = 0.9
    assert labels(result, choose(result, regimes, "energy", 0.60, k=10)) == labels(
        result, choose(result, band(0.2, 0.2), "energy", 0.60, k=10))


def measured(label: str, time_s: float | None, gpu_j: float | None, status: str = "ok", grad_accum: int = 1) -> Measured:
    c = Candidate(model="m", seq_len=1000, ds_config={"label": label}, label=label,
                  strategy={"micro_batch": 1, "gpus": 2, "sp": 1, "grad_accum": grad_accum})
    r = RunResult(status=status, step_time_s=time_s, gpu_energy_j=gpu_j, cpu_energy_j=10.0 if gpu_j else None)
    return Measured(Chosen(0, label), RunRecord.now(c, r))


def test_the_least_measured_energy_within_the_slowdown_of_the_fastest_measured():
    runs = [measured("pick", 1.05, 1000.0), measured("fast", 1.0, 1100.0), measured("frugal", 1.5, 700.0),
            measured("tied", 1.08, 950.0), measured("broken", None, None, status="oom")]
    v = measured_pick(runs, "energy", 0.10)
    assert runs[v.measured_pick].chosen.why == "tied" and v.by == "energy"  # "frugal" is 50% slower: out
    assert v.regret[0] == pytest.approx(1010 / 960 - 1) and 4 not in v.regret
    assert runs[measured_pick(runs, "energy", 0.60).measured_pick].chosen.why == "frugal"
    assert runs[measured_pick(runs, "time", 0.10).measured_pick].chosen.why == "fast"


def test_figures_are_per_token_so_a_bigger_step_is_not_penalised():
    runs = [measured("one", 1.0, 1000.0), measured("two", 1.9, 1800.0, grad_accum=2)]  # twice the tokens a step
    assert runs[measured_pick(runs, "energy", 0.10).measured_pick].chosen.why == "two"


def test_without_gpu_energy_the_pick_is_by_time_and_says_so():
    runs = [measured("a", 1.0, None), measured("b", 0.9, None)]
    v = measured_pick(runs, "energy", 0.10)
    assert v.by == "time" and "not measured" in v.note and runs[v.measured_pick].chosen.why == "b"
    assert measured_pick([measured("x", None, None, status="crash")], "energy", 0.1).measured_pick is None


def test_on_a_strayed_host_the_loop_shows_each_run_predicted_again_at_the_host_it_probed():
    """A host-bound step on a host twice as slow as the profile's: the loop's table and --json carry
    the prediction made at the run's own probed host (near the measurement), beside the host note."""
    import dataclasses
    import io

    from rich.console import Console

    from advisor.host_check import worst_host_note
    from advisor.loop import LoopOutcome
    from advisor.render import show_loop
    from advisor.validate import at_probed_host
    from models.architecture import load_architecture
    from models.predict import predict
    from models.profile import load_profile
    from models.strategy import Strategy
    from models.workload import Workload

    h200 = load_profile("h200")
    strategy = Strategy(gpus=1, gpus_per_node=2, zero_stage=3, cpu_threads_per_rank=16)
    slow_us = 2 * h200.host.issue_per_layer.value * 1e6
    at_slow = predict(Workload(load_architecture("qwen2.5-0.5b"), 512), strategy, h200.on_host(slow_us * 1e-6))
    c = Candidate(model="qwen2.5-0.5b", seq_len=512, ds_config={}, label="slow host",
                  strategy=dataclasses.asdict(strategy))
    r = RunResult(status="ok", step_time_s=at_slow.step_time_s, gpu_energy_j=at_slow.gpu_energy_j,
                  host_probe={"issue_us_per_layer": slow_us, "threads": 16, "issue_probe_linear": "torch"})
    runs = [Measured(Chosen(0, "the model's pick"), RunRecord.now(c, r)), Measured(Chosen(1, "not run"), None)]
    plan = [{"label": "slow host", "why": "the model's pick", "step_time_s": 0.1, "energy_j": 10.0},
            {"label": "never ran", "why": "tied", "step_time_s": 0.1, "energy_j": 10.0}]
    again = tuple(at_probed_host(m.record, h200) if m.record else None for m in runs)
    loop = LoopOutcome([m.chosen for m in runs], plan, runs, measured_pick(runs, "energy", 0.1), None, "",
                       worst_host_note([m.record for m in runs], h200), again)
    entries = loop.to_dict()["candidates"]
    assert entries[0]["at_probed_host"]["error_pct"]["step_time_s"] == pytest.approx(0, abs=1e-6)
    assert entries[1]["at_probed_host"] is None
    out = Console(file=io.StringIO(), width=200)
    show_loop(out, loop)
    text = out.file.getvalue()
    assert "slower than predicted" in text and "slow host: at the host its probes measured" in text
    assert "(+0%)" in text and "never ran: at the host" not in text


def test_the_loop_names_a_measured_candidate_that_ran_at_the_gpus_memory_limit():
    """A candidate whose allocator had to free its cache and retry ran at the GPU's memory limit: the
    loop's table says so under it, for that candidate only, and --json carries the count."""
    import io

    from rich.console import Console

    from advisor.loop import LoopOutcome
    from advisor.render import show_loop

    def run(label, retries):
        c = Candidate(model="m", seq_len=1, ds_config={}, label=label,
                      strategy={"micro_batch": 1, "gpus": 1, "sp": 1, "grad_accum": 1})
        return RunRecord.now(c, RunResult(status="ok", step_time_s=1.0, gpu_energy_j=100.0, gpu_alloc_retries=retries))

    runs = [Measured(Chosen(0, "the model's pick"), run("tight", 4)), Measured(Chosen(1, "tied"), run("roomy", 0))]
    plan = [{"label": "tight", "why": "the model's pick", "step_time_s": 1.0, "energy_j": 100.0},
            {"label": "roomy", "why": "tied", "step_time_s": 1.0, "energy_j": 100.0}]
    loop = LoopOutcome([m.chosen for m in runs], plan, runs, measured_pick(runs, "energy", 0.1), None, "")
    out = Console(file=io.StringIO(), width=400)
    show_loop(out, loop)
    text = out.file.getvalue()
    assert "tight: torch's allocator found no free memory 4 time(s)" in text and "roomy: torch's" not in text
    assert loop.to_dict()["candidates"][0]["result"]["gpu_alloc_retries"] == 4


def test_the_loops_table_sets_the_measured_pool_beside_the_predicted_pool_and_its_band():
    """Predicted pool [band] / measured max_memory_reserved, where torch's allocator ran as by
    default; a run under another allocator setting shows no measured pool."""
    import io

    from rich.console import Console

    from advisor.loop import LoopOutcome
    from advisor.render import show_loop

    def run(label, alloc_conf):
        c = Candidate(model="m", seq_len=1, ds_config={}, label=label,
                      strategy={"micro_batch": 1, "gpus": 1, "sp": 1, "grad_accum": 1})
        machine = {"cuda_alloc_conf": alloc_conf} if alloc_conf else {}
        return RunRecord.now(c, RunResult(status="ok", step_time_s=1.0, gpu_energy_j=100.0, peak_gpu_reserved_gib=47.5,
                                          machine=machine))

    runs = [Measured(Chosen(0, "the model's pick"), run("default", "")),
            Measured(Chosen(1, "tied"), run("expandable", "expandable_segments:True"))]
    plan = [{"label": label, "why": "w", "step_time_s": 1.0, "energy_j": 100.0, "reserved_gpu_mem_gib": 41.0,
             "reserved_gpu_mem_gib_band": [37.0, 49.0]} for label in ("default", "expandable")]
    loop = LoopOutcome([m.chosen for m in runs], plan, runs, measured_pick(runs, "energy", 0.1), None, "")
    out = Console(file=io.StringIO(), width=400)
    show_loop(out, loop)
    rows = [line for line in out.file.getvalue().splitlines() if "default" in line or "expandable" in line]
    assert "41 [37-49] / 47.5" in rows[0] and "41 [37-49] / -" in rows[1]


def test_the_loops_budget_counts_what_ran_before_its_runs(tiny_problem, tmp_path, monkeypatch):
    """A command given 100 s that spent 40 of them searching and building ops has 60 s left for its
    runs, not 100 (a lent machine's call ran past its limit so, 2026-12-04)."""
    import advisor.validate as validate

    monkeypatch.setattr(validate, "prebuild_local", lambda slots: None)
    deadlines = []
    monkeypatch.setattr(validate, "run_validation",
                        lambda *args, deadline_s=None, **kwargs: deadlines.append(deadline_s) or [])
    result = exhaustive_search(tiny_problem, "energy", 0.60)
    workload = Workload(tiny_problem.arch, tiny_problem.seq_len)
    settings = LoopSettings(k=1, workdir=str(tmp_path / "work"), store=str(tmp_path / "runs.db"), jsonl=None,
                            budget_s=100.0, script=None, refit=False, plan_only=False,
                            started_monotonic_s=time.monotonic() - 40.0)
    run_chosen(result, [Chosen(0, "the pick")], "7B", workload, "h200", settings)
    assert len(deadlines) == 1 and 55.0 < deadlines[0] <= 60.0
    unbounded = LoopSettings(k=1, workdir=str(tmp_path / "work"), store=str(tmp_path / "runs.db"), jsonl=None,
                             budget_s=None, script=None, refit=False, plan_only=False)
    run_chosen(result, [Chosen(0, "the pick")], "7B", workload, "h200", unbounded)
    assert deadlines[1] is None


def test_a_candidate_this_host_cannot_hold_shows_why_it_was_not_run(tiny_problem, tmp_path, monkeypatch):
    """The profile's host may be larger than the one validating: a chosen strategy predicted past this
    host's memory is not started, and the loop's table and --json say why, not just "not run"."""
    import io

    from rich.console import Console

    import advisor.validate as validate
    from advisor.loop import LoopOutcome
    from advisor.render import show_loop

    monkeypatch.setattr(validate, "prebuild_local", lambda slots: None)
    why = "predicted host peak 140.6 GiB, this host has 125.0 GiB available: not run"

    def skip_all(candidates, *args, on_skip=None, **kwargs):
        for c in candidates:
            on_skip(c, why)
        return []

    monkeypatch.setattr(validate, "run_validation", skip_all)
    result = exhaustive_search(tiny_problem, "energy", 0.60)
    settings = LoopSettings(k=1, workdir=str(tmp_path / "work"), store=str(tmp_path / "runs.db"), jsonl=None,
                            budget_s=None, script=None, refit=False, plan_only=False)
    measured = run_chosen(result, [Chosen(0, "the model's pick")], "7B", Workload(tiny_problem.arch, tiny_problem.seq_len),
                          "h200", settings)
    assert measured[0].record is None and measured[0].not_run_reason == why
    plan = [{"label": "big", "why": "the model's pick", "step_time_s": 1.0, "energy_j": 100.0}]
    loop = LoopOutcome([measured[0].chosen], plan, measured, measured_pick(measured, "energy", 0.1), None, "")
    entry = loop.to_dict()["candidates"][0]
    assert entry["status"] == "not run" and entry["reason"] == why
    out = Console(file=io.StringIO(), width=300)
    show_loop(out, loop)
    assert "not run: predicted host peak 140.6 GiB" in out.file.getvalue()


@pytest.mark.slow
def test_the_loop_measures_picks_and_refits_on_the_cpu(tmp_path, cpu_env):
    base = tmp_path / "mine.json"  # a profile no run was fitted to: the refit sees only this loop's runs
    from models.fit import prefit_profile
    from models.profile import load_profile

    base.write_text(prefit_profile(load_profile("h200")).to_json())
    args = ["recommend", "--model", "tiny-cpu", "--seq", "256", "--global-batch", "4", "--profile", str(base),
            "--search", "exhaustive", "--validate", "2", "--workdir", str(tmp_path / "work"),
            "--out-ds-config", str(tmp_path / "pick.json"), "--json"]
    done = advisor(*args, "--refit", cwd=tmp_path, env=cpu_env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    loop = out["validation"]
    assert [c["status"] for c in loop["candidates"]] == ["ok", "ok"]
    assert all(c["measured"]["step_time_s"] > 0 and c["measured"]["gpu_energy_j"] is None for c in loop["candidates"])
    assert loop["picked_by"] == "time" and loop["measured_pick"] == out["recommended"]["label"]
    assert all("at_probed_host" in c for c in loop["candidates"])
    assert json.loads((tmp_path / "pick.json").read_text()) == out["ds_config"]
    assert out["ds_config"]["train_micro_batch_size_per_gpu"] == out["recommended"]["strategy"]["micro_batch"]
    assert Path(loop["refit_profile"]).exists() and Path(loop["refit_profile"]).parent == tmp_path
    assert base.read_text() == prefit_profile(load_profile("h200")).to_json()  # never written over
    # the plan is what each run was predicted with, before it ran
    stored = [json.loads(x) for x in (tmp_path / "work" / "runs.jsonl").read_text().splitlines()]
    assert sorted(r["prediction"]["step_time_s"] for r in stored) == sorted(
        c["step_time_s"] for c in loop["candidates"])

    assert rerun_runs_nothing(*args, cwd=tmp_path, env=cpu_env)["validation"]["measured_pick"] == loop["measured_pick"]


@pytest.mark.slow
def test_the_loop_measures_a_script_of_ones_own_through_the_step_meter(tmp_path, cpu_env):
    # --steps: more than fill the window's 20 s on this CPU (the meter ends the script once measured)
    script = (f"{sys.executable} {REPO / 'examples/train.py'} --model {{model}} --seq {{seq}} --deepspeed_config {{ds_config}}"
              " --steps 100000")
    done = advisor("recommend", "--model", "tiny-cpu", "--seq", "256", "--global-batch", "4", "--profile", "h200",
                   "--search", "exhaustive", "--validate", "1", "--workdir", str(tmp_path / "work"), "--script",
                   script, "--json", cwd=tmp_path, env=cpu_env)
    assert done.returncode == 0, done.stderr[-3000:]
    (candidate,) = json.loads(done.stdout)["validation"]["candidates"]
    assert candidate["status"] == "ok", candidate["reason"]
    result = candidate["result"]
    assert result["measured_steps"] >= 3 and result["warmup_steps"] == 2 and result["gpu_meter"].startswith("absent")
    assert result["world_size"] == candidate["strategy"]["gpus"]
    assert result["cpu_threads_per_rank"] >= 1


def test_a_step_meter_outside_the_advisor_measures_nothing_and_imports_nothing(monkeypatch):
    monkeypatch.delenv("ADVISOR_RESULT", raising=False)
    code = ("import sys; from advisor.monitor import StepMeter; m = StepMeter.from_env(); "
            "assert not m.active and m.step() is False; assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_a_refit_goes_beside_its_profile_but_never_into_the_shipped_folder(tmp_path, monkeypatch):
    from models.profile import PROFILES_DIR, profile_path

    monkeypatch.chdir(tmp_path)
    assert refit_folder(profile_path("h200")) == tmp_path
    shipped_by_path = Path(os.path.relpath(PROFILES_DIR / "h200.json", tmp_path))  # ../../models/profiles/h200.json
    assert refit_folder(shipped_by_path) == tmp_path
    mine = tmp_path / "mine" / "p.json"
    mine.parent.mkdir()
    assert refit_folder(mine) == mine.parent
