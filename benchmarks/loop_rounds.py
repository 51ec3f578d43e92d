"""The shipped closed loops that measured in rounds: each candidate's rounds, its regret against the
measured pick with the scatter of its lead, and how much it scattered from round to round.

    python benchmarks/loop_rounds.py [--json]

Reads `data/loops/*.measured.json` (the `--json` output of `recommend --validate K`), the loops whose
output has rounds (2026-12-02 on); the "Closed loops with rounds" table of docs/MEASUREMENTS.md comes from here.
Energy is per optimizer step, GPU and host; the scatter is the sd of the log of a candidate's rounds.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

LOOPS = Path(__file__).resolve().parent.parent / "data" / "loops"


def log_sd(values: list[float]) -> float | None:
    values = [v for v in values if v]
    return statistics.stdev(math.log(v) for v in values) if len(values) > 1 else None


def rows(loop: dict) -> list[dict]:
    out = []
    for c in loop["candidates"]:
        rounds = c.get("rounds") or []
        behind = c.get("behind_pick")
        out.append({
            "label": c["label"], "why": c["why"], "status": c["status"], "pick": c.get("is_measured_pick", False),
            "predicted_energy_j": c["energy_j"], "host_share": c["host_share"],
            "round_energy_j": [r["energy_j"] for r in rounds],
            "regret": c.get("regret"),
            "lead_stderr": None if not behind or behind["stderr_log"] is None else math.expm1(behind["stderr_log"]),
            "separated": behind["separated"] if behind else None,
            "scatter_energy": log_sd([r["energy_j"] for r in rounds]),
            "scatter_time": log_sd([r["step_time_s"] for r in rounds]),
        })
    return out


def loops() -> dict[str, list[dict]]:
    out = {}
    for path in sorted(LOOPS.glob("*.measured.json")):
        loop = json.loads(path.read_text())["validation"]
        if loop.get("rounds"):
            out[path.name.removesuffix(".measured.json")] = rows(loop)
    return out


def _pct(x: float | None, signed: bool = False) -> str:
    return "-" if x is None else format(x, "+.1%" if signed else ".1%")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    found = loops()
    if args.json:
        print(json.dumps(found, indent=1))
        return 0
    out = Console(width=max(Console().width, 170))
    for name, candidates in found.items():
        table = Table(title=name, title_justify="left")
        for col in ("", "candidate", "why", "host share", "predicted J", "rounds (J)", "regret", "lead's scatter",
                    "separated", "scatter J / s"):
            table.add_column(col, justify="left" if col in ("", "candidate", "why", "rounds (J)") else "right")
        for r in candidates:
            energies = ", ".join("-" if e is None else f"{e:.1f}" for e in r["round_energy_j"]) or r["status"]
            table.add_row("*" if r["pick"] else "", r["label"], r["why"].split(":")[0], f"{r['host_share']:.2f}",
                          f"{r['predicted_energy_j']:.1f}", energies, _pct(r["regret"], signed=True),
                          _pct(r["lead_stderr"]), {None: "-", True: "yes", False: "no"}[r["separated"]],
                          f"{_pct(r['scatter_energy'])} / {_pct(r['scatter_time'])}")
        out.print(table)
    if not found:
        print("no shipped loop measured in rounds", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
