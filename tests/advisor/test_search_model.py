"""Optuna against the exhaustive sweep on the shipped cost model and gh200 profile."""
import pytest

from advisor.search import DEFAULT_TRIALS
from advisor.inputs import default_global_batch
from advisor.recommend import make_problem
from advisor.search import exhaustive_search, optuna_search
from models.architecture import load_architecture
from models.profile import load_profile
from models.workload import Workload


@pytest.fixture(scope="module")
def problem_7b_32k():
    workload = Workload(load_architecture("7B"), 32768)
    return make_problem(workload, load_profile("gh200"), [4], default_global_batch(32768), 10**9)


def test_exhaustive_front_is_feasible_and_non_dominated(problem_7b_32k):
    result = exhaustive_search(problem_7b_32k, "energy", 0.10)
    c = result.candidates
    assert len(c) == len(problem_7b_32k.space.enumerate(problem_7b_32k.arch))
    assert c.feasible.any() and not c.feasible.all()  # memory rules something out at 32k
    for i in result.pareto:
        assert c.feasible[i] and c.metrics["peak_gpu_mem_gib"][i] <= 96.0
        dominated = c.feasible & (c.run_time_s <= c.run_time_s[i]) & (c.run_energy_j <= c.run_energy_j[i]) & (
            (c.run_time_s < c.run_time_s[i]) | (c.run_energy_j < c.run_energy_j[i]))
        assert not dominated.any()
    ok = c.feasible & (c.run_time_s <= c.run_time_s[result.pareto[0]] * 1.10)
    assert c.run_energy_j[result.pick] == c.run_energy_j[ok].min()


@pytest.mark.parametrize("seed", [0, 1])
def test_optuna_pick_is_within_one_percent_of_the_exhaustive_optimum(problem_7b_32k, seed):
    exact = exhaustive_search(problem_7b_32k, "energy", 0.10)
    found = optuna_search(problem_7b_32k, DEFAULT_TRIALS, "energy", 0.10, seed=seed)
    best_j = exact.candidates.run_energy_j[exact.pick]
    got_j = found.candidates.run_energy_j[found.pick]
    assert abs(got_j / best_j - 1) <= 0.01
    assert found.candidates.feasible[found.pick]
