"""The CPU Adam items share one optimizer over the same memory, and the last of them frees it."""
import torch

from calibration.microbench import cpu
from calibration.microbench.common import BenchContext, sizes_for


def _ctx() -> BenchContext:
    return BenchContext(device=torch.device("cpu"), sizes=sizes_for(quick=True, cpu=True), cpu_adam="torch")


def test_the_thread_items_time_the_state_the_first_item_built_and_the_last_frees_it():
    cpu.release_adam_state()
    ctx = _ctx()
    all_cores = cpu.bench_cpu_adam(ctx)
    (state,) = cpu._SHARED_ADAM.values()
    one = cpu.bench_cpu_adam(ctx, 1)
    assert list(cpu._SHARED_ADAM.values()) == [state]  # not built again
    two = cpu.bench_cpu_adam(ctx, 2, last=True)
    assert cpu._SHARED_ADAM == {}
    for result, threads in ((all_cores, cpu.host_cores()), (one, 1), (two, 2)):
        assert result["threads"] == threads and result["params"] == cpu.adam_params(True, True)
        assert result["optimizer"] == "torch.optim.AdamW(foreach=True)" and result["params_per_s"] > 0


def test_the_shared_state_steps_the_parameters_each_item():
    cpu.release_adam_state()
    ctx = _ctx()
    cpu.bench_cpu_adam(ctx)
    (state,) = cpu._SHARED_ADAM.values()
    param = state.optimizer.param_groups[0]["params"][0]
    before = param.detach().clone()
    cpu.bench_cpu_adam(ctx, 1, last=True)
    assert not torch.equal(before, param.detach())  # the timed steps ran on the shared parameters


def test_the_last_thread_item_is_the_one_that_frees():
    ctx = _ctx()
    items = [i for i in cpu.items(ctx) if i.family == "cpu_adam_threads"]
    cpu.release_adam_state()
    for item in items[:-1]:
        item.run(ctx)
        assert cpu._SHARED_ADAM
    items[-1].run(ctx)
    assert cpu._SHARED_ADAM == {}
