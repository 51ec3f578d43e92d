"""Energy = sum over phases of time x power; module-scope meters never count the CPU twice."""
from __future__ import annotations

import numpy as np
import pytest
from cost_model_helpers import profile_with

from models.architecture import load_architecture
from models.energy import PHASE_POWER, hot_tail_s, step_energy
from models.predict import predict
from models.strategy import Strategy, StrategyBatch
from models.timing import PHASES, StepTiming
from models.workload import Workload

W7 = Workload(load_architecture("llama-2-7b"), 8192)


def _cpu_busy_s(p) -> float:
    """ZeRO-2 offload of W7 on 8 GPUs, 4 a node: each rank's CPUAdam at a quarter of the node's rate,
    then its cast of the updated parameters to bf16 on its share of the cores."""
    per_rank = 6_738_415_616 / 8
    return per_rank * 4 / p.host.cpu_adam.value + per_rank / float(p.host.param_cast_rate(p.host.default_threads_per_rank(4)))


def _gpu_scope(measured: bool = False, wait_decay: dict | None = None):
    """Waits at `wait` power however short unless `wait_decay` is given: the sums below are then exact."""
    return profile_with({"power.nvml_scope": "gpu", "power.cpu.measured": measured, "power.gpu.wait_decay": wait_decay})


def test_gpu_scope_energy_is_phase_time_times_phase_power_plus_host_cpu():
    p = _gpu_scope()
    s = Strategy(gpus=8, gpus_per_node=4, zero_stage=2, offload_optimizer="cpu", overlap_comm=False)
    pred = predict(W7, s, p)
    gw, cw = p.power.gpu, p.power.cpu
    expected_gpu = sum(ph.time_s * getattr(gw, PHASE_POWER[ph.name]).value * 8 for ph in pred.breakdown)
    assert pred.gpu_energy_j == pytest.approx(expected_gpu, rel=1e-12)
    busy = _cpu_busy_s(p)  # the CPU optimizer and the parameter cast run exposed here
    expected_cpu = cw.idle.value * 2 * pred.step_time_s + (cw.optimizer.value - cw.idle.value) * 2 * busy
    assert pred.cpu_energy_j == pytest.approx(expected_cpu, rel=1e-9)
    assert pred.energy_j == pytest.approx(pred.gpu_energy_j + pred.cpu_energy_j)
    assert pred.cpu_energy_estimated and not pred.cpu_energy_in_gpu_energy
    assert sum(ph.cpu_energy_j for ph in pred.breakdown) == pytest.approx(pred.cpu_energy_j)
    assert _gpu_scope(measured=True).power.cpu.measured
    assert not predict(W7, s, _gpu_scope(measured=True)).cpu_energy_estimated


def test_module_scope_puts_the_cpu_inside_the_gpu_figure_once():
    gh200 = profile_with({"power.gpu.wait_decay": None})  # its waits at `wait`: the sum below is exact
    assert gh200.power.nvml_scope == "module"
    s = Strategy(gpus=8, gpus_per_node=4, zero_stage=2, offload_optimizer="cpu", overlap_comm=False)
    mod = predict(W7, s, gh200)
    assert mod.cpu_energy_j == 0.0 and mod.energy_j == mod.gpu_energy_j
    assert mod.cpu_energy_in_gpu_energy
    d = mod.to_dict()
    assert d["cpu_energy_in_gpu_energy"] is True and "not added again" in d["energy_note"]
    assert all("included in gpu_energy_j" in row["note"] for row in d["breakdown"])
    # the CPU optimizer's extra draw shows up on the module meters
    cw = gh200.power.cpu
    busy = _cpu_busy_s(gh200)
    wait = gh200.power.gpu.wait.value
    row = next(ph for ph in mod.breakdown if ph.name == "cpu_optimizer")
    extra_per_gpu = (cw.optimizer.value - cw.idle.value) / gh200.gpus_per_node.value
    assert row.gpu_energy_j == pytest.approx(row.time_s * wait * 8 + busy * extra_per_gpu * 8, rel=1e-12)


def test_compute_beside_communication_draws_overlap_power():
    p = _gpu_scope()
    phases = {name: np.array([0.0]) for name in PHASES}
    phases["compute"] = np.array([10.0])
    phases["overlap_contention"] = np.array([1.0])
    t = StepTiming(phase_time_s=phases, step_time_s=np.array([11.0]), overlapped_compute_s=np.array([4.0]),
                   cpu_optimizer_busy_s=np.array([0.0]), host_issue_wait_s=np.array([0.0]), hook_wait_s=np.zeros(1),
                   hook_gaps=np.zeros(1))
    b = StrategyBatch.from_strategies([Strategy(gpus=2, gpus_per_node=2)])
    e = step_energy(t, b, p)
    g = p.power.gpu
    assert float(e.phase_gpu_energy_j["compute"][0]) == pytest.approx(2 * (6 * g.compute.value + 4 * g.overlap.value))
    assert float(e.phase_gpu_energy_j["overlap_contention"][0]) == pytest.approx(2 * g.overlap.value)
    assert float(e.cpu_energy_j[0]) == pytest.approx(11.0 * p.power.cpu.idle.value)


def test_waiting_on_the_cpu_costs_less_gpu_power_than_computing(gh200):
    g = gh200.power.gpu
    assert g.wait.value < g.collective.value < g.compute.value <= gh200.gpu.power_cap.value


def test_the_cpu_optimizers_extra_draw_is_that_of_the_cores_its_threads_keep_busy():
    """One thread a rank keeps one core a rank busy, not the node's: over the same busy seconds it adds
    that share of the all-core extra draw; the launch default (the cores shared out) adds all of it."""
    p = _gpu_scope()
    cores, cw = p.host.cores.value, p.power.cpu
    phases = {name: np.array([0.0, 0.0]) for name in PHASES}
    phases["cpu_optimizer"] = np.array([3.0, 3.0])
    t = StepTiming(phase_time_s=phases, step_time_s=np.array([3.0, 3.0]), overlapped_compute_s=np.zeros(2),
                   cpu_optimizer_busy_s=np.array([3.0, 3.0]), host_issue_wait_s=np.zeros(2), hook_wait_s=np.zeros(2),
                   hook_gaps=np.zeros(2))
    b = StrategyBatch.from_strategies([Strategy(gpus=2, gpus_per_node=2, cpu_threads_per_rank=1),
                                       Strategy(gpus=2, gpus_per_node=2)])
    extra = step_energy(t, b, p).cpu_energy_j - 3.0 * cw.idle.value
    all_cores = 3.0 * (cw.optimizer.value - cw.idle.value)
    assert extra[1] == pytest.approx(all_cores)
    assert extra[0] == pytest.approx(all_cores * 2 / cores)


DECAY = {"decay_s": {"value": 0.05, "unit": "s", "source": "test"}, "burst_s": {"value": 0.1, "unit": "s", "source": "test"}}


def test_a_waits_hot_tail_grows_with_the_busy_stretch_before_it_up_to_the_measured_one():
    p = _gpu_scope(wait_decay=DECAY)
    tail = lambda busy, wait: float(hot_tail_s(p, np.array(busy), np.array(wait)))  # noqa: E731
    assert tail(0.1, 0.05) == pytest.approx(0.05 * (1 - np.exp(-1.0)))  # one time constant after the bursts
    assert tail(0.1, 50.0) == pytest.approx(0.05)  # a long wait: all of the fall
    assert tail(0.01, 50.0) == pytest.approx(0.005)  # a tenth of the stretch: a tenth of the tail
    assert tail(1.0, 50.0) == pytest.approx(0.05)  # longer than measured: held at the measured one
    assert tail(0.1, 0.001) == pytest.approx(0.001, rel=0.02)  # a short wait is hot throughout
    assert tail(0.0, 1.0) == 0.0 and tail(0.1, 0.0) == 0.0
    assert tail(0.1, 50.0) > tail(0.1, 0.05) > tail(0.01, 0.05) > 0.0
    assert float(hot_tail_s(_gpu_scope(), np.array(0.1), np.array(1.0))) == 0.0  # not measured: no tail


def _overhead_w(p, compute_s, issue_wait_s, step_wait_s, hook_wait_s=0.0, hook_gaps=0.0):
    """Mean GPU power through DeepSpeed's overhead after `compute_s` of dense compute on one GPU."""
    phases = {name: np.array([0.0]) for name in PHASES}
    phases["compute"] = np.array([compute_s])
    phases["deepspeed_overhead"] = np.array([issue_wait_s + step_wait_s])
    t = StepTiming(phase_time_s=phases, step_time_s=np.array([compute_s + issue_wait_s + step_wait_s]),
                   overlapped_compute_s=np.zeros(1), cpu_optimizer_busy_s=np.zeros(1),
                   host_issue_wait_s=np.array([issue_wait_s]), hook_wait_s=np.array([hook_wait_s]),
                   hook_gaps=np.array([hook_gaps]))
    b = StrategyBatch.from_strategies([Strategy(gpus=1, gpus_per_node=2)])
    return float(step_energy(t, b, p).phase_gpu_energy_j["deepspeed_overhead"][0]) / (issue_wait_s + step_wait_s)


def test_the_waits_of_a_step_start_at_its_micro_steps_mean_power():
    """The step's overhead, one wait after the last micro-step, falls from the micro-steps' mean power:
    after GPU-bound micro-steps it costs more than after host-bound ones, a short one more than a
    long one. The waits between kernels launched one by one draw `wait` whatever the step."""
    p = _gpu_scope(wait_decay=DECAY)
    wait, compute = p.power.gpu.wait.value, p.power.gpu.compute.value
    assert _overhead_w(p, 1.0, 0.0, 0.05) == pytest.approx(wait + (compute - wait) * (1 - np.exp(-1.0)))
    assert _overhead_w(p, 1.0, 0.0, 0.05) > _overhead_w(p, 1.0, 3.0, 0.05) > wait  # micro-steps a quarter dense
    assert _overhead_w(p, 1.0, 0.0, 0.05) > _overhead_w(p, 1.0, 0.0, 0.5) > wait
    assert _overhead_w(p, 1.0, 1.0, 0.0) == pytest.approx(wait)
    assert _overhead_w(_gpu_scope(), 1.0, 0.0, 0.05) == pytest.approx(wait)  # not measured: `wait`


def test_zero3s_hook_waits_between_modules_are_hot_from_their_micro_steps_mean_power():
    """100 gaps of 2 ms after 10 ms of compute each: a 5 ms time constant, each gap's fall (5 ms x
    (1 - e^-0.4) of it) above `wait` by the micro-step's mean excess, its 1 s of compute over 1.2 s."""
    p = _gpu_scope(wait_decay=DECAY)
    wait, compute = p.power.gpu.wait.value, p.power.gpu.compute.value
    hooks = _overhead_w(p, 1.0, 0.2, 0.0, hook_wait_s=0.2, hook_gaps=100)
    assert hooks == pytest.approx(wait + (compute - wait) / 1.2 * 0.005 * -np.expm1(-0.4) / 0.002)
    assert hooks > _overhead_w(p, 1.0, 0.2, 0.0) == pytest.approx(wait)  # the same waits off the hooks
    assert _overhead_w(p, 1.0, 0.2, 0.0, hook_wait_s=0.1, hook_gaps=100) < hooks
    # The same hooks in a micro-step that waits on the host 0.8 s more: cooler by its mean power.
    hot_j = lambda issue_wait_s: (_overhead_w(p, 1.0, issue_wait_s, 0.0, 0.2, 100) - wait) * issue_wait_s  # noqa: E731
    assert hot_j(1.0) == pytest.approx(hot_j(0.2) * 1.2 / 2.0)


@pytest.mark.parametrize("decay, key", [
    ({**DECAY, "decay_s": {"value": 0.0, "unit": "s", "source": "test"}}, "power.gpu.wait_decay.decay_s"),
    ({**DECAY, "burst_s": {"value": -1.0, "unit": "s", "source": "test"}}, "power.gpu.wait_decay.burst_s"),
])
def test_a_wait_decay_without_time_is_refused_by_name(decay, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        _gpu_scope(wait_decay=decay)


def test_a_steps_memory_bound_kernels_draw_the_dense_power_whatever_a_copy_alone_draws():
    s = Strategy(gpus=1, gpus_per_node=1, zero_stage=0, overlap_comm=False)
    cool = profile_with({"power.nvml_scope": "gpu", "power.gpu.wait_decay": None, "power.gpu.memory_bound": 250.0})
    hot = profile_with({"power.nvml_scope": "gpu", "power.gpu.wait_decay": None, "power.gpu.memory_bound": 650.0})
    a, b = predict(W7, s, cool), predict(W7, s, hot)
    assert a.gpu_energy_j == pytest.approx(b.gpu_energy_j, rel=1e-12)
    elementwise = next(ph for ph in a.breakdown if ph.name == "elementwise")
    assert elementwise.time_s > 0
    assert elementwise.gpu_energy_j == pytest.approx(elementwise.time_s * cool.power.gpu.compute.value, rel=1e-12)


def test_the_optimizer_steps_work_beyond_adams_bytes_draws_the_wait_power():
    s = Strategy(gpus=2, gpus_per_node=2, zero_stage=1)
    measured = profile_with({"power.nvml_scope": "gpu", "power.gpu.wait_decay": None,
                             "gpu.optimizer_step_bytes_per_param": 144.0})
    counted = measured.model_copy(update={"gpu": measured.gpu.model_copy(update={"optimizer_step_bytes_per_param": None})})
    for p, adam_share in ((counted, 1.0), (measured, 0.25)):  # FusedAdam's 36 of 144
        phase = next(ph for ph in predict(W7, s, p).breakdown if ph.name == "optimizer_gpu")
        gw = p.power.gpu
        watts = adam_share * gw.compute.value + (1 - adam_share) * gw.wait.value  # Adam's share after the backward
        assert phase.time_s > 0 and phase.gpu_energy_j == pytest.approx(phase.time_s * watts * 2, rel=1e-12)
