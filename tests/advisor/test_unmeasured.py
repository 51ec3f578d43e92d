"""A pick that rests on a term no run on this machine measured says so, and the loop measures it first."""
from __future__ import annotations

import json

from click.testing import CliRunner

from advisor.cli import main
from advisor.loop import choose
from advisor.search import exhaustive_search
from models.term_basis import Reliance


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_predict_names_the_carried_terms_a_superoffload_step_rests_on():
    """An H100 calibration without DeepSpeed steps ran no ZeRO-3: its hook and layer overheads are h200's,
    carried. The shipped h100's calibration ran ZeRO-3 and SuperOffload steps and fitted them; h200 its own."""
    from pathlib import Path

    flags = ("--model", "7B", "--seq", "8k", "--zero", "3", "--offload-optimizer", "cpu", "--super-offload",
             "--checkpointing", "full", "--json")
    without_steps = Path(__file__).resolve().parents[2] / "data/calibration/h100/h100-calibrated-2026-12-06.json"
    carried = run("predict", "--profile", str(without_steps), *flags)
    assert carried.exit_code == 0, carried.output
    rests = json.loads(carried.stdout)["rests_on_unmeasured"]
    assert "overheads.zero3_module_pass" in [r["term"] for r in rests]
    assert all(r["basis"] == "carried" for r in rests) and "rests on terms profile 'h100' did not measure" in carried.stderr
    for fitted in ("h100", "h200"):
        out = run("predict", "--profile", fitted, *flags)
        assert out.exit_code == 0, out.output
        assert json.loads(out.stdout)["rests_on_unmeasured"] == []


def test_recommend_json_carries_each_shown_strategy_s_unmeasured_terms():
    result = run("recommend", "--model", "7B", "--seq", "32k", "--json")  # the derived gh200: all carried
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["recommended"]["rests_on_unmeasured"]
    assert all(r["basis"] in ("carried", "placeholder") for r in out["recommended"]["rests_on_unmeasured"])
    assert any("rests on terms profile 'gh200' did not measure" in n for n in out["notes"])


def test_the_loop_measures_a_candidate_for_each_untested_term_right_after_the_pick_and_the_fastest(tiny_problem):
    result = exhaustive_search(tiny_problem, "energy", 0.60)
    c = result.candidates
    fastest = min((i for i in range(len(c.strategies)) if c.feasible[i]), key=lambda i: c.run_time_s[i])
    within = [i for i in range(len(c.strategies)) if c.feasible[i] and i not in (result.pick, fastest)
              and c.run_time_s[i] <= 1.6 * c.run_time_s[fastest]]
    slowest = max(within, key=lambda i: c.run_energy_j[i])  # the least likely to be chosen otherwise
    term = Reliance("overheads.super_offload_step_per_gparam", "carried", "carried from profile 'h200'", 0.1)
    chosen = choose(result, None, "energy", 0.60, k=10, unmeasured={slowest: [term]})
    whys = [ch.why for ch in chosen]
    assert chosen[whys.index("rests on unmeasured terms: super_offload_step_per_gparam")].index == slowest
    assert whys.index("rests on unmeasured terms: super_offload_step_per_gparam") <= 2
    # a term the pick's own run tests needs no other candidate
    again = choose(result, None, "energy", 0.60, k=10, unmeasured={result.pick: [term], slowest: [term]})
    assert not any(ch.why.startswith("rests on") for ch in again)
