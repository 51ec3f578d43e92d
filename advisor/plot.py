"""The Pareto plot: every evaluated feasible strategy, the front, and the pick (PNG).

matplotlib is imported here only, with the Agg backend, so a search without `--plot` never
pays for it and no display is needed.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

from advisor.search import SearchResult


def pareto_plot(result: SearchResult, path: str | Path, title: str, max_slowdown: float | None = None) -> Path:
    """Time against energy for the whole run; a dashed line marks the slowdown the pick may take."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = result.candidates
    hours = c.run_time_s / 3600.0
    kwh = c.run_energy_j / 3.6e6
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    ax.scatter(hours[c.feasible], kwh[c.feasible], s=10, color="0.75", label="feasible strategies")
    front = result.pareto
    ax.plot(hours[front], kwh[front], "o-", color="tab:blue", markersize=5, label="Pareto front")
    ax.scatter([hours[result.pick]], [kwh[result.pick]], s=160, marker="*", color="tab:red", zorder=5,
               label=f"pick: {c.strategies[result.pick].label()}")
    if max_slowdown is not None:
        limit = hours[front].min() * (1 + max_slowdown)
        ax.axvline(limit, color="tab:red", linestyle="--", linewidth=1,
                   label=f"fastest + {max_slowdown:.0%}")
    ax.set_xlabel("run time (h)")
    ax.set_ylabel("run energy, GPU + CPU (kWh)")
    ax.set_title(textwrap.fill(title, 100), fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
