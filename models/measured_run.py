"""A real training run that finished, as the fit and the accuracy reports see it."""
from __future__ import annotations

from dataclasses import dataclass

from models.profile import HardwareProfile
from models.strategy import Strategy
from models.workload import Workload


@dataclass(frozen=True)
class MeasuredRun:
    """One real training run that finished: what ran and what it cost per optimizer step."""

    workload: Workload
    strategy: Strategy
    step_time_s: float
    gpu_energy_j: float | None  # per step, summed over the job's GPUs; None when not measured
    peak_gpu_mem_gib: float | None  # torch.cuda.max_memory_allocated, max over ranks
    peak_gpu_reserved_gib: float | None = None  # torch.cuda.max_memory_reserved, max over ranks
    peak_host_mem_gib: float | None = None  # peak resident host memory, summed over the job's ranks
    run_id: str = ""
    label: str = ""
    host_issue_per_layer_s: float | None = None  # the run's host probe (issue time); None: not probed

    def on_its_host(self, profile: HardwareProfile) -> HardwareProfile:
        """The profile as the run saw it: on the host its probe measured; a run without a probe ran on
        the hosts the profile's issue constants describe (`overheads.issue_fitted_at_per_layer`)."""
        anchor = profile.overheads.issue_fitted_at_per_layer
        return profile.on_host(self.host_issue_per_layer_s or (anchor.value if anchor is not None else None))

    @property
    def family(self) -> str:
        """Strategy family for error reporting: ZeRO stage, offload kind, Ulysses, vision input."""
        s = self.strategy
        out = f"z{s.zero_stage}"
        if s.offload_optimizer == "cpu":
            out += "/off-param" if s.offload_param == "cpu" else ("/off-super" if s.super_offload else "/off-opt")
        out += f"/sp{s.sp}" if s.sp > 1 else ""
        return out + ("/vision" if self.workload.vision_groups else "")

    @property
    def group(self) -> tuple:
        """Runs that are alternatives to each other: same model, context, inputs and GPUs."""
        w = self.workload
        return (w.arch.name, w.seq_len, w.images, w.frames, w.image_size, w.train_vision, self.strategy.gpus)

    @property
    def tokens_per_step(self) -> int:
        return self.strategy.global_batch * self.workload.seq_len
