"""Is the host probe's spread its own noise or the host drifting, and over what time?

    python lab/probe_drift.py --model qwen2.5-1.5b --seq 1024 --zero-stage 3 --checkpoint-every 1 \
        --seconds 150 --out drift.jsonl

Why: the two probes that bracket a run's window differ by 0.16 in log (sd over 223 shipped runs),
the runs of one lease by 0.12, and a host-bound step follows them at about three quarters of the
slope. Two probes a window apart cannot tell the probe's own noise from the host's drift; a probe
taken again and again beside the steps it stands for can. In one process (one case a process, as
every run), for `--seconds`, this alternates a probe as the harness takes it (its ISSUE_PROBE_ROUNDS
rounds, each kept) with `--steps` host-bound steps of a real DeepSpeed engine built as the harness
builds it; each block is appended to `--out` as it finishes, with each step's wall and main-thread
CPU seconds and the CPU time the hypervisor stole. `--meter` runs a side meter beside it: a second process timing a
fixed pure-Python chunk, binned every 0.1 s, which shares neither the step's interpreter nor its GPU.
`--summary FILE` prints what the blocks say (`drift_summary`): each series' spread, the part of it
that changes from one block to the next (noise) and the part that persists (drift), how the steps
follow the probe smoothed over 1 to 30 blocks, and how a window of about 10 s is read from the probes
right before and after it (as the harness takes them), from the probes within it, and from the side
meter within it.

`--pin-cycle N` asks whether a host-bound step's speed depends on which vCPU its main thread runs on
(the same step ran up to a quarter apart in three processes on one machine, at the same probe): each
block pins the main thread (probe and steps) to one of the process's CPUs, every CPU once a cycle in a
shuffled order with one unpinned block among them, for N cycles. The summary then splits the blocks'
steps into what stays with a CPU from cycle to cycle and what does not (`placement_summary`).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SMOOTHING_BLOCKS = (1, 3, 10, 30)
WINDOW_S = 10.0  # about a harness window of a host-bound step (its --min-window-s and warm-up)
METER_BIN_S = 0.1
METER_CHUNK = 20_000  # iterations of pure Python a chunk: about 1 ms on a lent H200 host


def host_meter(path: str, stop) -> None:
    """A second process's pure-Python speed, binned every METER_BIN_S until `stop` is set: whether
    the host's speed can be read beside a window without touching the step (no shared interpreter,
    no GPU)."""
    with open(path, "a") as f:
        while not stop.is_set():
            bin_start, chunks, busy_s = time.time(), 0, 0.0
            while time.time() - bin_start < METER_BIN_S:
                t0 = time.perf_counter()
                total = 0
                for i in range(METER_CHUNK):
                    total += i
                busy_s += time.perf_counter() - t0
                chunks += 1
            f.write(json.dumps({"unix_s": round(bin_start, 3), "us_per_chunk": busy_s / chunks * 1e6}) + "\n")
            f.flush()


@dataclass(frozen=True)
class SeriesSpread:
    """One log series over the blocks: its sd, the part that changes block to block and what persists."""

    name: str
    blocks: int
    median: float
    sd_log: float
    noise_sd_log: float  # sd of consecutive differences / sqrt 2: what does not persist one block
    drift_sd_log: float  # sqrt(sd^2 - noise^2), 0 where noise explains it all
    lag1_autocorrelation: float


@dataclass(frozen=True)
class Following:
    """The step's log against the probe's, both smoothed over `blocks` consecutive blocks."""

    blocks: int
    slope: float
    correlation: float


def spread(name: str, values: list[float]) -> SeriesSpread:
    logs = [math.log(v) for v in values]
    n = len(logs)
    if n < 3:
        raise ValueError(f"{name}: {n} blocks, need 3 or more")
    mean = statistics.fmean(logs)
    sd = statistics.pstdev(logs)
    diffs = [b - a for a, b in zip(logs, logs[1:])]
    noise = math.sqrt(statistics.fmean(d * d for d in diffs) / 2)
    centred = [x - mean for x in logs]
    denominator = sum(c * c for c in centred)
    lag1 = sum(a * b for a, b in zip(centred, centred[1:])) / denominator if denominator else 0.0
    return SeriesSpread(name, n, statistics.median(values), sd, noise, math.sqrt(max(sd * sd - noise * noise, 0.0)), lag1)


def _smoothed(logs: list[float], blocks: int) -> list[float]:
    """Means of consecutive, non-overlapping runs of `blocks` (a trailing part run is dropped)."""
    return [statistics.fmean(logs[i:i + blocks]) for i in range(0, len(logs) - blocks + 1, blocks)]


def following(probe_us: list[float], step_s: list[float], blocks: int) -> Following | None:
    """Least-squares slope and correlation of the smoothed log step on the smoothed log probe; None
    where fewer than 4 smoothed points are left or either does not vary."""
    x = _smoothed([math.log(v) for v in probe_us], blocks)
    y = _smoothed([math.log(v) for v in step_s], blocks)
    if len(x) < 4:
        return None
    mx, my = statistics.fmean(x), statistics.fmean(y)
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    if sxx == 0 or syy == 0:
        return None
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    return Following(blocks, sxy / sxx, sxy / math.sqrt(sxx * syy))


def meter_per_block(rows: list[dict], meter: list[dict]) -> list[float | None]:
    """The side meter's mean chunk time over each block's steps; None where no bin falls within them."""
    out = []
    for r in rows:
        start, end = r["steps_unix_s"]
        inside = [m["us_per_chunk"] for m in meter if start <= m["unix_s"] + METER_BIN_S / 2 <= end]
        out.append(statistics.fmean(inside) if inside else None)
    return out


def _fit(x: list[float], y: list[float]) -> dict:
    mx, my = statistics.fmean(x), statistics.fmean(y)
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    slope = sxy / sxx if sxx else 0.0
    resid = [b - my - slope * (a - mx) for a, b in zip(x, y)]
    return {"slope": slope, "correlation": sxy / math.sqrt(sxx * syy) if sxx and syy else 0.0,
            "residual_sd_log": statistics.pstdev(resid)}


def window_reading(rows: list[dict], meter_us: list[float | None] | None = None) -> dict | None:
    """A window of about WINDOW_S of consecutive blocks, slid over the case: how well its mean step is
    read from the probes right before and after it (as the harness takes them), from the probes taken
    within it (which a real window cannot hold), and from the side meter within it."""
    if len(rows) < 3:
        return None
    block_s = (rows[-1]["t_s"] - rows[0]["t_s"]) / (len(rows) - 1)
    w = max(2, round(WINDOW_S / block_s)) if block_s > 0 else 2
    probe = [math.log(statistics.median(r["probe_rounds_us"])) for r in rows]
    y, bracket, within, metered = [], [], [], []
    for s in range(1, len(rows) - w):
        y.append(math.log(statistics.fmean(x for r in rows[s:s + w] for x in r["step_s"])))
        bracket.append((probe[s - 1] + probe[s + w]) / 2)
        within.append(statistics.fmean(probe[s:s + w]))
        m = [v for v in (meter_us or [])[s:s + w] if v is not None]
        metered.append(math.log(statistics.fmean(m)) if m else None)
    if len(y) < 4:
        return None
    out = {"window_blocks": w, "windows": len(y), "window_sd_log": statistics.pstdev(y),
           "bracketing_probes": _fit(bracket, y), "probes_within": _fit(within, y)}
    kept = [(m, v) for m, v in zip(metered, y) if m is not None]
    if len(kept) >= 4:
        out["side_meter_within"] = _fit([m for m, _ in kept], [v for _, v in kept])
    return out


def thread_cpu() -> int | None:
    """The CPU the calling thread last ran on (field 39 of /proc/thread-self/stat); None where not Linux."""
    try:
        stat = Path("/proc/thread-self/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[36])


def cpu_siblings(cpus: list[int]) -> dict[int, str]:
    """Each CPU's hyperthread siblings as the kernel lists them ("3,11"); absent where not readable."""
    out = {}
    for cpu in cpus:
        try:
            out[cpu] = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip()
        except OSError:
            pass
    return out


def pin_plan(cpus: list[int], cycles: int, seed: int = 0) -> list[tuple[int, int | None]]:
    """(cycle, CPU to pin the main thread to, None: unpinned) for each block: every CPU once a cycle and
    one unpinned block, shuffled, so a CPU's blocks fall at different times of the case."""
    rng = random.Random(seed)
    plan = []
    for cycle in range(cycles):
        order: list[int | None] = [*cpus, None]
        rng.shuffle(order)
        plan.extend((cycle, cpu) for cpu in order)
    return plan


def _series_by_cpu(rows: list[dict], value) -> dict[int, list[tuple[int, float]]]:
    by_cpu: dict[int, list[tuple[int, float]]] = {}
    for r in rows:
        if r.get("pinned_cpu") is not None:
            by_cpu.setdefault(r["pinned_cpu"], []).append((r["cycle"], math.log(value(r))))
    return by_cpu


def _correlation(x: list[float], y: list[float]) -> float | None:
    if len(x) < 3:
        return None
    mx, my = statistics.fmean(x), statistics.fmean(y)
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / math.sqrt(sxx * syy) if sxx and syy else None


def placement_summary(rows: list[dict]) -> dict | None:
    """For a `--pin-cycle` case, per series (median step, probe): the spread of the CPUs' mean logs
    (between), the pooled spread of one CPU's blocks about its mean (within), and how the CPUs' means
    over the even cycles follow those over the odd ones (a CPU's own speed persists where this is near
    1; near 0 where the between-CPU spread is the blocks' noise). Also the unpinned blocks' mean log
    against the pinned ones', and which CPUs the unpinned main thread ran on. None without pinned blocks."""
    if not any(r.get("pinned_cpu") is not None for r in rows):
        return None
    out: dict = {"cpus": len({r["pinned_cpu"] for r in rows if r.get("pinned_cpu") is not None}),
                 "cycles": len({r["cycle"] for r in rows}), "series": []}
    for name, value in (("step wall, s", lambda r: statistics.median(r["step_s"])),
                        ("probe, us a layer", lambda r: statistics.median(r["probe_rounds_us"]))):
        by_cpu = _series_by_cpu(rows, value)
        means = {c: statistics.fmean(v for _, v in blocks) for c, blocks in by_cpu.items()}
        within = [v - means[c] for c, blocks in by_cpu.items() for _, v in blocks]
        halves = [(statistics.fmean(v for k, v in blocks if k % 2 == 0), statistics.fmean(v for k, v in blocks if k % 2))
                  for blocks in by_cpu.values()
                  if any(k % 2 == 0 for k, _ in blocks) and any(k % 2 for k, _ in blocks)]
        pinned = [v for blocks in by_cpu.values() for _, v in blocks]
        unpinned = [math.log(value(r)) for r in rows if r.get("pinned_cpu") is None]
        out["series"].append({
            "name": name,
            "between_cpus_sd_log": statistics.pstdev(means.values()) if len(means) > 1 else None,
            "within_cpu_sd_log": math.sqrt(statistics.fmean(d * d for d in within)) if within else None,
            "even_odd_cycle_correlation": _correlation([a for a, _ in halves], [b for _, b in halves]),
            "slowest_over_fastest_cpu": math.exp(max(means.values()) - min(means.values())) if means else None,
            "unpinned_over_pinned": math.exp(statistics.fmean(unpinned) - statistics.fmean(pinned)) if unpinned else None,
            "cpu_mean_log": {str(c): m for c, m in sorted(means.items())},
        })
    out["unpinned_ran_on"] = sorted({c for r in rows if r.get("pinned_cpu") is None for c in r.get("cpus_ran_on") or []
                                     if c is not None})
    return out


def drift_summary(rows: list[dict], meter: list[dict] | None = None) -> dict:
    """What a probe-drift file says (see the module's docstring); `meter`: its side meter's bins."""
    probe = [statistics.median(r["probe_rounds_us"]) for r in rows]
    first_round = [r["probe_rounds_us"][0] for r in rows]
    step = [statistics.median(r["step_s"]) for r in rows]
    cpu = [statistics.median(r["step_thread_cpu_s"]) for r in rows]
    steal = [r["steal_cpu_s"] for r in rows if r.get("steal_cpu_s") is not None]
    within = [statistics.pstdev([math.log(v) for v in r["probe_rounds_us"]]) for r in rows if len(r["probe_rounds_us"]) > 1]
    span_s = rows[-1]["t_s"] - rows[0]["t_s"] if rows else 0.0
    return {
        "blocks": len(rows),
        "span_s": span_s,
        "series": [asdict(spread(n, v)) for n, v in (("probe (median of its rounds), us a layer", probe),
                                                     ("probe's first round alone, us a layer", first_round),
                                                     ("step wall, s", step), ("step main-thread CPU, s", cpu))],
        "probe_rounds_sd_log_within_a_probe": statistics.fmean(within) if within else None,
        "steal_cpu_s_per_block": statistics.fmean(steal) if steal else None,
        "step_follows_probe": [asdict(f) for b in SMOOTHING_BLOCKS if (f := following(probe, step, b))],
        "window": window_reading(rows, meter_per_block(rows, meter) if meter else None),
        "placement": placement_summary(rows),
    }


def print_summary(summary: dict) -> None:
    print(f"{summary['blocks']} blocks over {summary['span_s']:.0f} s; probe rounds' sd within one probe "
          f"{summary['probe_rounds_sd_log_within_a_probe']:.3f} (log); steal "
          f"{summary['steal_cpu_s_per_block'] if summary['steal_cpu_s_per_block'] is not None else 'not read'} CPU s a block")
    print(f"{'series':45s} {'median':>9s} {'sd':>6s} {'noise':>6s} {'drift':>6s} {'lag-1':>6s}")
    for s in summary["series"]:
        print(f"{s['name']:45s} {s['median']:9.4g} {s['sd_log']:6.3f} {s['noise_sd_log']:6.3f} "
              f"{s['drift_sd_log']:6.3f} {s['lag1_autocorrelation']:6.2f}")
    print(f"{'step on probe, smoothed over blocks':45s} {'slope':>9s} {'corr':>6s}")
    for f in summary["step_follows_probe"]:
        print(f"{f['blocks']:45d} {f['slope']:9.2f} {f['correlation']:6.2f}")
    window = summary["window"]
    if window:
        print(f"a window of {window['window_blocks']} blocks ({window['windows']} slid over the case; its mean step's sd "
              f"{window['window_sd_log']:.3f} in log), read from:")
        for key, name in (("bracketing_probes", "the probes right before and after it"),
                          ("probes_within", "the probes within it"), ("side_meter_within", "the side meter within it")):
            if key in window:
                r = window[key]
                print(f"  {name:43s} slope {r['slope']:5.2f} corr {r['correlation']:5.2f} "
                      f"residual sd {r['residual_sd_log']:.3f}")
    placement = summary.get("placement")
    if placement:
        print(f"main thread pinned to each of {placement['cpus']} CPUs in {placement['cycles']} cycles "
              f"(unpinned, it ran on CPUs {placement['unpinned_ran_on']}):")
        print(f"{'series':20s} {'between':>8s} {'within':>7s} {'even~odd':>9s} {'slow/fast':>10s} {'unpinned':>9s}")
        for p in placement["series"]:
            corr = p["even_odd_cycle_correlation"]
            print(f"{p['name']:20s} {p['between_cpus_sd_log'] or 0:8.3f} {p['within_cpu_sd_log'] or 0:7.3f} "
                  f"{'n/a' if corr is None else f'{corr:.2f}':>9s} {p['slowest_over_fastest_cpu']:10.2f} "
                  f"{p['unpinned_over_pinned'] or float('nan'):9.2f}")


def _engine(args, device):
    """A DeepSpeed engine and batch built as the harness builds them (calibration/harness/train.py)."""
    import deepspeed
    import torch

    from calibration.harness.data import make_batch
    from calibration.harness.model import Checkpointing, Transformer
    from calibration.harness.train import _dtype, prepare_config
    from models.architecture import load_architecture
    from models.ds_config import to_ds_config
    from models.strategy import Strategy
    from models.workload import Workload

    arch = load_architecture(args.model)
    strategy = Strategy(zero_stage=args.zero_stage, checkpoint_every=args.checkpoint_every)
    cfg, _ = prepare_config(to_ds_config(strategy, arch), device.type)
    deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo")
    checkpointing = Checkpointing()
    if args.checkpoint_every:
        deepspeed.checkpointing.configure(None, deepspeed_config=cfg)
        checkpointing = Checkpointing(args.checkpoint_every, deepspeed.checkpointing.checkpoint)
    dtype = _dtype(cfg)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        if args.zero_stage == 3:
            with deepspeed.zero.Init(config_dict_or_path=cfg):
                model = Transformer(arch, None, checkpointing)
        else:
            with device:
                model = Transformer(arch, None, checkpointing)
    finally:
        torch.set_default_dtype(default_dtype)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=cfg)
    batch = make_batch(Workload(arch, args.seq), 1, 1, 0, 0, device, dtype)
    return engine, batch


def run(args) -> int:
    import torch

    from calibration.harness.host_noise import steal_cpu_s
    from calibration.microbench.cpu import ISSUE_PROBE_ROUNDS, issue_rounds_us_per_layer

    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", "29531")):
        os.environ.setdefault(key, value)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    engine, batch = _engine(args, device)

    def step():
        loss = engine(**batch.as_kwargs())
        engine.backward(loss)
        engine.step()
        sync()

    for _ in range(args.warmup):
        step()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    case = {"model": args.model, "seq": args.seq, "zero_stage": args.zero_stage, "checkpoint_every": args.checkpoint_every,
            "threads": torch.get_num_threads(), "device": torch.cuda.get_device_name(0) if cuda else "cpu"}
    meter = None
    if args.meter:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        stop_meter = context.Event()
        meter = context.Process(target=host_meter, args=(str(meter_path(out)), stop_meter), daemon=True)
        meter.start()
    all_cpus = sorted(os.sched_getaffinity(0))
    if args.pin_cycle:
        case["cpu_siblings"] = cpu_siblings(all_cpus)
    plan = iter(pin_plan(all_cpus, args.pin_cycle, seed=os.getpid()) if args.pin_cycle else [])
    start = time.perf_counter()
    blocks = 0
    while time.perf_counter() - start < args.seconds:
        pinning = {}
        if args.pin_cycle:
            cycle, cpu = next(plan, (None, None))
            if cycle is None:
                break
            os.sched_setaffinity(0, {cpu} if cpu is not None else all_cpus)  # 0: this thread alone
            pinning = {"cycle": cycle, "pinned_cpu": cpu}
        t_s = time.perf_counter() - start
        steal_before = steal_cpu_s()
        rounds = issue_rounds_us_per_layer(device, sync, ISSUE_PROBE_ROUNDS)
        walls, cpus, ran_on, steps_start = [], [], [], time.time()
        for _ in range(args.steps):
            w0, c0 = time.perf_counter(), time.thread_time()
            step()
            walls.append(time.perf_counter() - w0)
            cpus.append(time.thread_time() - c0)
            ran_on.append(thread_cpu())
        steal_after = steal_cpu_s()
        if pinning:
            pinning["cpus_ran_on"] = ran_on
        row = {**case, **pinning, "block": blocks, "t_s": round(t_s, 3), "unix_s": round(time.time(), 2), "probe_rounds_us": rounds, "step_s": walls,
               "step_thread_cpu_s": cpus,
               "steps_unix_s": [round(steps_start, 3), round(time.time(), 3)],
               "steal_cpu_s": None if steal_before is None or steal_after is None else steal_after - steal_before}
        with out.open("a") as f:  # a block at a time: an interrupted case keeps what it measured
            f.write(json.dumps(row) + "\n")
        blocks += 1
    if meter is not None:
        stop_meter.set()
        meter.join(timeout=10)
    print(f"{blocks} blocks written to {out}")
    return 0


def meter_path(out: Path) -> Path:
    return out.with_name(out.stem + ".meter.jsonl")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen2.5-1.5b")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--zero-stage", type=int, default=3, choices=(0, 1, 2, 3))
    p.add_argument("--checkpoint-every", type=int, default=1)
    p.add_argument("--steps", type=int, default=2, help="steps between two probes")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seconds", type=float, default=150)
    p.add_argument("--out", help="append the blocks here (JSON lines)")
    p.add_argument("--meter", action="store_true",
                   help="also run the side meter (another process's pure-Python speed) into OUT's .meter.jsonl")
    p.add_argument("--pin-cycle", type=int, default=0, metavar="N",
                   help="pin the main thread to each of the process's CPUs in turn, N shuffled cycles with one "
                        "unpinned block each (ends at N cycles or --seconds)")
    p.add_argument("--summary", metavar="FILE", help="print what a drift file says, and exit")
    p.add_argument("--json", action="store_true", help="with --summary: the summary as JSON")
    args = p.parse_args(argv)
    if args.pin_cycle < 0:
        p.error(f"--pin-cycle {args.pin_cycle}: a number of cycles, 0 or more")
    if args.summary:
        try:
            path = Path(args.summary)
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            bins = meter_path(path)
            meter = [json.loads(line) for line in bins.read_text().splitlines() if line.strip()] if bins.exists() else None
            summary = drift_summary(rows, meter)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"probe_drift: {args.summary}: {exc}", file=sys.stderr)
            return 2
        print(json.dumps(summary, indent=1)) if args.json else print_summary(summary)
        return 0
    if not args.out:
        p.error("--out is needed to measure (or --summary FILE to read one)")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
