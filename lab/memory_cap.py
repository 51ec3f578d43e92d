"""What a step needs, not what it reserves: each setting of a sweep run uncapped, then with torch's
GPU memory pool capped at multiples of its predicted allocated peak, one case per process.

    python lab/memory_cap.py data/sweeps/NAME.jsonl --out RUNS.jsonl [--caps 1.10,1.03] [--budget-s 540]

Unconstrained, the caching allocator keeps every segment it made, and a step's reserved pool came out
1.03-1.73x its allocated peak; the advisor's feasibility adds that pool to what must fit. Under a cap
the allocator frees unused cached segments and retries instead (calibration.harness.memory_cap), so
the smallest cap at which a step runs, and what the retries cost it in time, say how much of the pool
a step needs (`benchmarks/memory_accuracy.py --need` sets it beside the model's pool). Caps are tried
from the largest down, and a cap whose outcome follows from those tried (below one that ran out of
memory, above one that ran) is skipped. Records are appended as they finish, so a rerun goes on where
it stopped.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from advisor.validate import predicted_sweep  # noqa: E402
from calibration.harness.memory_cap import ENV, UNCAPPED, cap_note, noted_factor  # noqa: E402
from calibration.harness.runner import RunSettings, run_candidate  # noqa: E402
from calibration.harness.window import WindowSettings  # noqa: E402
from runs.jsonl import append_record, read_records  # noqa: E402
from runs.record import RunRecord  # noqa: E402


def parse_caps(text: str) -> list[float]:
    """'1.10,1.03' -> [1.10, 1.03], largest first; each must be at least 1."""
    try:
        caps = sorted({float(x) for x in text.split(",") if x.strip()}, reverse=True)
    except ValueError:
        raise argparse.ArgumentTypeError(f"caps must be numbers separated by commas, got {text!r}") from None
    if not caps or caps[-1] < 1.0:
        raise argparse.ArgumentTypeError(f"caps are multiples of the allocated peak, at least 1, got {text!r}")
    return caps


def settled(factor: float, tried: list[tuple[float | None, str]]) -> bool:
    """Whether a cap's outcome follows from caps tried before: below one that ran out of memory, or
    above one that ran (a larger pool holds whatever a smaller one held)."""
    capped = [(f, status) for f, status in tried if f not in (None, UNCAPPED)]
    return any(status == "oom" and factor < f or status == "ok" and factor > f for f, status in capped)


@dataclass(frozen=True)
class CapRun:
    """One run of a cap sweep, beside its setting's uncapped run."""

    label: str
    factor: float  # x the predicted allocated peak; UNCAPPED for none
    cap_gib: float | None  # as applied (None: uncapped, out of memory, or no GPU)
    status: str
    allocated_gib: float | None
    reserved_gib: float | None
    retries: int | None
    step_time_s: float | None
    slowdown: float | None  # its step time over the uncapped run's, less one


def cap_runs(records: list[RunRecord]) -> list[CapRun]:
    """Each capped or uncapped run of `records` beside its setting's uncapped one; other records left out."""
    uncapped = {r.key: r for r in records if noted_factor(r.notes) == UNCAPPED and r.result.status == "ok"}
    rows = []
    for r in records:
        factor, base, res = noted_factor(r.notes), uncapped.get(r.key), r.result
        if factor is None:
            continue
        slowdown = (res.step_time_s / base.result.step_time_s - 1.0
                    if base is not None and res.status == "ok" and res.step_time_s else None)
        rows.append(CapRun(r.candidate.label, factor, res.machine.get("gpu_memory_cap_gib"), res.status,
                           res.peak_gpu_mem_gib, res.peak_gpu_reserved_gib, res.gpu_alloc_retries, res.step_time_s,
                           slowdown))
    return rows


def print_table(rows: list[CapRun]) -> None:
    def f(x, spec):
        return format(x, spec) if x is not None else "-".rjust(int(spec.rstrip("df").split(".")[0]))

    width = max([len(r.label) for r in rows] + [7])
    print(f"{'setting':<{width}}  {'cap':>5}  {'cap GiB':>7}  {'status':<6}  {'alloc':>6}  {'resv':>6}  "
          f"{'retries':>7}  {'step s':>7}  {'vs uncapped':>11}")
    for r in rows:
        cap = "none" if r.factor == UNCAPPED else f"{r.factor:.2f}x"
        slow = "-" if r.slowdown is None else f"{100 * r.slowdown:+.1f}%"
        print(f"{r.label:<{width}}  {cap:>5}  {f(r.cap_gib, '7.2f')}  {r.status:<6}  "
              f"{f(r.allocated_gib, '6.2f')}  {f(r.reserved_gib, '6.2f')}  {f(r.retries, '7d')}  "
              f"{f(r.step_time_s, '7.3f')}  {slow:>11}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sweep", type=Path, help="a sweep file (advisor validate --sweep's format)")
    p.add_argument("--out", type=Path, required=True, help="JSONL the records are appended to")
    p.add_argument("--caps", type=parse_caps, default=parse_caps("1.10,1.03"),
                   help="multiples of the predicted allocated peak (default 1.10,1.03)")
    p.add_argument("--profile", default="h200", help="profile whose memory model sets the caps")
    p.add_argument("--workdir", type=Path, default=Path("memory-cap-runs"))
    p.add_argument("--budget-s", type=float, default=540.0, help="start no run after this many seconds")
    p.add_argument("--timeout-s", type=float, default=240.0)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--min-window-s", type=float, default=3.0)
    args = p.parse_args(argv)
    try:
        predicted = predicted_sweep(args.sweep, args.profile)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for entry in predicted:
        if entry.prediction is None:  # the caps are multiples of the prediction
            print(f"error: {entry.candidate.label}: {'; '.join(entry.notes)}", file=sys.stderr)
            return 2

    done = read_records(args.out) if args.out.exists() else []
    tried: dict[str, list[tuple[float | None, str]]] = {}  # per setting: (cap factor, status) of each run
    for r in done:
        tried.setdefault(r.key, []).append((noted_factor(r.notes), r.result.status))
    window = WindowSettings(steps=args.steps, min_window_s=args.min_window_s, precision=0.0)
    end = time.monotonic() + args.budget_s
    for entry in predicted:
        c = entry.candidate
        allocated, mine = entry.prediction["allocated_gpu_mem_gib"], tried.setdefault(c.key(), [])
        for factor in [UNCAPPED, *args.caps]:
            if any(f == factor for f, _ in mine) or (factor != UNCAPPED and settled(factor, mine)):
                continue
            if time.monotonic() > end:
                print(f"budget spent: {c.label} at {factor:g} not run", flush=True)
                break
            env = {} if factor == UNCAPPED else {ENV: f"{factor * allocated:.3f}"}
            settings = RunSettings(window=window, timeout_s=args.timeout_s, env=env)
            result = run_candidate(c, args.workdir / f"cap-{factor:g}", settings)
            record = RunRecord.now(c, result, entry.prediction, entry.profile, notes=[cap_note(factor)])
            append_record(args.out, record)
            done.append(record)
            mine.append((factor, result.status))
            print(f"{c.label} cap {factor:g}: {result.status} {result.step_time_s or 0:.3f} s, "
                  f"reserved {result.peak_gpu_reserved_gib or 0:.2f} GiB, retries {result.gpu_alloc_retries}", flush=True)
    rows = cap_runs(done)
    if rows:
        print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
