"""A calibration prices nothing it did not measure as free: DeepSpeed's overheads and the pool's shares come
from a reference fitted to real runs, rescaled by this host's measurements; a one-GPU calibration's
collectives are placeholders that plans on several GPUs are refused on."""
import pytest
from cal_helpers import env, gpu_results, rr

from calibration.carried import carried_overheads, issue_ratio
from calibration.microbench.collectives import group_plan
from calibration.profile_writer import build_profile
from models.profile import HostSpec, load_profile, parse_profile
from models.term_basis import basis_of, network_refusal


@pytest.fixture(scope="module")
def h200():
    return load_profile("h200")


def one_gpu_results(issue_us=None, adam_rate=None) -> dict:
    """One GPU's results: no collective (a group of one times none), no collective overlap or power."""
    results = {k: v for k, v in gpu_results(world=1).items()
               if not k.startswith(("collective/", "overlap/all", "power/collective"))}
    for key in ("overlap/all_gather", "overlap/all_to_all", "power/collective"):
        results[key] = rr(key, key.split("/")[0], {}, "skipped", "needs at least 2 ranks")
    if issue_us is not None:
        results["host/issue"] = rr("host/issue", "host_issue", {"ran": True, "us_per_layer": issue_us, "threads": 16})
    if adam_rate is not None:
        data = dict(results["cpu/adam"].data, params_per_s=adam_rate)
        results["cpu/adam"] = rr("cpu/adam", "cpu_adam", data)
    return results


def build_one_gpu(reference, fill_from=None, **kw):
    return parse_profile(build_profile(env(world=1, local=1), one_gpu_results(**kw), name="new", raw_file="t.raw.jsonl",
                                       reference=reference, fill_from=fill_from))


def test_a_group_of_one_times_no_collective():
    class Ctx:
        world_size, local_world_size, nnodes = 1, 1, 1

    assert group_plan(Ctx()) == []


def test_overheads_are_carried_from_the_reference_never_zero(h200):
    p = build_one_gpu(h200, issue_us=h200.overheads.issue_fitted_at_per_layer.value * 1e6)
    for name in ("super_offload_step_per_gparam", "offload_step_per_gparam", "zero3_module_pass", "layer_pass"):
        q = getattr(p.overheads, name)
        assert basis_of(q.source) == "carried", q.source
        assert q.value > 0
    # the same probe reading as the reference's: the issue constants carry over unchanged
    assert p.overheads.step.value == pytest.approx(h200.overheads.step.value)
    assert p.host_issue_scale == pytest.approx(1.0)
    assert basis_of(p.memory.fragmentation.source) == "carried"
    assert p.memory.fragmentation.value == h200.memory.fragmentation.value


def test_a_slower_host_carries_slower_overheads(h200):
    fitted_at_us = h200.overheads.issue_fitted_at_per_layer.value * 1e6
    same = build_one_gpu(h200, issue_us=fitted_at_us)
    slow = build_one_gpu(h200, issue_us=2 * fitted_at_us, adam_rate=same.host.cpu_adam.value / 2)
    assert slow.overheads.step.value == pytest.approx(2 * same.overheads.step.value)
    assert slow.overheads.offload_step_serial_per_gparam.value == pytest.approx(
        2 * same.overheads.offload_step_serial_per_gparam.value)
    assert slow.host_issue_scale == pytest.approx(2.0)  # the model scales layer_pass and the hooks itself
    # no thread curve here: the all-core rate, halved, halves each thread's rate
    assert slow.overheads.super_offload_step_per_gparam.value == pytest.approx(
        2 * same.overheads.super_offload_step_per_gparam.value)


def test_without_a_probe_the_issue_terms_are_carried_unscaled_and_say_so(h200):
    p = build_one_gpu(h200)
    assert issue_ratio(p.host, h200) is None
    assert p.overheads.step.value == pytest.approx(h200.overheads.step.value)
    assert "not rescaled: no host probe here" in p.overheads.step.source


def test_one_gpu_collectives_are_placeholders_and_plans_on_several_gpus_are_refused(h200):
    p = build_one_gpu(h200)
    assert basis_of(p.intra_node.all_gather.bus_bandwidth.source) == "placeholder"
    assert network_refusal(p, 1) is None
    refusal = network_refusal(p, 8)
    assert refusal is not None and "no measured collectives" in refusal and "--fill-from" in refusal


def test_fill_from_carries_the_collectives_flagged_not_refused(h200):
    p = build_one_gpu(h200, fill_from=h200)
    assert basis_of(p.intra_node.all_gather.bus_bandwidth.source) == "carried"
    assert network_refusal(p, 2) is None


def test_carried_overheads_rescale_by_the_cpu_rate_at_the_default_threads(h200):
    host = HostSpec.model_validate(dict(h200.host.model_dump(), cpu_adam_threads=None,
                                        cpu_adam=dict(h200.host.cpu_adam.model_dump(), value=1e9)))
    out = carried_overheads(host, h200.gpus_per_node.value, h200)
    threads = h200.host.default_threads_per_rank(h200.gpus_per_node.value)
    ratio = (float(h200.host.cpu_rate_on_threads(threads, h200.gpus_per_node.value))
             / float(host.cpu_rate_on_threads(threads, h200.gpus_per_node.value)))
    assert out["offload_step_per_gparam"]["value"] == pytest.approx(h200.overheads.offload_step_per_gparam.value * ratio)
    assert ratio > 1  # a 1e9 params/s host is slower than the reference's


def test_the_host_probe_is_the_median_of_its_readings_through_the_calibration(h200):
    results = one_gpu_results(issue_us=262.0)
    for key, us in (("cpu/host_issue/mid", 180.0), ("cpu/host_issue/end", 190.0)):
        results[key] = rr(key, "host_issue", {"ran": True, "us_per_layer": us, "threads": 16})
    p = parse_profile(build_profile(env(world=1, local=1), results, name="new", raw_file="t.raw.jsonl",
                                    reference=h200))
    assert p.host.issue_per_layer.value == pytest.approx(190e-6)
    assert "median of 3 reading(s)" in p.host.issue_per_layer.source


def test_the_calibration_probes_the_host_three_times():
    from calibration.calibrate import plan
    from calibration.microbench.common import BenchContext, sizes_for

    import torch

    ctx = BenchContext(device=torch.device("cpu"), sizes=sizes_for(True, True), rank=0, world_size=1, local_rank=0,
                       local_world_size=1, backend="gloo", cpu_adam="torch")
    keys = [i.key for i in plan(ctx, ("host_issue",))]
    assert keys == ["cpu/host_issue", "cpu/host_issue/mid", "cpu/host_issue/end"]
