"""Short real DeepSpeed steps, one for each strategy family the search can pick on one GPU.

Why: the overheads a microbenchmark cannot isolate (DeepSpeed's walk over tensors at the step, the
CPU optimizer's step inside an offloaded engine, SuperOffload's pipeline, ZeRO-3's host-serial
share) are priced from real steps or not at all. A profile that carried them from another machine
priced them wrongly on the lent H100 (its search picked SuperOffload), and one that zeroes them makes
those strategies free. So the calibration runs a few steps of each family on a small decoder, in the
one DeepSpeed worker (calibration.ds_worker: start-up paid once), at the run's thread count, and
the profile writer fits the overhead terms to them (calibration.step_fit).

Non-ZeRO-3 cases run first, and SuperOffload last: it starts CPU-optimizer processes of its own. The
steps' memory is not used (the worker's pool and heap hold what earlier cases left); the memory
shares stay carried, and say so.
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from calibration.microbench.common import BenchContext, BenchItem, Skip

MODEL = "qwen3-0.6b"  # 0.6 B parameters: an optimizer step long enough to time on the host, ~16 GiB at 2k
CPU_MODEL = "tiny-cpu"
STEP_TIMEOUT_S = 300.0
WARM_TIMEOUT_S = 900.0  # DeepSpeed's import and the CPU optimizer's first build, on a cold host


@dataclass(frozen=True)
class StepCase:
    name: str
    seq: int
    strategy: dict  # models.strategy.Strategy fields beyond one GPU, micro-batch 1


# Each informs the overheads of its family (models.fit.TIME_PARAMETERS): ZeRO-0's per-layer and per-tensor
# step, ZeRO-1/2's gradient hooks and step walk (with accumulation), the offloaded optimizer's step (ZeRO-2,
# ZeRO-3, with parameters, SuperOffload), ZeRO-3's module hooks and host-serial share; the 8k
# checkpointed step is GPU-bound (the compute efficiency). ZeRO-1 on one GPU is ZeRO-2's step. A partial
# offload prices the same terms by its fraction: its case (21 s) moved no profile's error on the H100's runs
# by more than 0.8 points when left out of both stored calibrations (docs/MEASUREMENTS.md, 2026-12-06).
CASES = (
    StepCase("z0", 2048, {"zero_stage": 0}),
    StepCase("z2-ga2", 2048, {"zero_stage": 2, "grad_accum": 2}),
    StepCase("z2-offload", 4096, {"zero_stage": 2, "offload_optimizer": "cpu"}),
    StepCase("z2-ckpt4", 8192, {"zero_stage": 2, "checkpoint_every": 4}),
    StepCase("z3", 2048, {"zero_stage": 3}),
    StepCase("z3-offload", 4096, {"zero_stage": 3, "offload_optimizer": "cpu", "checkpoint_every": 1}),
    StepCase("z3-offload-param", 4096, {"zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu",
                                        "checkpoint_every": 1, "cpu_checkpointing": True}),
    StepCase("z3-super", 4096, {"zero_stage": 3, "offload_optimizer": "cpu", "super_offload": True,
                                "checkpoint_every": 1}),
)
CPU_CASES = ("z0", "z2-offload", "z3")  # the CPU path: the worker and the records, not the numbers


def window(cpu: bool):
    """A short window: warm-up, then a few steps over at least two seconds (NVML ticks every 100 ms)."""
    from calibration.harness.window import WindowSettings

    return WindowSettings(warmup=1 if cpu else 2, steps=2 if cpu else 3, min_window_s=0.0 if cpu else 2.0,
                          max_window_s=10.0, precision=0.0, probe_every_s=0.0)


def candidate(case: StepCase, threads: int, cpu: bool):
    """The case as a run: a Candidate whose ds_config models.ds_config writes, as validate does."""
    from models.architecture import load_architecture
    from models.strategy import Strategy
    from runs.record import Candidate

    model = CPU_MODEL if cpu else MODEL
    s = Strategy(**{"gpus": 1, "gpus_per_node": 1, "micro_batch": 1, "grad_accum": 1, "checkpoint_every": 0,
                    "cpu_threads_per_rank": threads, **case.strategy})
    return Candidate.from_strategy(model, 128 if cpu else case.seq, s, load_architecture(model),
                                   f"calibration step {case.name}: {s.label()}")


def bench_step(ctx: BenchContext, case: StepCase) -> dict:
    """One case in the worker; the run record's candidate and result."""
    from calibration.harness.runner import RunSettings, harness_command

    if ctx.local_rank != 0 or ctx.world_size > 1:
        raise Skip("steps run in a one-GPU calibration (a node's calibration runs its collectives instead)")
    if ctx.worker is None:
        raise Skip("no DeepSpeed worker in this calibration")
    c = candidate(case, ctx.issue_threads, not ctx.is_cuda)
    with tempfile.TemporaryDirectory(prefix="calibration-step-") as tmp:
        config = Path(tmp) / "ds_config.json"
        config.write_text(json.dumps(c.ds_config))
        command = harness_command(c, config, Path(tmp) / "result.json", RunSettings(window=window(not ctx.is_cuda)))
        argv = command[command.index("calibration.harness.train") + 1:]
        result = ctx.worker.request({"op": "step", "argv": argv}, STEP_TIMEOUT_S)
    return {"ran": True, "case": case.name, "candidate": c.to_dict(), "result": result}


def warm_request(ctx: BenchContext) -> dict:
    """What the worker does first: on a GPU, build the optimizers' ops too (the steps need them)."""
    return {"op": "warm", "build_ops": ctx.is_cuda and ctx.cpu_adam != "torch"}


def bench_worker_ready(ctx: BenchContext) -> dict:
    """Waits for the worker's start (begun with the calibration, `warm_request`): after this item the
    host is quiet again for the benchmarks that time it."""
    if ctx.worker is None:
        return {"ran": False}
    data = ctx.worker.finish(WARM_TIMEOUT_S)
    return data if data is not None else ctx.worker.request(warm_request(ctx), WARM_TIMEOUT_S)


def worker_item() -> BenchItem:
    return BenchItem("ds_steps/worker", "ds_steps", bench_worker_ready,
                     label="DeepSpeed worker: imported, CPU optimizer built")


def items(ctx: BenchContext) -> list[BenchItem]:
    cases = [c for c in CASES if ctx.is_cuda or c.name in CPU_CASES]
    return [BenchItem(f"ds_steps/{c.name}", "ds_steps", lambda x, case=c: bench_step(x, case),
                      label=f"DeepSpeed steps, {c.name}") for c in cases]
