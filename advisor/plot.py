"""The Pareto plot: every evaluated feasible strategy, the front, and the pick (PNG).

matplotlib is imported here only, with the Agg backend, so a search without `--plot` never
pays for it and no display is needed. A plot replaces its file whole (advisor.outputs).
"""
from __future__ import annotations

import textwrap
from pathlib import Path

from advisor.outputs import replacing
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
    with replacing(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return path


def accuracy_plot(report, path: str | Path) -> Path:
    """Predicted against measured step time, GPU energy and allocated memory, log-log, by family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    panels = (("time", "step time (s)", lambda c: (c.run.step_time_s, c.step_time_s)),
              ("energy", "GPU energy per step (J)", lambda c: (c.run.gpu_energy_j, c.gpu_energy_j)),
              ("memory", "GPU memory allocated (GiB)", lambda c: (c.run.peak_gpu_mem_gib, c.allocated_gpu_mem_gib)))
    families = sorted({c.run.family for c in report.compared})
    colors = {f: plt.cm.tab10(i % 10) for i, f in enumerate(families)}
    fig, axes = plt.subplots(1, 3, figsize=(15, 5), dpi=110)
    overall = report.families[0]
    for ax, (metric, title, pick) in zip(axes, panels):
        points = [(c.run.family, *pick(c)) for c in report.compared if pick(c)[0]]
        for family in families:
            xs = [m for f, m, p in points if f == family]
            ys = [p for f, m, p in points if f == family]
            if xs:
                ax.scatter(xs, ys, s=22, color=colors[family], label=family)
        if points:
            lo = min(min(m, p) for _, m, p in points) * 0.8
            hi = max(max(m, p) for _, m, p in points) * 1.25
            ax.plot([lo, hi], [lo, hi], color="0.3", linewidth=1)
            for band, style in ((0.05, ":"), (0.15, "--")):
                ax.plot([lo, hi], [lo * (1 + band), hi * (1 + band)], style, color="0.6", linewidth=0.8)
                ax.plot([lo, hi], [lo * (1 - band), hi * (1 - band)], style, color="0.6", linewidth=0.8)
            ax.set_xscale("log")
            ax.set_yscale("log")
            for axis in (ax.xaxis, ax.yaxis):  # minor labels collide on short ranges
                axis.set_minor_formatter(NullFormatter())
        stats = getattr(overall, metric)
        mape = "-" if stats.mape is None else f"{stats.mape:.1%}"
        ax.set_title(f"{title}: MAPE {mape}", fontsize=10)
        ax.set_xlabel("measured")
        ax.set_ylabel("predicted")
        ax.grid(True, alpha=0.3, which="both")
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"Predicted against measured ({report.mode}), {report.profile}; lines: equal, 5%, 15%", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    with replacing(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return path
