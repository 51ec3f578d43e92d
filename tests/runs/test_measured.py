"""Run records become the fit's MeasuredRuns: failed runs counted, not used; repeats of a candidate averaged into one."""
from __future__ import annotations

import dataclasses

import pytest
from synthetic import synthetic_records, write_jsonl

from models.measured_run import MeasuredRun
from runs.jsonl import RunFileError
from runs import measured
from runs.measured import gather_records, to_run_set
from runs.record import RunRecord, RunResult
from runs.store import RunStore


@pytest.fixture(scope="module")
def records(small_specs):
    return synthetic_records(small_specs[:6], failed=("oom", "crash", "timeout", "oom"))


def test_store_records_become_runs_and_failures_are_counted(records, tmp_path):
    first = records[0]
    again = RunRecord(first.key, "2026-11-30T09:00:00+00:00", first.candidate,
                      dataclasses.replace(first.result, step_time_s=first.result.step_time_s * 1.5))
    no_time = RunRecord("nosteptime", "2026-11-29T12:00:00+00:00", records[1].candidate,
                        RunResult(status="ok", gpu_meter="absent"))
    with RunStore(tmp_path / "runs.db") as store:
        store.add_runs(records + [again, no_time])
    run_set = to_run_set(gather_records(store=tmp_path / "runs.db"))
    assert len(run_set.runs) == 6
    assert run_set.failed == {"oom": 2, "crash": 1, "timeout": 1}
    assert run_set.repeats == 1
    assert len(run_set.skipped) == 1 and "no measured step time" in run_set.skipped[0]
    by_id = {r.run_id: r for r in run_set.runs}
    # measured twice (two hosts): one run, at the geometric mean of the two
    assert by_id[first.key].step_time_s == pytest.approx(first.result.step_time_s * 1.5 ** 0.5)
    assert by_id[first.key].gpu_energy_j == pytest.approx(first.result.gpu_energy_j)
    run = by_id[records[2].key]
    assert isinstance(run, MeasuredRun)
    assert run.gpu_energy_j == records[2].result.gpu_energy_j
    assert run.peak_gpu_reserved_gib == records[2].result.peak_gpu_reserved_gib
    assert dataclasses.replace(run.strategy, cpu_threads_per_rank=0).label() == records[2].candidate.label
    assert run.strategy.cpu_threads_per_rank == 16  # the record does not say: the runner's rule before 2026-11-30
    assert "2 oom" in run_set.summary() and "1 timeout" in run_set.summary()


def test_jsonl_and_store_read_the_same(records, tmp_path):
    write_jsonl(records, tmp_path / "runs.jsonl")
    with RunStore(tmp_path / "runs.db") as store:
        store.import_jsonl(tmp_path / "runs.jsonl")
    a = to_run_set(gather_records([tmp_path / "runs.jsonl"]))
    b = to_run_set(gather_records(store=tmp_path / "runs.db"))
    assert sorted(r.run_id for r in a.runs) == sorted(r.run_id for r in b.runs)
    assert a.failed == b.failed


def test_unreadable_run_file_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"key": "x"}\n')
    with pytest.raises(RunFileError, match="bad.jsonl:1"):
        gather_records([path])
    with pytest.raises(RunFileError, match="not found"):
        gather_records([tmp_path / "missing.jsonl"])


def _probed(record, issue_us: float | None, minutes: int, after_us: float | None = None):
    probe = None if issue_us is None else {"issue_us_per_layer": issue_us, "issue_us_per_layer_after": after_us,
                                           "cpu_adam_params_per_s": None, "threads": 16}
    return RunRecord(record.key, f"2026-12-01T10:{minutes:02d}:00+00:00", record.candidate,
                     dataclasses.replace(record.result, host_probe=probe))


def test_a_runs_host_probe_reaches_the_model_in_seconds_and_repeats_average_it(records):
    first, second = records[0], records[1]
    runs = {r.run_id: r for r in to_run_set([_probed(first, 150.0, 0), _probed(second, None, 1)]).runs}
    assert runs[first.key].host_issue_per_layer_s == pytest.approx(150e-6)
    assert runs[second.key].host_issue_per_layer_s is None
    both = to_run_set([_probed(first, 100.0, 0), _probed(first, 400.0, 1)]).runs[0]
    assert both.host_issue_per_layer_s == pytest.approx(200e-6)  # geometric mean, as the step times
    # a repeat on a host that was not probed: the mean step's host is unknown
    assert to_run_set([_probed(first, 100.0, 0), _probed(first, None, 1)]).runs[0].host_issue_per_layer_s is None


def test_reserved_memory_under_another_allocator_setting_is_not_the_models(records):
    """The model's reserved pool is the default caching allocator's: a run with expandable segments
    keeps its allocated memory and times, not its reserved pool."""
    from runs.measured import to_measured_run

    record = records[2]
    default = to_measured_run(record)
    machine = {**record.result.machine, "cuda_alloc_conf": "expandable_segments:True"}
    other = to_measured_run(dataclasses.replace(record, result=dataclasses.replace(record.result, machine=machine)))
    assert default.peak_gpu_reserved_gib == record.result.peak_gpu_reserved_gib is not None
    assert other.peak_gpu_reserved_gib is None
    assert other.peak_gpu_mem_gib == default.peak_gpu_mem_gib and other.step_time_s == default.step_time_s


def test_a_repeat_under_another_allocator_setting_keeps_its_default_twins_pool(records):
    """A step measured with the default allocator and again with expandable segments is one run: its
    time the mean of both, its pool the default allocator's, whichever ran last."""
    record = records[2]
    machine = {**record.result.machine, "cuda_alloc_conf": "expandable_segments:True"}
    later = RunRecord(record.key, "2026-12-09T10:00:00+00:00", record.candidate,
                      dataclasses.replace(record.result, machine=machine, step_time_s=4 * record.result.step_time_s,
                                          peak_gpu_reserved_gib=1.0))
    run = to_run_set([record, later]).runs[0]
    assert run.peak_gpu_reserved_gib == record.result.peak_gpu_reserved_gib is not None
    assert run.step_time_s == pytest.approx(2 * record.result.step_time_s)  # the geometric mean of both
    assert to_run_set([later]).runs[0].peak_gpu_reserved_gib is None  # alone, it has no pool of the model's


def test_a_run_under_a_capped_memory_pool_is_not_a_run_of_its_step(records):
    """Under a cap the allocator frees and refills its cache (calibration.harness.memory_cap): the fit
    and the memory comparisons leave such a run out, and say why."""
    from runs.measured import to_measured_run

    record = records[2]
    machine = {**record.result.machine, "gpu_memory_cap_gib": 12.5}
    capped = dataclasses.replace(record, result=dataclasses.replace(record.result, machine=machine))
    with pytest.raises(ValueError, match="capped at 12.5 GiB"):
        to_measured_run(capped)
    assert to_run_set([capped]).runs == [] and "capped" in to_run_set([capped]).skipped[0]
    uncapped = {**machine, "gpu_memory_cap_gib": None}  # what an uncapped run records
    assert to_measured_run(dataclasses.replace(record, result=dataclasses.replace(record.result, machine=uncapped)))


def _on(record, lease: dict):
    """The record on a lease: {"boot_id": ...} in its machine, or {"note": ...} among its notes."""
    machine = {**record.result.machine, **({"boot_id": lease["boot_id"]} if "boot_id" in lease else {})}
    notes = [lease["note"]] if "note" in lease else []
    return dataclasses.replace(record, result=dataclasses.replace(record.result, machine=machine), notes=notes)


def test_probed_runs_are_taken_at_their_leases_median_probe(records):
    from runs.measured import lease_of

    boot = {"boot_id": "5d3c-boot"}
    note = {"note": "lent 1x H200 machine Q of 2026-12-01 17:05-17:10 UTC (data/runs/README.md)"}
    leased = [_on(_probed(records[0], 100.0, 0), boot), _on(_probed(records[1], 150.0, 1), boot),
              _on(_probed(records[2], 400.0, 2), boot), _on(_probed(records[3], None, 3), boot),
              _on(_probed(records[4], 220.0, 4), note), _probed(records[5], 90.0, 5)]
    assert lease_of(leased[0]) == "5d3c-boot"
    assert lease_of(leased[4]) == "machine Q of 2026-12-01 17:05-17:10"
    assert lease_of(leased[5]) is None
    runs = {r.run_id: r.host_issue_per_layer_s for r in to_run_set(leased).runs}
    assert [runs[r.key] for r in records[:3]] == [pytest.approx(150e-6)] * 3  # the boot's median
    assert runs[records[3].key] is None  # not probed: the run says nothing of its host
    assert runs[records[4].key] == pytest.approx(220e-6)  # a lease of its own
    assert runs[records[5].key] == pytest.approx(90e-6)  # no lease known: its own probe


def test_a_run_probed_on_both_sides_of_its_window_keeps_its_own_host(records):
    """The probes around the window follow a drifting host; the lease's median stands in only for runs
    probed once, before their model was built."""
    boot = {"boot_id": "5d3c-boot"}
    leased = [_on(_probed(records[0], 100.0, 0), boot), _on(_probed(records[1], 200.0, 1), boot),
              _on(_probed(records[2], 300.0, 2), boot), _on(_probed(records[3], 40.0, 3, after_us=90.0), boot)]
    runs = {r.run_id: r.host_issue_per_layer_s for r in to_run_set(leased).runs}
    assert runs[records[3].key] == pytest.approx(60e-6)  # its own: the geometric mean of 40 and 90
    assert [runs[r.key] for r in records[:3]] == [pytest.approx(150e-6)] * 3  # the median of 100, 200, 300, 60
    # probed right before its window but not after it: one side only, so the lease's median
    half = _probed(records[4], 500.0, 4)
    half = dataclasses.replace(half, result=dataclasses.replace(
        half.result, host_probe={**half.result.host_probe, "issue_us_per_layer_window_start": 400.0}))
    runs = {r.run_id: r.host_issue_per_layer_s for r in to_run_set(leased + [_on(half, boot)]).runs}
    assert runs[records[4].key] == pytest.approx(200e-6)  # the median of 100, 200, 300, 60, 400


def _at_threads(record, threads: int, minutes: int, step_scale: float):
    """The record's run again with its thread count set, a later date and another step time."""
    candidate = dataclasses.replace(record.candidate, strategy={**record.candidate.strategy,
                                                                "cpu_threads_per_rank": threads})
    result = dataclasses.replace(record.result, step_time_s=record.result.step_time_s * step_scale,
                                 cpu_threads_per_rank=threads)
    return RunRecord(candidate.key(), f"2026-12-01T11:{minutes:02d}:00+00:00", candidate, result)


def test_a_run_that_did_not_name_its_threads_repeats_the_same_run_that_did(records):
    """Before runs set their threads they ran at 16; the same candidate at 16 set has another key and is
    the same run (one candidate to the fit and to the pick check), while 4 threads is another run."""
    legacy = records[2]
    assert not legacy.candidate.strategy.get("cpu_threads_per_rank")
    named = _at_threads(legacy, 16, 0, 1.21)
    fewer = _at_threads(legacy, 4, 1, 3.0)
    assert len({legacy.key, named.key, fewer.key}) == 3
    runs = to_run_set([legacy, named, fewer])
    assert len(runs.runs) == 2 and runs.repeats == 1
    by_threads = {r.strategy.cpu_threads_per_rank: r for r in runs.runs}
    assert by_threads[16].step_time_s == pytest.approx(legacy.result.step_time_s * 1.1)
    assert by_threads[4].step_time_s == pytest.approx(legacy.result.step_time_s * 3.0)


def test_a_refit_without_the_shipped_runs_says_so_before_the_runs(records, tmp_path, monkeypatch):
    """An installed wheel has no data/runs: a refit of a shipped profile must not silently drop them;
    a profile whose runs are all in the store needs none of them."""
    from advisor.loop import check_refit_runs
    from models.profile import load_profile

    h200 = load_profile("h200")
    check_refit_runs(h200, str(tmp_path / "none.db"))  # in a checkout: data/runs is here
    monkeypatch.setattr(measured, "SHIPPED_RUNS", tmp_path / "no-checkout" / "data" / "runs")
    with pytest.raises(measured.ShippedRunsMissing, match="data/runs"):
        check_refit_runs(h200, str(tmp_path / "none.db"))
    with RunStore(tmp_path / "runs.db") as store:
        store.add_runs(records)
    own = h200.model_copy(update={"fit": h200.fit.model_copy(update={"run_ids": [r.key for r in records]})})
    check_refit_runs(own, str(tmp_path / "runs.db"))
