"""Energy of one step: the sum over phases of exposed time x power.

GPU power depends on what the GPU does in a phase: dense compute near the power cap,
memory-bound kernels lower, collectives and host copies lower still, waiting on the CPU
optimizer or on Python from what it drew busy toward idle (below). Compute that ran beside communication draws the
profile's `overlap` power for that share of its time. GPU energy counts every GPU.

CPU energy: each node's host draws `power.cpu.idle` all step, and while the CPU optimizer runs
(its busy time, even the part SuperOffload hides behind the backward) the extra draw of
`power.cpu.optimizer` (all cores busy) in the share of the node's cores its threads keep busy:
one thread a rank under torchrun's default runs the optimizer many times longer, on one core,
not on all of them. It is an estimate unless the profile says a sensor measured it.

Waiting is not idling. After dense work the GPU's power falls toward `wait` over tens of
milliseconds (`power.gpu.wait_decay`, measured: on H200 it drew its busy power through gaps of 5-10
ms and fell with a 31 ms time constant), so the waits a step has once (DeepSpeed's step overhead,
the CPU optimizer) draw the average of that fall over their length, from a start as hot as the
micro-steps were dense (their share of time in the phases at compute, memory-bound or overlap
power). The waits between one kernel and the next (the host's issue time) draw `wait`: host-bound
steps of small kernels stayed at idle power (H200: 125 W through steps of a 256-wide decoder, and
host-bound 1k-token steps were over-predicted by up to 31% when these waits were charged hot too).

When the GPU meter reads module power (`power.nvml_scope == "module"`, GH200), the
profile's GPU figures already include the CPU and its memory at rest, and the CPU
optimizer's extra draw shows up on the module meter too: it is added to the GPU figure,
and no separate CPU energy is added, so nothing is counted twice.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.profile import HardwareProfile
from models.strategy import StrategyBatch
from models.timing import COMPUTE_PHASES, PHASES, StepTiming, cpu_threads

# Which GPU power figure each phase draws (per GPU); compute phases split with `overlap`.
PHASE_POWER = {
    "compute": "compute",
    "attention": "compute",
    "recompute": "compute",
    "vision_compute": "compute",
    "vision_recompute": "compute",
    "elementwise": "memory_bound",
    "optimizer_gpu": "memory_bound",
    "overlap_contention": "overlap",
    "zero_comm": "collective",
    "ulysses_all_to_all": "collective",
    "host_transfer": "host_copy",
    "cpu_optimizer": "wait",
    "deepspeed_overhead": "wait",
}
assert set(PHASE_POWER) == set(PHASES)
# The powers of dense work: the micro-steps' share of time in them sets how hot the step's waits start.
HOT_POWERS = ("compute", "memory_bound", "overlap")


def wait_power_w(profile: HardwareProfile, hot_share, wait_s) -> np.ndarray:
    """Average GPU power through a wait of `wait_s` seconds that starts `hot_share` of the way from
    `wait` to the measured hot power (see the module docstring)."""
    gp = profile.power.gpu
    wait_w = gp.wait.value
    if gp.wait_decay is None:
        return np.full(np.shape(hot_share), wait_w)
    x = np.asarray(wait_s, dtype=float) / gp.wait_decay.decay_s.value
    held = np.divide(-np.expm1(-x), x, out=np.ones_like(x), where=x > 1e-9)  # (1 - e^-x) / x, 1 at x -> 0
    return wait_w + (gp.wait_decay.hot.value - wait_w) * hot_share * held


@dataclass(frozen=True)
class StepEnergy:
    """Joules per step: per phase and in total, GPU (all GPUs of the job) and CPU (all nodes)."""

    phase_gpu_energy_j: dict[str, np.ndarray]
    phase_cpu_energy_j: dict[str, np.ndarray]
    gpu_energy_j: np.ndarray
    cpu_energy_j: np.ndarray
    cpu_energy_estimated: bool
    cpu_energy_in_gpu_energy: bool  # module-scope meter: the GPU figure includes the CPU


def step_energy(timing: StepTiming, b: StrategyBatch, profile: HardwareProfile) -> StepEnergy:
    gp, cp = profile.power.gpu, profile.power.cpu
    gpus = b.gpus.astype(float)
    nodes = np.ceil(b.gpus / b.gpus_per_node).astype(float)
    module = profile.power.nvml_scope == "module"
    phases = timing.phase_time_s

    compute_total = sum(phases[k] for k in COMPUTE_PHASES)
    share = np.divide(timing.overlapped_compute_s, compute_total, out=np.zeros_like(compute_total),
                      where=compute_total > 0)
    share = np.clip(share, 0.0, 1.0)
    overlap_w = gp.overlap.value

    busy_cores = np.minimum(cpu_threads(b, profile) * b.ranks_per_node, profile.host.cores.value)
    cpu_extra_w = max(cp.optimizer.value - cp.idle.value, 0.0) * busy_cores / profile.host.cores.value  # per node
    issue_wait = timing.host_issue_wait_s
    step_wait = phases["deepspeed_overhead"] - issue_wait
    micro_steps_s = np.maximum(timing.step_time_s - step_wait - phases["cpu_optimizer"], 1e-12)
    hot_share = np.clip(sum(phases[k] for k in PHASES if PHASE_POWER[k] in HOT_POWERS) / micro_steps_s, 0.0, 1.0)
    wait_energy = {  # per GPU: the waits between kernels draw `wait`; the step's, one each, decay from hot
        "deepspeed_overhead": issue_wait * gp.wait.value + step_wait * wait_power_w(profile, hot_share, step_wait),
        "cpu_optimizer": phases["cpu_optimizer"] * wait_power_w(profile, hot_share, phases["cpu_optimizer"]),
    }
    gpu_e, cpu_e = {}, {}
    for name in PHASES:
        w = getattr(gp, PHASE_POWER[name]).value
        if name in COMPUTE_PHASES:
            w = (1.0 - share) * w + share * overlap_w
        gpu_e[name] = wait_energy[name] * gpus if name in wait_energy else phases[name] * w * gpus
        cpu_e[name] = np.zeros_like(phases[name]) if module else phases[name] * cp.idle.value * nodes
    busy = timing.cpu_optimizer_busy_s
    if module:
        # Each module meter sees its own CPU: the node's extra draw split over its GPUs.
        gpu_e["cpu_optimizer"] = gpu_e["cpu_optimizer"] + busy * cpu_extra_w / profile.gpus_per_node.value * gpus
    else:
        cpu_e["cpu_optimizer"] = cpu_e["cpu_optimizer"] + busy * cpu_extra_w * nodes
    return StepEnergy(
        phase_gpu_energy_j=gpu_e,
        phase_cpu_energy_j=cpu_e,
        gpu_energy_j=sum(gpu_e.values()),
        cpu_energy_j=sum(cpu_e.values()),
        cpu_energy_estimated=not cp.measured,
        cpu_energy_in_gpu_energy=module,
    )
