"""The real-run harness: train the validation model with DeepSpeed for a few steps and measure them.

    torchrun --nproc-per-node N -m calibration.harness.train --model PRESET_OR_JSON --seq 4096 \\
        --ds-config ds.json --warmup 2 --steps 3 --out result.json [--images N | --frames N] \\
        [--freeze-vision] [--sp K] [--checkpoint-every K]

The optimizer is the ds_config's: DeepSpeed builds FusedAdam on the GPU and DeepSpeedCPUAdam
when the optimizer is offloaded; on a machine without a GPU the harness sets `torch_adam: true`
(and fp32) and says so in `config_adjustments`. Every rank measures its own GPU over the same
window; rank 0 writes the JSON result. A rank that fails writes `OUT.rankR.error.json` and exits
at once (its peers are stopped by torchrun) so that the runner can tell OOM from a crash.
The `__main__` guard matters: SuperOffload spawns CPU-optimizer workers that re-import this module.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

from calibration.harness.measure import HostMemoryPeak
from calibration.harness.shared_host_memory import SharedHostMemory
from calibration.harness.window import WindowSettings
from runs.record import MEMORY_TRACE_ADJUSTMENT, SHARED_PROCESS_ADJUSTMENT, RunResult

GIB = 2**30


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m calibration.harness.train", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="preset name or path of a Hugging Face config.json")
    p.add_argument("--seq", type=int, required=True, help="context length per sample, vision tokens included")
    p.add_argument("--ds-config", required=True, help="DeepSpeed config JSON file")
    w = WindowSettings()
    p.add_argument("--warmup", type=int, default=w.warmup, help="steps run before the measured window")
    p.add_argument("--steps", type=int, default=w.steps, help="measured optimizer steps (at least)")
    p.add_argument("--min-window-s", type=float, default=w.min_window_s,
                   help="run more steps until the window is this long (NVML's counter ticks every ~100 ms)")
    p.add_argument("--max-steps", type=int, default=w.max_steps, help="cap on measured steps for fast configs")
    p.add_argument("--precision", type=float, default=w.precision,
                   help="run more steps until the mean step time's relative standard error is this small")
    p.add_argument("--max-window-s", type=float, default=w.max_window_s,
                   help="no more steps for precision after this long")
    p.add_argument("--probe-every-s", type=float, default=w.probe_every_s,
                   help="probe the host between steps this often within the window, on no step's clock (0: never)")
    p.add_argument("--out", required=True, help="result JSON path (written by rank 0)")
    vision = p.add_mutually_exclusive_group()
    vision.add_argument("--images", type=int, default=0, help="images per sample")
    vision.add_argument("--frames", type=int, default=0, help="video frames per sample")
    p.add_argument("--image-size", type=int, default=None, help="pixels per side (the preset's by default)")
    p.add_argument("--freeze-vision", action="store_true", help="freeze the vision encoder (projector trains)")
    p.add_argument("--loss-dtype", choices=("fp32", "bf16"), default="fp32",
                   help="cross-entropy dtype: fp32 casts the logits first, as Hugging Face does")
    p.add_argument("--sp", type=int, default=None,
                   help="Ulysses degree (default: ds_config's sequence_parallel_size, else 1)")
    p.add_argument("--checkpoint-every", type=int, default=None,
                   help="checkpoint every k-th block (0 none, 1 all; default: from the ds_config's "
                        "activation_checkpointing.number_checkpoints, as models.ds_config writes it)")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def prepare_config(cfg: dict, device_kind: str) -> tuple[dict, list[str]]:
    """The ds_config as run, and what was changed so that it runs on this device."""
    cfg, changes = json.loads(json.dumps(cfg)), []
    if "optimizer" not in cfg:
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-4}}
        changes.append("added optimizer AdamW lr=1e-4 (the ds_config had none)")
    if device_kind == "cpu":
        params = cfg["optimizer"].setdefault("params", {})
        if not params.get("torch_adam"):
            params["torch_adam"] = True
            changes.append("optimizer.params.torch_adam=true (no GPU: FusedAdam needs CUDA)")
        for half in ("bf16", "fp16"):
            if cfg.get(half, {}).get("enabled"):
                cfg[half]["enabled"] = False
                changes.append(f"{half} disabled (CPU run in fp32)")
    return cfg, changes


def _dtype(cfg: dict):
    import torch

    if cfg.get("bf16", {}).get("enabled"):
        return torch.bfloat16
    if cfg.get("fp16", {}).get("enabled"):
        return torch.float16
    return torch.float32


class Timeline:
    """Seconds since this process started (or, in a process that runs several, since this run began) at
    each named point: where a run's start-up goes."""

    def __init__(self, since_now: bool = False):
        import psutil

        self._created = time.time() if since_now else psutil.Process().create_time()
        self.marks: dict[str, float] = {}
        self.mark("main")

    def mark(self, name: str) -> None:
        self.marks[name] = round(time.time() - self._created, 2)


def train(args: argparse.Namespace, host_memory: HostMemoryPeak, timeline: Timeline,
          own_process: bool = True) -> RunResult | None:
    """Run warm-up and measured steps; rank 0 gets the combined result, other ranks None. `own_process`
    False: one of several runs in one process (calibration.ds_worker), whose memory peaks are marked
    as not the run's own (runs.record.SHARED_PROCESS_ADJUSTMENT)."""
    import deepspeed
    import torch
    from deepspeed import comm as dist

    from calibration.harness import host_probe, memory_cap, memory_trace, phase_trace, step_profile, zero3_trace
    from calibration.harness.data import make_batch
    from calibration.harness.measure import energy_monitor, machine_info, process_tree_cpu_s
    from calibration.harness.window import MeasuredWindow, torch_agree
    from calibration.harness.model import Checkpointing, Transformer
    from models.architecture import load_architecture
    from models.ds_config import parse_ds_config
    from models.workload import Workload

    timeline.mark("imported")
    cuda = torch.cuda.is_available()
    device_kind = "cuda" if cuda else "cpu"
    with open(args.ds_config) as f:
        cfg, adjustments = prepare_config(json.load(f), device_kind)
    if not own_process:
        adjustments.append(SHARED_PROCESS_ADJUSTMENT)
    arch = load_architecture(args.model)
    if args.freeze_vision and arch.vision is None:
        raise ValueError(f"--freeze-vision: model '{arch.name}' has no vision encoder")
    workload = Workload(arch, args.seq, images=args.images, frames=args.frames, image_size=args.image_size,
                        train_vision=arch.vision is not None and not args.freeze_vision, loss_dtype=args.loss_dtype)

    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local_rank)
        if memory_cap.apply(local_rank) is not None:
            adjustments.append(f"GPU memory pool capped ({memory_cap.ENV}): its reserved peak is not the run's own")
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    timeline.mark("distributed")
    host_baseline = host_memory.sample()  # torch, CUDA and NCCL resident before any model state
    offloads = cfg.get("zero_optimization", {}).get("offload_optimizer", {}).get("device") == "cpu"
    dist.barrier()  # every rank probes at once, contending as in training
    probes = [None] * world
    dist.all_gather_object(probes, host_probe.probe(device, sync, offloads).to_dict())
    timeline.mark("probed")

    sp = args.sp or int(cfg.get("sequence_parallel_size", 1))
    mpu, attention_wrapper, sp_rank = None, None, 0
    if sp > 1:
        from deepspeed.runtime.sequence_parallel import parallel_state_sp as mpu
        from deepspeed.sequence.layer import DistributedAttention

        mpu.initialize_sequence_parallel(sp)
        sp_group, sp_rank = mpu.get_sequence_parallel_group(), mpu.get_sequence_parallel_rank()
        attention_wrapper = lambda core: DistributedAttention(core, sp_group, scatter_idx=2, gather_idx=1)  # noqa: E731
    dp_rank = rank // sp  # parallel_state_sp makes each sp group a contiguous range of ranks

    every = args.checkpoint_every
    if every is None:  # the config's own spacing, read as models.ds_config writes it
        every = parse_ds_config(cfg, arch).fields["checkpoint_every"]
    checkpointing = Checkpointing()
    if every:
        deepspeed.checkpointing.configure(mpu, deepspeed_config=cfg)
        checkpointing = Checkpointing(every, deepspeed.checkpointing.checkpoint)

    dtype = _dtype(cfg)
    stage = int(cfg.get("zero_optimization", {}).get("stage", 0))
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # build in the training dtype: no fp32 copy on the way
    try:
        if stage == 3:  # partition while building, as a real 7B-70B run must
            group = mpu.get_sequence_data_parallel_group() if mpu else None
            # dtype comes from the config: zero.Init mis-parses an explicit dtype on a CPU accelerator
            with deepspeed.zero.Init(config_dict_or_path=cfg, data_parallel_group=group):
                model = Transformer(arch, args.image_size, checkpointing, attention_wrapper, args.loss_dtype)
        else:
            with device:
                model = Transformer(arch, args.image_size, checkpointing, attention_wrapper, args.loss_dtype)
    finally:
        torch.set_default_dtype(default_dtype)
    if args.freeze_vision:
        model.freeze_vision_encoder()
    timeline.mark("built")

    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=[p for p in model.parameters() if p.requires_grad], config=cfg, mpu=mpu
    )
    timeline.mark("initialized")
    coordinator = zero3_trace.Zero3TraceWatch(engine)
    micro_batch, grad_accum = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    batch = make_batch(workload, micro_batch, sp, sp_rank, dp_rank, device, dtype)
    # Peaks below are of training (warm-up and measured steps), not of start-up transients.
    init_peak, host_init_peak = (torch.cuda.max_memory_allocated() if cuda else None), host_memory.read()
    # The pool DeepSpeed's start-up leaves behind (its flattening copies' segments): a floor under
    # the step's reserved peak that no share of the step's allocations follows (docs/MEASUREMENTS.md).
    init_reserved = torch.cuda.memory_reserved() if cuda else None
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    host_memory.reset()
    shared_host = SharedHostMemory()
    shared_host.start()
    if not host_memory.marks_reset:
        adjustments.append("host memory peak includes start-up: the kernel's high-water marks could not be reset")

    def step(mark=lambda: None):
        """One optimizer step; `mark()` before each pass and after the last (phase_trace)."""
        for _ in range(grad_accum):
            mark()
            loss = engine(**batch.as_kwargs())
            mark()
            engine.backward(loss)
            mark()
            engine.step()
        mark()
        return loss.item()

    traced = cuda and memory_trace.wanted()
    if traced:
        trace_baseline = memory_trace.start()
        adjustments.append(MEMORY_TRACE_ADJUSTMENT)
    monitor = energy_monitor([local_rank] if cuda else [], sync)
    settings = WindowSettings(warmup=args.warmup, steps=args.steps, min_window_s=args.min_window_s,
                              max_steps=args.max_steps, precision=args.precision, max_window_s=args.max_window_s,
                              probe_every_s=args.probe_every_s)
    issue_at_window = []  # the host's issue time right before the window: the probe before the model is far earlier

    def probe_before_window():
        issue_at_window.append(host_probe.reprobe_issue(device, sync))
        coordinator.start()

    window = MeasuredWindow(settings, monitor, sync, torch_agree(device), process_tree_cpu_s,
                            before_window=probe_before_window,
                            between_steps=lambda: host_probe.issue_between_steps(device, sync))
    losses = []
    while True:
        losses.append(step())
        if len(losses) == args.warmup:
            timeline.mark("warmed_up")
        if window.step_done():
            break
    coordinator_counts = coordinator.stop()
    timeline.mark("measured")
    # Host peaks before the trace's summary is written: replaying the snapshot holds host memory too.
    host_peak, shared_peak = host_memory.read(), shared_host.stop()
    if traced:
        memory_trace.write_summary(memory_trace.summary_name(rank), trace_baseline)

    mine = window.rank_summary(rank, local_rank, torch.cuda.max_memory_allocated() if cuda else None,
                               torch.cuda.max_memory_reserved() if cuda else None, host_peak, host_baseline,
                               shared_peak, memory_cap.alloc_retries() if cuda else None)
    # After the window's peaks are read (the probe allocates), before the profilers (they slow it).
    issue_after = host_probe.reprobe_issue(device, sync)
    if phase_trace.wanted():  # after the window's numbers are taken, like the profiles below
        phase_trace.trace_passes(step, sync, grad_accum, rank == 0, "phase_trace.json", cuda,
                                 read_gpu_j=lambda: (monitor.read_gpu_j() or {}).get(local_rank),
                                 agree=torch_agree(device))
    if step_profile.wanted():  # after the window's numbers are taken: the profilers cost them nothing
        step_profile.profile_steps(step, sync, rank == 0, "step_profile.json", cuda)
    gathered = [None] * world
    dist.all_gather_object(gathered, (mine, issue_after, issue_at_window[0] if issue_at_window else None,
                                      window.issue_in_window_us))
    everyone, issues_after, issues_at_window = [g[0] for g in gathered], [g[1] for g in gathered], [g[2] for g in gathered]
    issues_in_window = [g[3] for g in gathered]
    optimizer_names = (type(engine.basic_optimizer).__name__, type(engine.optimizer).__name__)
    engine.destroy()
    timeline.mark("gathered")
    if rank != 0:
        return None

    fields = window.result_fields(everyone)
    tokens = micro_batch * grad_accum * (world // sp) * args.seq
    return RunResult(
        status="ok",
        **fields,
        tokens_per_s=tokens / fields["step_time_s"],
        loss_first=losses[0],
        loss_last=losses[-1],
        cpu_threads_per_rank=torch.get_num_threads(),
        host_probe=host_probe.combine(probes, issues_after, issues_at_window, issues_in_window),
        config_adjustments=adjustments,
        timeline_s=timeline.marks,
        layout={
            "zero_stage": stage,
            "sp": sp,
            "dp": world // sp,
            "checkpoint_every": every,
            "micro_batch": micro_batch,
            "grad_accum": grad_accum,
            "dtype": str(dtype).removeprefix("torch."),
            "optimizer": optimizer_names[0],  # FusedAdam, DeepSpeedCPUAdam, AdamW (torch_adam)
            "engine_optimizer": optimizer_names[1],  # the ZeRO stage's wrapper
            "vision_groups_rank0": batch.vision_groups,
            # ZeRO-3's parameter coordinator over the window, rank 0 (zero3_trace); None for other stages
            "zero3_coordinator": coordinator_counts.per_step(fields["measured_steps"]) if coordinator_counts else None,
        },
        machine={
            **machine_info(device_kind),
            "peak_gpu_mem_init_gib": init_peak / GIB if cuda else None,
            "gpu_reserved_init_gib": init_reserved / GIB if cuda else None,
            "peak_host_mem_init_gib_rank0": host_init_peak / GIB,
        },
    )


def classify_failure(exc: BaseException) -> str:
    """oom for GPU or host allocator out-of-memory errors, crash for anything else."""
    text = f"{type(exc).__name__}: {exc}".lower()
    markers = ("outofmemoryerror", "out of memory", "can't allocate memory", "cannot allocate memory")
    if any(m in text for m in markers) or isinstance(exc, MemoryError):
        return "oom"
    return "crash"


def is_harness_error(exc: BaseException) -> bool:
    """A failure of the environment, not of the candidate: a module or file that is not there."""
    return isinstance(exc, (ImportError, FileNotFoundError, PermissionError))


def main(argv=None) -> int:
    args = parse_args(argv)
    timeline = Timeline()
    host_memory = HostMemoryPeak()
    rank = int(os.environ.get("RANK", 0))
    try:
        result = train(args, host_memory, timeline)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a recorded status
        traceback.print_exc()
        status = classify_failure(exc)
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:500]
        RunResult(status=status, reason=f"rank {rank}: {reason}",
                  harness_error=is_harness_error(exc)).write(f"{args.out}.rank{rank}.error.json")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # peers may be blocked in a collective; do not wait for a clean teardown
    if result is not None:
        result.write(args.out)
    _shutdown()
    return 0


def _shutdown() -> None:
    """Leave the process group cleanly (an abandoned NCCL communicator slows the exit)."""
    import torch.distributed as tdist

    if tdist.is_available() and tdist.is_initialized():
        tdist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
