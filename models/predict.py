"""The cost model's entry: time, energy and memory of DeepSpeed strategies on a profile.

`predict_batch` evaluates many strategies at once as numpy columns (the search calls it
with tens of thousands); `predict` is the same computation for one strategy. Infeasible
strategies keep their numbers and carry the reasons, with the numbers that decide them.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from models import energy as energy_mod
from models import flops, memory, timing
from models.architecture import Architecture
from models.memory import GIB
from models.params import ParamCounts, count_params
from models.profile import GpuSpec, HardwareProfile, MemorySpec
from models.strategy import OFFLOAD_CPU, OFFLOAD_NAMES, Strategy, StrategyBatch, static_reasons
from models.workload import Workload

MODULE_NOTE = ("GPU energy is module power (NVML on this platform includes the CPU and its memory); "
               "CPU energy is inside it and not added again")


# The phases that are the host's: DeepSpeed's host work with the GPU's waits on it, and the CPU
# optimizer where the backward does not hide it. Their share of a step sets its band (models.band).
HOST_PHASES = ("deepspeed_overhead", "cpu_optimizer")


def host_share(phase_time_s: dict, step_time_s):
    """The share of a step spent on the host (HOST_PHASES); scalars or arrays."""
    return timing.divide_or_zero(sum(np.asarray(phase_time_s[name], dtype=float) for name in HOST_PHASES),
                                 step_time_s)


@dataclass(frozen=True)
class Phase:
    """Exposed time of one phase of a step, and the energy spent in it (all GPUs, all nodes)."""

    name: str
    time_s: float
    gpu_energy_j: float
    cpu_energy_j: float


@dataclass(frozen=True)
class Prediction:
    """One strategy's cost per optimizer step. Energies sum over the job's GPUs and nodes."""

    step_time_s: float
    gpu_energy_j: float
    cpu_energy_j: float
    energy_j: float
    peak_gpu_mem_gib: float  # what must fit: the allocator's reserved pool + memory outside it (CUDA, NCCL)
    peak_host_mem_gib: float  # per node
    tokens_per_s: float
    feasible: bool
    reasons: list[str]
    cpu_energy_estimated: bool
    breakdown: list[Phase]
    profile: str
    strategy: Strategy | None  # None only for a batch row whose offload code names no device
    cpu_energy_in_gpu_energy: bool = False
    allocated_gpu_mem_gib: float = 0.0  # comparable to torch.cuda.max_memory_allocated
    reserved_gpu_mem_gib: float = 0.0  # comparable to torch.cuda.max_memory_reserved

    @property
    def host_share(self) -> float:
        return float(host_share({p.name: p.time_s for p in self.breakdown}, self.step_time_s))

    def to_dict(self) -> dict:
        """The JSON of `advisor predict --json`."""
        note = MODULE_NOTE if self.cpu_energy_in_gpu_energy else None
        return {
            "step_time_s": self.step_time_s,
            "host_share": self.host_share,
            "gpu_energy_j": self.gpu_energy_j,
            "cpu_energy_j": self.cpu_energy_j,
            "energy_j": self.energy_j,
            "peak_gpu_mem_gib": self.peak_gpu_mem_gib,
            "peak_host_mem_gib": self.peak_host_mem_gib,
            "allocated_gpu_mem_gib": self.allocated_gpu_mem_gib,
            "reserved_gpu_mem_gib": self.reserved_gpu_mem_gib,
            "tokens_per_s": self.tokens_per_s,
            "feasible": self.feasible,
            "reasons": list(self.reasons),
            "cpu_energy_estimated": self.cpu_energy_estimated,
            "cpu_energy_in_gpu_energy": self.cpu_energy_in_gpu_energy,
            "energy_note": note,
            "profile": self.profile,
            "strategy": (None if self.strategy is None
                         else {**dataclasses.asdict(self.strategy), "label": self.strategy.label()}),
            "breakdown": [
                {"phase": p.name, "time_s": p.time_s, "gpu_energy_j": p.gpu_energy_j, "cpu_energy_j": p.cpu_energy_j,
                 **({"note": "cpu_energy_j is included in gpu_energy_j (module meter)"} if note else {})}
                for p in self.breakdown
            ],
        }


@dataclass(frozen=True)
class BatchPrediction:
    """Columns for many strategies; names as in `Prediction`."""

    step_time_s: np.ndarray
    gpu_energy_j: np.ndarray
    cpu_energy_j: np.ndarray
    energy_j: np.ndarray
    peak_gpu_mem_gib: np.ndarray
    peak_host_mem_gib: np.ndarray
    allocated_gpu_mem_gib: np.ndarray
    reserved_gpu_mem_gib: np.ndarray
    tokens_per_s: np.ndarray
    feasible: np.ndarray
    phase_time_s: dict[str, np.ndarray]
    phase_gpu_energy_j: dict[str, np.ndarray]
    phase_cpu_energy_j: dict[str, np.ndarray]
    cpu_energy_estimated: bool
    cpu_energy_in_gpu_energy: bool
    profile: str
    workload: Workload
    batch: StrategyBatch
    hardware: HardwareProfile

    def __len__(self) -> int:
        return len(self.step_time_s)

    @property
    def host_share(self) -> np.ndarray:
        return host_share(self.phase_time_s, self.step_time_s)

    def reasons(self, i: int) -> list[str]:
        """Why strategy i is infeasible (empty when it is feasible)."""
        b, hw = self.batch, self.hardware
        out = _static_text(b, i, self.workload.arch)
        if b.gpus_per_node[i] > hw.gpus_per_node.value:
            out.append(f"{int(b.gpus_per_node[i])} GPUs per node asked, profile '{hw.name}' nodes have "
                       f"{int(hw.gpus_per_node.value)}")
        cap = hw.gpu.memory_gib.value
        if self.peak_gpu_mem_gib[i] > cap:
            out.append(f"needs {self.peak_gpu_mem_gib[i]:.1f} GiB of GPU memory, has {cap:.1f}")
        host = hw.host.memory_gib.value
        if self.peak_host_mem_gib[i] > host:
            out.append(f"needs {self.peak_host_mem_gib[i]:.1f} GiB of host memory per node, has {host:.1f}")
        if not out and not self.feasible[i]:
            out.append("the cost model gave no finite step time for this strategy")
        return out

    def prediction(self, i: int) -> Prediction:
        b = self.batch
        strategy = _strategy_or_none(b, i)
        phases = [
            Phase(name, float(self.phase_time_s[name][i]), float(self.phase_gpu_energy_j[name][i]),
                  float(self.phase_cpu_energy_j[name][i]))
            for name in timing.PHASES
        ]
        return Prediction(
            step_time_s=float(self.step_time_s[i]),
            gpu_energy_j=float(self.gpu_energy_j[i]),
            cpu_energy_j=float(self.cpu_energy_j[i]),
            energy_j=float(self.energy_j[i]),
            peak_gpu_mem_gib=float(self.peak_gpu_mem_gib[i]),
            peak_host_mem_gib=float(self.peak_host_mem_gib[i]),
            tokens_per_s=float(self.tokens_per_s[i]),
            feasible=bool(self.feasible[i]),
            reasons=self.reasons(i),
            cpu_energy_estimated=self.cpu_energy_estimated,
            breakdown=phases,
            profile=self.profile,
            strategy=strategy,
            cpu_energy_in_gpu_energy=self.cpu_energy_in_gpu_energy,
            allocated_gpu_mem_gib=float(self.allocated_gpu_mem_gib[i]),
            reserved_gpu_mem_gib=float(self.reserved_gpu_mem_gib[i]),
        )


def _strategy_or_none(b: StrategyBatch, i: int) -> Strategy | None:
    try:
        return b.strategy(i)
    except KeyError:  # an offload code that names no device; static reasons say so
        return None


def _static_text(b: StrategyBatch, i: int, arch: Architecture) -> list[str]:
    s = _strategy_or_none(b, i)
    return ["offload devices must be 'none' or 'cpu'"] if s is None else static_reasons(s, arch)


def static_mask(b: StrategyBatch, arch: Architecture) -> np.ndarray:
    """True where `static_reasons` refuses the strategy; the same rules, vectorised."""
    stage, sp, gpus = b.zero_stage, b.sp, b.gpus
    codes = set(OFFLOAD_NAMES.values())
    opt_cpu = b.offload_optimizer == OFFLOAD_CPU
    par_cpu = b.offload_param == OFFLOAD_CPU
    sp1 = np.maximum(sp, 1)
    nodes = b.nodes
    ratio = b.offload_ratio
    bad = (
        ~np.isin(stage, (0, 1, 2, 3))
        | ~np.isin(b.offload_optimizer, list(codes)) | ~np.isin(b.offload_param, list(codes))
        | (gpus < 1) | (sp < 1) | (b.micro_batch < 1) | (b.grad_accum < 1)
        | (gpus % sp1 != 0)
        | (arch.num_heads % sp1 != 0) | (arch.num_kv_heads % sp1 != 0)
        | ((sp > 1) & (nodes > 1) & (sp > b.gpus_per_node))
        | (opt_cpu & (stage == 0))
        | (par_cpu & (stage != 3))
        | (par_cpu & ~opt_cpu)
        | ~((ratio > 0) & (ratio <= 1))
        | ((ratio < 1) & ((stage != 3) | ~opt_cpu))
        | (b.super_offload & ((stage != 3) | ~opt_cpu))
        | (b.cpu_checkpointing & (b.checkpoint_every == 0))
        | (b.checkpoint_every < 0) | (b.checkpoint_every > arch.num_layers)
        | (b.cpu_threads_per_rank < 0)
    )
    return bad


def _as_batch(b: StrategyBatch) -> StrategyBatch:
    """Columns as numpy arrays of the right kinds (the search may hand lists or other dtypes)."""
    cols = {}
    for f in dataclasses.fields(StrategyBatch):
        v = np.asarray(getattr(b, f.name))
        if f.name in ("super_offload", "cpu_checkpointing", "overlap_comm"):
            v = v.astype(bool)
        elif f.name == "offload_ratio":
            v = v.astype(float)
        else:
            v = v.astype(np.int64)
        cols[f.name] = v
    return StrategyBatch(**cols)


@dataclass(frozen=True)
class Prepared:
    """A workload's strategies with what the time and power constants leave unchanged: parameter counts,
    each micro-step's FLOPs and bytes, the memory estimate. A fit moves only those constants, so it
    prepares each batch once (`holds_for` tells when a profile's GPU or memory figures moved after all)."""

    workload: Workload
    batch: StrategyBatch
    counts: ParamCounts
    work: flops.MicroStepWork
    memory: memory.MemoryEstimate
    gpu_spec: GpuSpec  # the profile's parts it was prepared with
    memory_spec: MemorySpec

    def holds_for(self, profile: HardwareProfile) -> bool:
        return profile.gpu is self.gpu_spec and profile.memory is self.memory_spec


def prepare(workload: Workload, batch: StrategyBatch, profile: HardwareProfile) -> Prepared:
    b = _as_batch(batch)
    counts = count_params(workload)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        work = flops.micro_step_work(workload, b.micro_batch, b.sp, b.checkpoint_every, profile.gpu.layer_elementwise,
                                     profile.gpu.vision_elementwise)
        mem = memory.estimate(workload, counts, work, b, profile)
    return Prepared(workload, b, counts, work, mem, profile.gpu, profile.memory)


def timed(prepared: Prepared, profile: HardwareProfile,
          issue_scale=None) -> tuple[timing.StepTiming, energy_mod.StepEnergy]:
    """The step timing and energy of a prepared batch on `profile` (see `timing.step_timing` for `issue_scale`)."""
    assert prepared.holds_for(profile), "prepared with another profile's GPU or memory figures"
    p = prepared
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        tm = timing.step_timing(p.workload, p.counts, p.work, p.memory, p.batch, profile, issue_scale)
        return tm, energy_mod.step_energy(tm, p.batch, profile)


def step_timing(workload: Workload, strategy: Strategy, profile: HardwareProfile) -> timing.StepTiming:
    """One strategy's step timing with the model's insides (each pass's issue and GPU time), for checks
    against measured passes (benchmarks/phase_passes.py)."""
    return timed(prepare(workload, StrategyBatch.from_strategies([strategy]), profile), profile)[0]


def predict_batch(workload: Workload, batch: StrategyBatch, profile: HardwareProfile,
                  issue_scale=None) -> BatchPrediction:
    """Time, energy, memory and feasibility of every strategy in `batch` (vectorised). `issue_scale`, one
    a strategy, puts each on a host of its own (`timing.step_timing`): measured runs, predicted together."""
    prepared = prepare(workload, batch, profile)
    b, mem = prepared.batch, prepared.memory
    assert len({len(getattr(b, f.name)) for f in dataclasses.fields(StrategyBatch)}) == 1, "ragged batch"
    tm, en = timed(prepared, profile, issue_scale)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        global_batch = b.micro_batch * b.dp * b.grad_accum
        tokens_per_s = global_batch * workload.seq_len / tm.step_time_s
    peak_gpu = mem.peak_gpu_bytes / GIB
    peak_host = mem.host_bytes_per_node / GIB
    feasible = (
        ~static_mask(b, workload.arch)
        & (b.gpus_per_node <= profile.gpus_per_node.value)
        & (peak_gpu <= profile.gpu.memory_gib.value)
        & (peak_host <= profile.host.memory_gib.value)
        & np.isfinite(tm.step_time_s) & (tm.step_time_s > 0)
    )
    return BatchPrediction(
        step_time_s=tm.step_time_s,
        gpu_energy_j=en.gpu_energy_j,
        cpu_energy_j=en.cpu_energy_j,
        energy_j=en.gpu_energy_j + en.cpu_energy_j,
        peak_gpu_mem_gib=peak_gpu,
        peak_host_mem_gib=peak_host,
        allocated_gpu_mem_gib=mem.allocated_gpu_bytes / GIB,
        reserved_gpu_mem_gib=mem.reserved_gpu_bytes / GIB,
        tokens_per_s=tokens_per_s,
        feasible=feasible,
        phase_time_s=tm.phase_time_s,
        phase_gpu_energy_j=en.phase_gpu_energy_j,
        phase_cpu_energy_j=en.phase_cpu_energy_j,
        cpu_energy_estimated=en.cpu_energy_estimated,
        cpu_energy_in_gpu_energy=en.cpu_energy_in_gpu_energy,
        profile=profile.describe(),
        workload=workload,
        batch=b,
        hardware=profile,
    )


def predict(workload: Workload, strategy: Strategy, profile: HardwareProfile) -> Prediction:
    """One strategy's prediction, with its phase breakdown."""
    return predict_batch(workload, StrategyBatch.from_strategies([strategy]), profile).prediction(0)
