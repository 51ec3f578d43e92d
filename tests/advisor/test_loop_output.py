"""What the loop and `validate` tell a user: where runs go, what a resumed round does, stored runs,
estimates and failures named as such, energies in units that show them, the table before the
config it picked, and a script whose ranks never met."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

import advisor.validate as validate
from advisor.cli import main
from advisor.loop import Chosen, LoopSettings, round_path, run_chosen
from advisor.recommend import pick_outputs
from advisor.render import energy_text
from advisor.search import exhaustive_search
from models.architecture import load_architecture
from models.profile import load_profile
from models.strategy import Strategy
from models.workload import Workload
from runs.jsonl import append_record
from runs.record import RunRecord, RunResult
from runs.store import RunStore

REPO = Path(__file__).resolve().parents[2]
TINY_LOOP = ["--model", "tiny-cpu", "--seq", "256", "--global-batch", "4", "--profile", "h200", "--gpus", "1",
             "--search", "exhaustive"]


def invoke(*args):
    result = CliRunner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 0, result.output
    return result


def settings(tmp_path, **kwargs) -> LoopSettings:
    return LoopSettings(**{"k": 2, "workdir": str(tmp_path / "work"), "store": str(tmp_path / "runs.db"),
                           "jsonl": None, "budget_s": None, "script": None, "refit": False, "plan_only": False,
                           **kwargs})


@pytest.fixture
def no_runs(monkeypatch):
    """run_validation replaced: each call's candidates and folders, nothing run."""
    calls = []
    monkeypatch.setattr(validate, "prebuild_local", lambda slots: None)
    monkeypatch.setattr(validate, "run_validation", lambda candidates, store, jsonl, workdir, *args, **kwargs:
                        calls.append(SimpleNamespace(candidates=candidates, jsonl=jsonl, workdir=workdir)) or [])
    return calls


def test_a_resumed_round_says_it_measures_nothing(tiny_problem, tmp_path, no_runs, capsys):
    result = exhaustive_search(tiny_problem, "energy", 0.60)
    chosen = [Chosen(0, "the model's pick"), Chosen(1, "tied")]
    workload = Workload(tiny_problem.arch, tiny_problem.seq_len)
    loop = settings(tmp_path, rounds=2)
    run_chosen(result, chosen, "7B", workload, "h200", loop, contend=lambda measured: [0, 1])
    assert "round 2 of 2: measuring again the 2 candidates" in capsys.readouterr().err
    for c in no_runs[-1].candidates:  # round 2 stored, as an interrupted loop left it
        append_record(round_path(tmp_path / "work" / "runs.jsonl", 2), RunRecord.now(c, RunResult("ok", step_time_s=1.0)))
    run_chosen(result, chosen, "7B", workload, "h200", loop, contend=lambda measured: [0, 1])
    err = capsys.readouterr().err
    assert "measuring again" not in err and "round 2 of 2: its 2 runs are stored" in err


def test_runs_go_beside_the_store_not_into_the_current_folder(tiny_problem, tmp_path, no_runs, monkeypatch, capsys):
    """A loop started in a repository's root left validate-runs/ there; now it is the store's folder's."""
    here = tmp_path / "repo"
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    result = exhaustive_search(tiny_problem, "energy", 0.60)
    run_chosen(result, [Chosen(0, "the model's pick")], "7B", Workload(tiny_problem.arch, tiny_problem.seq_len),
               "h200", settings(tmp_path, workdir=None, store=None))
    runs = tmp_path / "cache" / "energy-advisor" / "validate-runs"
    assert no_runs[0].workdir == runs and no_runs[0].jsonl == runs / "runs.jsonl"
    assert list(here.iterdir()) == [] and f"in {runs}" in capsys.readouterr().err


def test_the_launch_line_names_the_script_the_loop_ran():
    req = SimpleNamespace(out_ds_config=None, target="deepspeed", model="tiny-cpu", profile=load_profile("h200"),
                          workload=Workload(load_architecture("tiny-cpu"), 256), loop=SimpleNamespace(
                              script="python examples/train.py --model {model} --seq {seq} --deepspeed_config {ds_config}"))
    _, training, line = pick_outputs(req, Strategy(gpus=2, gpus_per_node=2))
    assert training is None
    assert line.deepspeed.endswith("deepspeed --num_gpus 2 examples/train.py --model tiny-cpu --seq 256 "
                                   "--deepspeed_config ds_config.json")
    assert "torchrun --standalone --nproc_per_node 2 examples/train.py" in line.torchrun


def test_energy_shows_in_the_unit_that_shows_it():
    assert [energy_text(j) for j in (4.987, 999.4, 12_345.0, 2.5e6)] == ["4.99 J", "999 J", "12.3 kJ", "2.5 MJ"]
    pick = json.loads(invoke("recommend", *TINY_LOOP, "--json").stdout)["recommended"]
    assert pick["energy_j"] < 1000  # tiny-cpu: a few joules a step, which a kJ column showed as 0.0
    assert energy_text(pick["energy_j"]) in invoke("recommend", *TINY_LOOP).output


@pytest.fixture
def stored(tmp_path):
    """The tiny loop's one candidate with a run already stored (`stored(result)`): a rerun runs nothing.
    Returns the loop's arguments and the candidate's sweep line."""
    from advisor.validate import candidate_from_strategy

    args = ["recommend", *TINY_LOOP, "--validate", "1", "--rounds", "1", "--store", str(tmp_path / "runs.db"),
            "--workdir", str(tmp_path / "work")]
    strategy = json.loads(invoke(*args, "--plan-only", "--json").stdout)["plan"]["candidates"][0]["strategy"]
    candidate = candidate_from_strategy("tiny-cpu", 256, strategy)
    sweep = tmp_path / "sweep.jsonl"
    sweep.write_text(json.dumps({"model": "tiny-cpu", "seq": 256, "strategy": strategy}) + "\n")

    def store(result: RunResult, prediction: dict | None = None):
        with RunStore(tmp_path / "runs.db") as runs:
            runs.add_run(RunRecord.now(candidate, result, prediction, "h200"))
        return args, sweep

    return store


def test_validate_run_again_shows_the_stored_run_and_marks_an_estimate(stored, tmp_path):
    _, sweep = stored(RunResult("ok", step_time_s=0.02, cpu_energy_j=0.46, cpu_energy_estimated=True),
                      {"step_time_s": 0.0164, "cpu_energy_j": 0.876})
    again = ["validate", "--sweep", str(sweep), "--profile", "h200", "--store", str(tmp_path / "runs.db"),
             "--workdir", str(tmp_path / "work")]
    out = invoke(*again).output
    assert "ok (stored)" in out and "0.0164 / 0.02 (-18%)" in out and "candidate(s) not run" not in out
    assert "0.876 / 0.46 est." in out and "est.: the host CPU's energy is estimated" in out
    runs = json.loads(invoke(*again, "--json").stdout)
    assert runs["not_run"] == 0 and [r["stored"] for r in runs["runs"]] == [True]


def test_a_stored_crash_shows_its_whole_reason_and_how_to_run_it_again(stored, tmp_path):
    reason = ("the script ended (exit code 0) before its measured window was complete: let it run more steps "
              "(the window lasts at least --min-window-s and two host spells) END-OF-REASON")
    args, sweep = stored(RunResult("crash", reason=reason))
    out = invoke(*args).output
    assert f"crash: {reason}" in out and "crash: see below" in out and "--retry crash" in out
    assert out.index("Validation:") < out.index("ds_config.json") < out.index("Launch")
    out = invoke("validate", "--sweep", str(sweep), "--profile", "h200", "--store", str(tmp_path / "runs.db"),
                 "--workdir", str(tmp_path / "work")).output
    assert f"crash: {reason}" in out and "--retry crash" in out


def test_the_table_comes_before_the_config_it_picked(stored):
    args, _ = stored(RunResult("ok", step_time_s=0.02))
    out = invoke(*args).output
    assert "Recommended by measurement" in out
    assert out.index("Pareto front") < out.index("Validation:") < out.index("Picked by measurement") \
        < out.index("ds_config.json") < out.index("Launch")


def meter_run(tmp_path, world_size: str) -> tuple[RunResult, str]:
    """A script that meters its steps and never initialises torch.distributed, as its launcher's
    rank 0 of `world_size`: what it records, and its stderr."""
    result = tmp_path / f"result-{world_size}.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "ADVISOR_RESULT": str(result), "WORLD_SIZE": world_size,
           "RANK": "0", "ADVISOR_WARMUP": "0", "ADVISOR_STEPS": "2", "ADVISOR_MIN_WINDOW_S": "0",
           "ADVISOR_PRECISION": "0", "ADVISOR_PROBE_EVERY_S": "0"}
    code = "from advisor.monitor import StepMeter\nmeter = StepMeter.from_env()\nwhile not meter.step():\n    pass\n"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return RunResult.read(result), done.stderr


def test_ranks_that_never_met_are_recorded_as_not_the_candidates_run(tmp_path):
    alone, err = meter_run(tmp_path, "2")
    assert alone.status == "crash" and alone.world_size == 1 and alone.measured_steps == 2
    assert "never initialised torch.distributed" in alone.reason and "--retry crash" in alone.reason
    assert "warning: the launcher started 2 processes" in err
    assert meter_run(tmp_path, "1")[0].status == "ok"
