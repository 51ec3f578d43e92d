"""Rounds of measurement: which candidates run again, in what order, how their rounds are judged,
what the loop says of the pick's lead, and the rounds on the CPU, resumed without running again."""
from __future__ import annotations

import io
import json
import math

import pytest
from rich.console import Console
from advisor_process import advisor, rerun_runs_nothing

from advisor.loop import Chosen, LoopOutcome, Measured, measured_pick, round_path, to_contend
from advisor.render import rounds_line, show_loop
from advisor.rounds import contenders, lead, repeat_margin, repeat_note, round_adjusted, round_order
from runs.record import Candidate, RunRecord, RunResult, geometric_mean


def run(label: str, time_s: float | None, gpu_j: float | None = None, status: str = "ok") -> RunRecord:
    c = Candidate(model="m", seq_len=1000, ds_config={"label": label}, label=label,
                  strategy={"micro_batch": 1, "gpus": 1, "sp": 1, "grad_accum": 1})
    return RunRecord.now(c, RunResult(status=status, step_time_s=time_s, gpu_energy_j=gpu_j,
                                      cpu_energy_j=10.0 if gpu_j else None))


def rounds_of(label: str, times: list[float], energies: list[float] | None = None) -> Measured:
    energies = energies or [None] * len(times)
    first, *later = [run(label, t, e) for t, e in zip(times, energies)]
    return Measured(Chosen(0, label), first, tuple(later))


def test_a_lead_is_paired_by_round_and_separated_beyond_two_standard_errors():
    steady = lead([1.0, 2.0, 1.5], [1.1, 2.2, 1.65])  # 10% behind in every round, whatever the host did
    assert steady.rounds == 3 and steady.log_ratio == pytest.approx(math.log(1.1)) and steady.separated
    assert steady.stderr == pytest.approx(0.0, abs=1e-12)
    noisy = lead([1.0, 1.0, 1.0], [1.3, 0.8, 1.05])  # ahead in two rounds, behind in one
    assert noisy.separated is False and noisy.stderr > 0.05
    single = lead([1.0, None], [1.2, 1.1])  # the pick's second round failed: one shared round
    assert single.rounds == 1 and single.stderr is None and single.separated is None
    assert lead([None], [1.0]) is None


def test_contenders_are_those_within_the_margin_that_could_keep_the_slowdown_limit():
    score = {0: 100.0, 1: 105.0, 2: 109.0, 3: 120.0, 4: 95.0}
    time = {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0, 4: 2.0}  # 4 uses less but is twice as slow: out of the limit
    def each(margin):
        return dict.fromkeys(score, margin)

    assert contenders(score, time, pick=0, max_slowdown=0.1, margins=each(0.10)) == [0, 1, 2]
    assert contenders(score, time, pick=0, max_slowdown=0.1, margins=each(0.02)) == []  # none close: no round
    # each candidate's own margin against the pick: 3 is 20% behind, within a host-bound pair's scatter
    assert contenders(score, time, 0, 0.1, {**each(0.10), 3: 0.25}) == [0, 1, 2, 3]
    # the pick near the slowdown limit set by the fastest: the fastest runs again too, as it sets the limit
    near = {0: 1.08, 1: 1.0, 2: 1.09, 3: 1.0, 4: 1.0}
    assert contenders({0: 100.0, 1: 130.0, 2: 104.0}, {i: near[i] for i in range(3)}, 0, 0.1, each(0.10)) == [0, 1, 2]


def test_the_default_margin_is_how_far_two_single_runs_of_equal_candidates_come_apart():
    """Two standard deviations of the log difference of one run each, from the measured scatter
    (REPEAT_SD_LOG): host-bound steps repeat worse, so they are measured again from further apart."""
    gpu, host, mixed = (repeat_margin("gpu_bound", "gpu_bound"), repeat_margin("host_bound", "host_bound"),
                        repeat_margin("host_bound", "gpu_bound"))
    assert 0.05 < gpu < mixed < host < 0.50
    assert mixed == repeat_margin("gpu_bound", "host_bound")
    assert "44%" in repeat_note(0.9) and repeat_note(0.05) is None and repeat_note(None) is None  # said of host-bound runs
    # one run each, 20% apart in energy: host-bound steps are measured again, GPU-bound ones are ranked
    first_round = [rounds_of("a", [1.0], [1000.0]), rounds_of("b", [1.0], [1200.0])]
    verdict = measured_pick(first_round, "energy", 0.1)
    assert to_contend(first_round, verdict, 0.1, None, ["host_bound"] * 2) == [0, 1]
    assert to_contend(first_round, verdict, 0.1, None, ["gpu_bound"] * 2) == []


def test_later_rounds_alternate_direction():
    assert [round_order(["a", "b", "c"], n) for n in (2, 3, 4)] == [["c", "b", "a"], ["a", "b", "c"], ["c", "b", "a"]]


def test_the_pick_is_judged_on_its_rounds_not_its_first_run():
    """A wins the first round by luck (its host was fast then); over three rounds B uses less."""
    a = rounds_of("a", [1.0, 1.0, 1.0], [900.0, 1100.0, 1100.0])
    b = rounds_of("b", [1.0, 1.0, 1.0], [950.0, 1000.0, 1000.0])
    first_only = [Measured(a.chosen, a.record), Measured(b.chosen, b.record)]
    assert measured_pick(first_only, "energy", 0.1).measured_pick == 0
    assert to_contend(first_only, measured_pick(first_only, "energy", 0.1), 0.1, 0.10, ["gpu_bound"] * 2) == [0, 1]
    # 5% apart: within two GPU-bound runs' scatter by default; not within a 2% margin the user set
    assert to_contend(first_only, measured_pick(first_only, "energy", 0.1), 0.1, None, ["gpu_bound"] * 2) == [0, 1]
    assert to_contend(first_only, measured_pick(first_only, "energy", 0.1), 0.1, 0.02, ["gpu_bound"] * 2) == []
    v = measured_pick([a, b], "energy", 0.1)
    assert v.measured_pick == 1 and v.regret[0] > 0
    assert v.leads[0].rounds == 3 and v.leads[0].separated is False  # behind in two rounds, ahead in one
    assert b.time_s == pytest.approx(1.0) and b.energy_j == pytest.approx((960 * 1010 * 1010) ** (1 / 3))


def test_a_failed_repeat_leaves_its_round_out():
    m = Measured(Chosen(0, "x"), run("x", 1.0), (run("x", None, status="crash"), run("x", 4.0)))
    assert m.round_time_s() == [1.0, None, 4.0] and m.time_s == pytest.approx(2.0)


def test_a_round_not_run_keeps_the_later_rounds_paired_with_the_picks():
    """The budget ended before b's second run, and a resumed loop ran its third: it is paired with the
    pick's third round, not its second."""
    a = rounds_of("a", [1.0] * 3, [1000.0, 1100.0, 1000.0])
    b = Measured(Chosen(0, "b"), run("b", 1.0, 1090.0), (None, run("b", 1.0, 1090.0)))
    v = measured_pick([a, b], "energy", 0.1)
    assert v.measured_pick == 0 and v.leads[1].rounds == 2
    assert v.leads[1].log_ratio == pytest.approx(math.log(1100 / 1010))  # not against the pick's 1110


def outcome(measured: list[Measured]) -> LoopOutcome:
    plan = [{"label": m.chosen.why, "why": "tied", "step_time_s": 1.0, "energy_j": 1000.0} for m in measured]
    return LoopOutcome([m.chosen for m in measured], plan, measured, measured_pick(measured, "energy", 0.1), None, "")


def test_the_loop_says_whether_the_rounds_told_the_pick_apart():
    # each round's energy counts the host's 10 J too: b is 10% above a in every round
    apart = outcome([rounds_of("a", [1.0] * 3, [1000.0, 1200.0, 900.0]),
                     rounds_of("b", [1.0] * 3, [1101.0, 1321.0, 991.0])])
    assert "led b by 10.0%" in rounds_line(apart) and "beyond the rounds' scatter" in rounds_line(apart)
    tied = outcome([rounds_of("a", [1.0] * 3, [1000.0, 1000.0, 1000.0]),
                    rounds_of("b", [1.0] * 3, [1200.0, 900.0, 1000.0])])
    assert "either will do" in rounds_line(tied)
    assert tied.rounds == 3 and tied.to_dict()["rounds"] == 3
    entry = tied.to_dict()["candidates"][1]
    assert [r["step_time_s"] for r in entry["rounds"]] == [1.0] * 3
    assert entry["behind_pick"]["rounds"] == 3 and entry["behind_pick"]["separated"] is False
    out = Console(file=io.StringIO(), width=220)
    show_loop(out, tied)
    assert "(3 rounds)" in out.file.getvalue() and "either will do" in out.file.getvalue()
    once = outcome([rounds_of("a", [1.0], [1000.0]), rounds_of("b", [1.0], [1100.0])])
    assert once.rounds == 1 and once.to_dict()["candidates"][1]["behind_pick"]["separated"] is None


@pytest.mark.slow
def test_the_rounds_run_interleaved_on_the_cpu_and_resume_without_running_again(tmp_path, cpu_env):
    args = ["recommend", "--model", "tiny-cpu", "--seq", "256", "--global-batch", "4", "--profile", "h200",
            "--search", "exhaustive", "--validate", "2", "--rounds", "2", "--tie-margin", "1000%",
            "--workdir", str(tmp_path / "work"), "--json"]
    done = advisor(*args, cwd=tmp_path, env=cpu_env)
    assert done.returncode == 0, done.stderr[-3000:]
    loop = json.loads(done.stdout)["validation"]
    assert loop["rounds"] == 2 and all(len(c["rounds"]) == 2 for c in loop["candidates"])
    assert "round 2 of 2" in done.stderr
    first = [json.loads(x) for x in (tmp_path / "work" / "runs.jsonl").read_text().splitlines()]
    second = [json.loads(x) for x in round_path(tmp_path / "work" / "runs.jsonl", 2).read_text().splitlines()]
    assert [r["candidate"]["label"] for r in second] == [r["candidate"]["label"] for r in first][::-1]
    assert {r["key"] for r in first} == {r["key"] for r in second}
    for c in loop["candidates"]:  # each candidate's figure is the geometric mean of its two rounds
        times = [r["step_time_s"] for r in c["rounds"]]
        assert c["measured"]["step_time_s"] == pytest.approx(math.sqrt(times[0] * times[1]))
    assert sum(c["behind_pick"] is not None for c in loop["candidates"]) == 1

    assert rerun_runs_nothing(*args, cwd=tmp_path, env=cpu_env)["validation"]["candidates"] == loop["candidates"]


@pytest.mark.slow
def test_a_stored_crash_is_taken_as_measured_unless_the_loop_is_told_to_retry_it(tmp_path, cpu_env):
    """A crash stored before its cause was fixed (the harness's CPU checkpointing, 2026-12-02) stands
    until `--retry crash` runs the candidate again."""
    from advisor.validate import candidate_from_strategy
    from runs.store import RunStore

    args = ["recommend", "--model", "tiny-cpu", "--seq", "256", "--global-batch", "4", "--profile", "h200",
            "--search", "exhaustive", "--validate", "1", "--rounds", "1", "--store", str(tmp_path / "runs.db"),
            "--workdir", str(tmp_path / "work"), "--json"]
    plan = json.loads(advisor(*args, "--plan-only", cwd=tmp_path, env=cpu_env).stdout)["plan"]["candidates"][0]
    crashed = candidate_from_strategy("tiny-cpu", 256, plan["strategy"])
    with RunStore(tmp_path / "runs.db") as store:
        store.add_run(RunRecord.now(crashed, RunResult(status="crash", reason="IndexError: an old harness bug")))
    stored = advisor(*args, cwd=tmp_path, env=cpu_env)
    assert stored.returncode == 0, stored.stderr[-3000:]
    assert json.loads(stored.stdout)["validation"]["candidates"][0]["status"] == "crash"
    assert "[ok]" not in stored.stderr
    retried = advisor(*args, "--retry", "crash", cwd=tmp_path, env=cpu_env)
    assert retried.returncode == 0, retried.stderr[-3000:]
    assert json.loads(retried.stdout)["validation"]["candidates"][0]["status"] == "ok"


def test_the_shipped_loops_with_rounds_read_as_the_readme_says():
    """benchmarks/loop_rounds.py on data/loops: in TinyLlama's loop ZeRO-1 and ZeRO-0 are equal over
    three rounds; in qwen2.5-0.5b's, checkpointing every 2nd layer is behind beyond the scatter."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from loop_rounds import loops

    found = loops()
    tiny = {r["label"]: r for r in found["loop-rounds-tinyllama-1k-1gpu"]}
    assert tiny["z1 sp1 mb8 ga1 1gpu 16thr"]["pick"] and tiny["z0 sp1 mb8 ga1 1gpu 16thr"]["separated"] is False
    small = {r["label"]: r for r in found["loop-rounds-0.5b-1k-1gpu"]}
    assert small["z0 ckpt/2 sp1 mb4 ga1 1gpu 16thr"]["separated"] is True
    assert small["z0 ckpt/2 sp1 mb4 ga1 1gpu 16thr"]["regret"] == pytest.approx(0.144, abs=0.001)
    assert "loop-7b-8k-1gpu" not in found  # measured before rounds


def test_a_round_the_budget_cut_does_not_favour_the_candidate_that_missed_it():
    """Round 3 ran on a host 30% slower, and the budget ended before B's run of it. On the geometric
    means of their own rounds B would win (1.05 against 1.09); with the rounds' drift taken out A
    is 5% ahead, as it was in every round both ran."""
    per_round = {"A": [1.0, 1.0, 1.3], "B": [1.05, 1.05, None], "C": [2.0]}
    adjusted = round_adjusted(per_round)
    assert geometric_mean([1.0, 1.0, 1.3]) > geometric_mean([1.05, 1.05])
    assert adjusted["B"] / adjusted["A"] == pytest.approx(1.05)
    assert adjusted["C"] == pytest.approx(2.0)  # measured once, in round 1: its figure stands


def test_with_every_round_complete_the_adjusted_figures_rank_as_the_geometric_means():
    per_round = {"A": [1.0, 1.1, 1.2], "B": [1.05, 1.2, 1.3], "C": [0.9, 1.3, 1.0]}
    adjusted = round_adjusted(per_round)
    means = {k: geometric_mean(v) for k, v in per_round.items()}
    assert {k: adjusted[k] / adjusted["A"] for k in per_round} == pytest.approx({k: means[k] / means["A"] for k in per_round})
    assert "D" not in round_adjusted({**per_round, "D": [None, None]})  # nothing measured: no figure


def test_the_pick_is_not_won_by_missing_a_slow_round():
    """The loop's own pick, with B's third run cut by the budget (None, kept in place)."""
    a = rounds_of("a", [1.0, 1.0, 1.0], [990.0, 990.0, 1290.0])
    b_first, b_second = run("b", 1.0, 1040.0), run("b", 1.0, 1040.0)
    b = Measured(Chosen(0, "b"), b_first, (b_second, None))
    assert b.energy_j < a.energy_j  # on its own rounds' geometric mean B looks better
    v = measured_pick([a, b], "energy", 0.1)
    assert v.measured_pick == 0 and v.regret[1] == pytest.approx(1050 / 1000 - 1)
