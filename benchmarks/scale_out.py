"""Scale-out (issue 6): predictions made before the runs against the measured runs, by GPU count,
and energy per token against GPU count for one model and context.

    python benchmarks/scale_out.py [--runs 'data/runs/*.jsonl'] [--profile h200]
                                   [--plot docs/energy-per-token-gpus.png] [--json]

Table 1 uses the prediction each run record carries, made by `advisor validate` before the run.
For `h200-x4node.jsonl` that was the h200 profile fitted to the 29 runs of `h200.jsonl` (one and
two GPUs, another machine), so its rows are out-of-sample errors; `h200.jsonl`'s were made with
gh200 or the unfitted calibration, before the fit existed. Leave-one-out errors by GPU count are in benchmarks/accuracy.py.
Table 2 follows TinyLlama-1.1B at 32k tokens, ZeRO-3 with checkpointing and Ulysses sp = GPUs (the
same tokens per step on every count; sp 8 is not possible with its 4 KV heads): measured, and
predicted by `--profile` (the shipped profile, refitted to these runs: in-sample).
"""
from __future__ import annotations

import argparse
import glob
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from advisor.accuracy import Compared, error_stats  # noqa: E402
from runs.jsonl import read_records  # noqa: E402
from runs.measured import to_measured_run  # noqa: E402
from models.architecture import load_architecture  # noqa: E402
from models.predict import predict  # noqa: E402
from models.profile import load_profile  # noqa: E402
from models.strategy import Strategy  # noqa: E402
from models.workload import Workload  # noqa: E402

SCALING_MODEL, SCALING_SEQ = "tinyllama-1.1b", 32768
SCALING_GPUS = (1, 2, 4)  # Ulysses sp must divide TinyLlama's 4 KV heads: no sp 8


def before_run_errors(records_by_file: dict[str, list]) -> dict[str, dict]:
    """Per (run file, GPU count): MAPE and worst |error| of the stored pre-run predictions."""
    groups: dict[str, list[Compared]] = {}
    for name, records in records_by_file.items():
        for r in records:
            if r.result.status != "ok" or not r.prediction or not r.candidate.strategy:
                continue
            p = r.prediction
            compared = Compared(to_measured_run(r), p["step_time_s"], p["gpu_energy_j"], p["allocated_gpu_mem_gib"])
            groups.setdefault(f"{name} | {r.candidate.strategy['gpus']}", []).append(compared)
    out = {}
    for key, members in sorted(groups.items()):
        stats = {metric: error_stats(members, metric) for metric in ("time", "energy", "memory")}
        out[key] = {m: {"n": e.n, "mape": e.mape, "max_abs": e.max_abs} for m, e in stats.items()}
    return out


def _scaling_strategy(gpus: int) -> Strategy:
    return Strategy(gpus=gpus, gpus_per_node=gpus, zero_stage=3, checkpoint_every=1, sp=gpus)


def scaling_rows(records, profile) -> list[dict]:
    """Energy per token against GPU count: measured (latest run of each count) and predicted."""
    wanted = {_scaling_strategy(n).label(): n for n in SCALING_GPUS}
    measured = {}
    for r in sorted(records, key=lambda r: r.date):
        c = r.candidate
        if (r.result.status == "ok" and c.model == SCALING_MODEL and c.seq_len == SCALING_SEQ and c.strategy
                and Strategy(**c.strategy).label() in wanted):
            measured[c.strategy["gpus"]] = r.result
    workload = Workload(load_architecture(SCALING_MODEL), SCALING_SEQ)
    rows = []
    for n in SCALING_GPUS:
        p = predict(workload, _scaling_strategy(n), profile)
        m = measured.get(n)
        rows.append({"gpus": n, "tokens": SCALING_SEQ,
                     "measured_step_s": m.step_time_s if m else None,
                     "measured_j_per_token": m.gpu_energy_j / SCALING_SEQ if m and m.gpu_energy_j else None,
                     "predicted_step_s": p.step_time_s, "predicted_j_per_token": p.gpu_energy_j / SCALING_SEQ})
    return rows


def plot(rows: list[dict], path: Path, profile_name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(10, 4), dpi=120)
    gpus = [r["gpus"] for r in rows]
    seen = [r for r in rows if r["measured_step_s"] is not None]
    ax_t.plot(gpus, [r["predicted_step_s"] for r in rows], "o--", color="tab:blue", label=f"predicted ({profile_name})")
    ax_t.plot([r["gpus"] for r in seen], [r["measured_step_s"] for r in seen], "s-", color="tab:red", label="measured")
    ax_e.plot(gpus, [1e3 * r["predicted_j_per_token"] for r in rows], "o--", color="tab:blue",
              label=f"predicted ({profile_name})")
    ax_e.plot([r["gpus"] for r in seen], [1e3 * r["measured_j_per_token"] for r in seen], "s-", color="tab:red",
              label="measured (NVML, summed over GPUs)")
    for ax, what in ((ax_t, "step time (s)"), (ax_e, "GPU energy per token (mJ)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(gpus, [str(g) for g in gpus])
        ax.set_xlabel("GPUs (Ulysses sp = GPUs)")
        ax.set_ylabel(what)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{SCALING_MODEL}, {SCALING_SEQ // 1024}k tokens a step, ZeRO-3 + checkpointing, H200",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", default=str(REPO / "data/runs/*.jsonl"), help="glob of run files")
    p.add_argument("--profile", default="h200", help="profile for the scaling predictions (default h200)")
    p.add_argument("--plot", type=Path, help="write the energy-per-token plot (PNG) here")
    p.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    args = p.parse_args(argv)
    paths = sorted(glob.glob(args.runs))
    if not paths:
        print(f"no run files match {args.runs}", file=sys.stderr)
        return 1
    by_file = {Path(path).name: read_records(path) for path in paths}
    records = [r for rs in by_file.values() for r in rs]
    errors = before_run_errors(by_file)
    profile = load_profile(args.profile)
    rows = scaling_rows(records, profile)
    if args.plot:
        plot(rows, args.plot, profile.name)
    if args.json:
        print(json.dumps({"before_run_errors": errors, "energy_per_token": rows}, indent=2))
        return 0
    print("Predictions made before each run, against the measurement, by run file and GPU count")
    print(f"{'run file | GPUs':<32} {'n':>4}  {'time MAPE':>9} {'max':>7}  {'energy MAPE':>11} {'max':>7}  "
          f"{'mem MAPE':>8} {'max':>7}")
    for key, e in errors.items():
        t, en, m = e["time"], e["energy"], e["memory"]
        print(f"{key:<32} {t['n']:>4}  {_pct(t['mape']):>9} {_pct(t['max_abs']):>7}  {_pct(en['mape']):>11} "
              f"{_pct(en['max_abs']):>7}  {_pct(m['mape']):>8} {_pct(m['max_abs']):>7}")
    print(f"\nEnergy per token against GPU count: {SCALING_MODEL}, {SCALING_SEQ} tokens, z3 ckpt sp=GPUs "
          f"(predicted with {profile.name})")
    print(f"{'GPUs':>4}  {'step s meas':>11} {'pred':>7}  {'mJ/token meas':>13} {'pred':>7}")
    for r in rows:
        ms = "-" if r["measured_step_s"] is None else f"{r['measured_step_s']:.3f}"
        me = "-" if r["measured_j_per_token"] is None else f"{1e3 * r['measured_j_per_token']:.1f}"
        print(f"{r['gpus']:>4}  {ms:>11} {r['predicted_step_s']:>7.3f}  {me:>13} {1e3 * r['predicted_j_per_token']:>7.1f}")
    if args.plot:
        print(f"\nplot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
