"""Energy of one step: the sum over phases of exposed time x power.

GPU power depends on what the GPU does in a phase: dense compute near the power cap,
collectives and host copies lower, waiting on the CPU optimizer or on Python from what it drew
busy toward idle (below). A step's memory-bound kernels draw the dense stream's power, not their
own: alone, on one H200, elementwise passes drew 526-588 W and a fused AdamW step 491-519 W, but a
decoder MLP's stream held 659-709 W at any share of elementwise time from 18% to 77% (GEMMs alone
653-731 W), and a 35 ms AdamW step right after 50 ms of GEMMs drew 690 +- 22 W (machines BB and
BC, `data/calibration/README.md`). So the elementwise phase and the optimizer step's Adam share
draw `compute`; `memory_bound` (a long device copy alone) stays the calibration's figure. Compute
that ran beside communication draws the profile's `overlap` power for that share of its time. GPU
energy counts every GPU.

CPU energy: each node's host draws `power.cpu.idle` all step, and while the CPU optimizer runs
(its busy time, even the part SuperOffload hides behind the backward) the extra draw of
`power.cpu.optimizer` (all cores busy) in the share of the node's cores its threads keep busy:
one thread a rank under torchrun's default runs the optimizer many times longer, on one core,
not on all of them. It is an estimate unless the profile says a sensor measured it.

Waiting is not idling. When its work stops, the GPU's power falls toward `wait` with a time
constant of about 0.3 times the busy stretch before (`power.gpu.wait_decay`, measured on H200 from
40 us kernels to 100 ms bursts). So a wait right after busy work draws that work's power above
`wait` for a "hot tail" of up to the time constant: the waits a step has once (DeepSpeed's step
overhead, the CPU optimizer) after the last micro-step, and ZeRO-3's hook waits, between one
module's kernels and the next's, after each module's share of the dense work, both from the
micro-steps' mean power. The host's other issue waits, between kernels launched one by one, draw
`wait`: host-bound steps of small kernels stayed at idle power (H200: 125 W through steps of a
256-wide decoder).

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
from models.timing import COMPUTE_PHASES, GPU_ADAM_BYTES_PER_PARAM, PHASES, StepTiming, cpu_threads, divide_or_zero

# Which GPU power figure each phase draws (per GPU); compute phases split with `overlap`.
PHASE_POWER = {
    "compute": "compute",
    "attention": "compute",
    "recompute": "compute",
    "vision_compute": "compute",
    "vision_recompute": "compute",
    "elementwise": "compute",
    "optimizer_gpu": "compute",
    "overlap_contention": "overlap",
    "zero_comm": "collective",
    "ulysses_all_to_all": "collective",
    "host_transfer": "host_copy",
    "cpu_optimizer": "wait",
    "deepspeed_overhead": "wait",
}
assert set(PHASE_POWER) == set(PHASES)
# The powers of dense work: what a wait after it starts from.
HOT_POWERS = ("compute", "overlap")


def optimizer_adam_share(profile: HardwareProfile) -> float:
    """Of the optimizer step's GPU time, the share that streams FusedAdam's own bytes, at the dense
    power (it follows the backward's kernels; above); the rest (norms, casts and copies launched
    tensor by tensor, kernels of microseconds with the host issuing between them) draws the wait
    power. The split is chosen, not measured: the step's power was not read apart; on 273 runs, all
    of it at one power gave a 5-fold energy error of 5.8%, the split 4.7% (time the same)."""
    measured = profile.gpu.optimizer_step_bytes_per_param
    return 1.0 if measured is None else min(1.0, GPU_ADAM_BYTES_PER_PARAM / measured.value)


def hot_tail_s(profile: HardwareProfile, busy_s, wait_s) -> np.ndarray:
    """Seconds of a wait of `wait_s` right after `busy_s` seconds of busy work that count at the busy
    power above `wait`: the integral of the decay (models.profile.WaitDecay); none where unmeasured."""
    decay = profile.power.gpu.wait_decay
    wait_s = np.asarray(wait_s, dtype=float)
    if decay is None:
        return np.zeros(np.broadcast(np.asarray(busy_s), wait_s).shape)
    tau = decay.time_constant_s(busy_s)
    return np.where(tau > 0, tau * -np.expm1(-wait_s / np.maximum(tau, 1e-300)), 0.0)


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

    share = np.clip(divide_or_zero(timing.overlapped_compute_s, sum(phases[k] for k in COMPUTE_PHASES)), 0.0, 1.0)
    overlap_w = gp.overlap.value

    busy_cores = np.minimum(cpu_threads(b, profile) * b.ranks_per_node, profile.host.cores.value)
    cpu_extra_w = max(cp.optimizer.value - cp.idle.value, 0.0) * busy_cores / profile.host.cores.value  # per node
    wait_w = gp.wait.value
    phase_w = {name: getattr(gp, PHASE_POWER[name]).value for name in PHASES}
    adam_share = optimizer_adam_share(profile)
    phase_w["optimizer_gpu"] = adam_share * phase_w["optimizer_gpu"] + (1.0 - adam_share) * wait_w
    for name in COMPUTE_PHASES:
        phase_w[name] = (1.0 - share) * phase_w[name] + share * overlap_w
    dense = [name for name in PHASES if PHASE_POWER[name] in HOT_POWERS]
    dense_s = sum(phases[k] for k in dense)
    dense_excess_j = sum(phases[k] * (phase_w[k] - wait_w) for k in dense)  # per GPU, above `wait`

    # The waits a step has once come after the last micro-step, and start at the micro-steps' mean power.
    issue_wait = timing.host_issue_wait_s
    step_wait = phases["deepspeed_overhead"] - issue_wait
    micro_steps_s = np.maximum(timing.step_time_s - step_wait - phases["cpu_optimizer"], 1e-12)
    start_excess_w = dense_excess_j / micro_steps_s
    last_busy_s = dense_s / b.grad_accum

    def once(wait_s):
        return wait_s * wait_w + start_excess_w * hot_tail_s(profile, last_busy_s, wait_s)

    # ZeRO-3's hooks wait between one module's kernels and the next's: each of the step's gaps after
    # its share of the dense work, from the micro-steps' mean power as the step's own waits are. A GPU
    # that waits on the host most of a micro-step never draws its dense power for long: on 18 phase-traced
    # one-GPU ZeRO-3 steps (machines AW-AZ, 2026-12-03) the power left over beside their measured busy
    # time at the model's busy power was 110-226 W, median 148 (wait 125); the model's own, with these
    # tails, 128-227 W, median 143; with tails from the dense power it had been 141-294 W, median 177,
    # against 151 measured (wait 120; `data/runs/README.md`). The host's other issue waits come
    # between kernels launched one by one, after stretches too short to heat them: at `wait` (with
    # ZeRO-1/2's gradient hooks hot too, their host-bound steps came out 4% over in-sample).
    gaps = timing.hook_gaps
    hooks_hot_s = gaps * hot_tail_s(profile, divide_or_zero(dense_s, gaps), divide_or_zero(timing.hook_wait_s, gaps))
    wait_energy = {  # per GPU
        "deepspeed_overhead": (once(step_wait) + issue_wait * wait_w
                               + start_excess_w * hooks_hot_s),
        "cpu_optimizer": once(phases["cpu_optimizer"]),
    }
    gpu_e, cpu_e = {}, {}
    for name in PHASES:
        gpu_e[name] = (wait_energy[name] if name in wait_energy else phases[name] * phase_w[name]) * gpus
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
