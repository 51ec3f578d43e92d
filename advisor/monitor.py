"""Measure a training script from inside: two lines, so `advisor recommend --validate K --script CMD`
can time and meter your own training as it runs the built-in model.

    from advisor.monitor import StepMeter

    meter = StepMeter.from_env()          # before the training loop
    for batch in data:
        ...                               # forward, backward, optimizer step
        meter.step()                      # after each optimizer step

Under the advisor (it sets ADVISOR_RESULT), the meter lets the first steps warm up, measures a
window of steps (time, NVML energy of every rank's GPU, peak memory), writes the result where the
advisor reads it, and ends the process cleanly. Run by hand, without ADVISOR_RESULT, it measures
nothing and costs nothing. Only the script knows where a step ends, so the script calls it.
Hugging Face Trainer users add `advisor.monitor.AdvisorCallback()` to the trainer's callbacks instead
(`recommend --for hf`; examples/hf_trainer.py). A launch whose processes never join in torch.distributed
is recorded as a crash: each process trained alone, which is not the candidate.

torch, and the measuring code, are imported only when the meter is active.
"""
from __future__ import annotations

import os
import sys

from calibration.harness.window import RESULT_ENV, WindowSettings


class StepMeter:
    """Call `step()` after every optimizer step; it returns True once the window is measured."""

    def __init__(self, result_path: str | None, window: WindowSettings = WindowSettings(),
                 exit_when_done: bool = True):
        self.result_path = result_path
        self.exit_when_done = exit_when_done
        self._window = None
        if result_path:
            self._start(window)

    @classmethod
    def from_env(cls, exit_when_done: bool = True) -> "StepMeter":
        return cls(os.environ.get(RESULT_ENV), WindowSettings.from_env(), exit_when_done=exit_when_done)

    @property
    def active(self) -> bool:
        return self._window is not None

    def _start(self, window: WindowSettings) -> None:
        import torch

        from calibration.harness.measure import HostMemoryPeak, energy_monitor, process_tree_cpu_s
        from calibration.harness.window import MeasuredWindow, torch_agree

        cuda = torch.cuda.is_available()
        self._local_rank = int(os.environ.get("LOCAL_RANK", 0))
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        self._host_memory = HostMemoryPeak()
        self._host_memory.reset()
        self._cuda = cuda
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        monitor = energy_monitor([device.index] if cuda else [], sync)
        self._window = MeasuredWindow(window, monitor, sync, torch_agree(device), process_tree_cpu_s)

    def step(self) -> bool:
        """After each optimizer step. True once measured (and, under the advisor, the process ends)."""
        if self._window is None or self._window.done:
            return self._window is not None
        if not self._window.step_done():
            return False
        self._finish()
        return True

    def _finish(self) -> None:
        import torch
        import torch.distributed as dist

        from calibration.harness.memory_cap import alloc_retries

        distributed = dist.is_available() and dist.is_initialized()
        # Without torch.distributed every process of a launch thinks itself alone: the launcher's RANK
        # says which one writes.
        rank = dist.get_rank() if distributed else int(os.environ.get("RANK", 0))
        mine = self._window.rank_summary(
            rank, self._local_rank, torch.cuda.max_memory_allocated() if self._cuda else None,
            torch.cuda.max_memory_reserved() if self._cuda else None, self._host_memory.read(), None,
            alloc_retries() if self._cuda else None)
        everyone = [mine]
        if distributed:
            everyone = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, mine)
        if rank == 0:
            from calibration.harness.measure import machine_info
            from runs.record import RunResult

            fields = self._window.result_fields(everyone)
            alone = lone_ranks_reason(len(everyone))
            if alone:
                print(f"warning: {alone}", file=sys.stderr, flush=True)
            RunResult(status="crash" if alone else "ok", reason=alone or "", **fields,
                      cpu_threads_per_rank=torch.get_num_threads(),
                      machine=machine_info("cuda" if self._cuda else "cpu")).write(self.result_path)
        if self.exit_when_done:
            if distributed:
                dist.barrier()
                dist.destroy_process_group()
            sys.exit(0)


def lone_ranks_reason(ranks_measured: int) -> str | None:
    """Why a run is not the candidate's where its launcher started more processes (WORLD_SIZE) than
    the meter measured ranks: the script never joined them in torch.distributed, so each trained a
    copy of its own, with its own data-parallel batch. None where they agree."""
    launched = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if launched == ranks_measured:
        return None
    return (f"the launcher started {launched} processes but the meter measured {ranks_measured} rank(s): the script "
            "never initialised torch.distributed (deepspeed.init_distributed(), or the Trainer's launch), so each "
            "process trained alone and this is not the candidate's run; recorded as a crash (--retry crash runs it "
            "again once fixed)")


def __getattr__(name: str):
    """`from advisor.monitor import AdvisorCallback`: a Hugging Face `TrainerCallback`, built on first
    use, so transformers stays the caller's dependency, not ours."""
    if name != "AdvisorCallback":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from transformers import TrainerCallback

    class AdvisorCallback(TrainerCallback):
        """Meters each optimizer step; stops the training once the window is measured."""

        def __init__(self):
            self.meter = StepMeter.from_env(exit_when_done=False)

        def on_step_end(self, args, state, control, **kwargs):
            if self.meter.step():
                control.should_training_stop = True
            return control

    globals()["AdvisorCallback"] = AdvisorCallback
    return AdvisorCallback
