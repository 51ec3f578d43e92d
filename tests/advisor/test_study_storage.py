"""Studies in a database: resumed by one worker, shared by several, no trial counted twice."""
import optuna
import pytest
from optuna.distributions import CategoricalDistribution

from advisor.study_storage import MirroredStudy, StorageError

DISTS = {"x": CategoricalDistribution([1, 2, 3, 4])}


def run_trials(mirror, n, value):
    for _ in range(n):
        trial = mirror.local.ask(DISTS)
        trial.set_constraint("c", -1.0)
        mirror.tell(trial, [value + trial.params["x"], value])
    mirror.sync()


def test_two_workers_share_one_study_without_echoes(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    a = MirroredStudy("shared", url, optuna.samplers.RandomSampler(seed=0), ["minimize", "minimize"])
    b = MirroredStudy("shared", url, optuna.samplers.RandomSampler(seed=1), ["minimize", "minimize"])
    run_trials(a, 5, 10.0)
    assert b.sync() == 5  # b sees a's trials
    run_trials(b, 3, 20.0)
    assert a.sync() == 3 and a.sync() == 0  # a sees b's, once
    for worker in (a, b):
        trials = worker.local.get_trials(deepcopy=False)
        assert len(trials) == 8
        assert sorted(t.values[1] for t in trials) == [10.0] * 5 + [20.0] * 3
        assert all(t.constraints == {"c": -1.0} for t in trials)
    stored = optuna.load_study(study_name="shared", storage=url).trials
    assert len(stored) == 8


def test_a_new_worker_resumes_from_the_database(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    run_trials(MirroredStudy("resume", url, None, ["minimize", "minimize"]), 4, 1.0)
    later = MirroredStudy("resume", url, None, ["minimize", "minimize"])
    assert len(later.local.trials) == 4
    run_trials(later, 2, 2.0)
    assert len(optuna.load_study(study_name="resume", storage=url).trials) == 6


def test_bad_urls_are_user_errors(tmp_path):
    with pytest.raises(StorageError, match="cannot open"):
        MirroredStudy("x", "nosuchdb://whatever", None, ["minimize"])
    with pytest.raises(StorageError, match="--storage"):
        MirroredStudy("x", f"sqlite:///{tmp_path}/missing-dir/s.db", None, ["minimize"])
