"""Fits from raw microbenchmark points: alpha-beta collectives and rate curves.

Pure numpy/scipy, so the profile can be rebuilt from a raw JSONL file on a laptop.
Collective conventions follow nccl-tests (and docs/CONTRACTS.md): `bytes` is the size of
the full (gathered / reduced) tensor and bus bandwidth = bus_factor * bytes / time.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import isotonic_regression, lsq_linear

COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def bus_factor(op: str, group_size: int) -> float:
    """nccl-tests bus factor: bytes each rank's link carries per byte of the full tensor."""
    if group_size < 1:
        raise ValueError(f"group size must be >= 1, got {group_size}")
    n = group_size
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    raise ValueError(f"unknown collective '{op}'; expected one of {COLLECTIVE_OPS}")


def bus_bandwidth(op: str, group_size: int, nbytes: float, time_s: float) -> float:
    """Bus bandwidth in bytes/s of one measured collective (0 for a group of one)."""
    return bus_factor(op, group_size) * nbytes / time_s


@dataclass(frozen=True)
class AlphaBetaFit:
    """time_s = alpha_s + bus_factor * bytes / bus_bandwidth_bytes_per_s.

    `bus_bandwidth_bytes_per_s` is None when the points carry no bandwidth information
    (a group of one moves nothing over a link, so only alpha is defined).
    `max_rel_error` is the largest |fit - measured| / measured over the points.
    """

    alpha_s: float
    bus_bandwidth_bytes_per_s: float | None
    max_rel_error: float
    points: int


def fit_alpha_beta(nbytes, times_s, factor: float) -> AlphaBetaFit:
    """Least squares on relative error, alpha >= 0 and 1/bandwidth >= 0.

    Times span orders of magnitude (microseconds to tens of milliseconds), so each point
    is weighted by 1/time: a plain fit would ignore the latency-bound small messages.
    """
    x = np.asarray(nbytes, dtype=float)
    t = np.asarray(times_s, dtype=float)
    if x.shape != t.shape or x.size < 2:
        raise ValueError("need at least two (bytes, time) points of equal length")
    if np.any(t <= 0) or np.any(x <= 0):
        raise ValueError("bytes and times must be positive")
    w = 1.0 / t
    if factor <= 0:
        alpha = float(np.exp(np.mean(np.log(t))))
        err = float(np.max(np.abs(alpha - t) / t))
        return AlphaBetaFit(alpha, None, err, int(x.size))
    design = np.column_stack([np.ones_like(x), factor * x]) * w[:, None]
    res = lsq_linear(design, t * w, bounds=([0.0, 0.0], [np.inf, np.inf]))
    alpha, inv_bw = (float(v) for v in res.x)
    if factor * x.max() * inv_bw < 0.01 * t.max():
        raise ValueError("fit found no bandwidth term: times do not grow with message size")
    pred = alpha + factor * x * inv_bw
    err = float(np.max(np.abs(pred - t) / t))
    return AlphaBetaFit(alpha, 1.0 / inv_bw, err, int(x.size))


@dataclass(frozen=True)
class CurvePoints:
    """A curve ready for models.profile.Curve: x strictly increasing, all values positive."""

    x: list[float]
    y: list[float]


def build_curve(x, y, *, monotone: bool = True, bins_per_decade: float = 8.0) -> CurvePoints:
    """Turn scattered (size, rate) points into a curve the cost model can interpolate.

    Points whose sizes fall in the same log bin (different shapes with similar FLOPs,
    repeats) are merged: geometric mean of x, median of y. With `monotone`, rates are made
    non-decreasing in size by isotonic regression (weighted by points per bin): larger
    operations amortise fixed costs, and a dip from wave quantisation or one noisy shape
    would otherwise make a larger GEMM look slower than a smaller one. The raw points stay
    in the raw file.
    """
    xs = np.asarray(x, dtype=float)
    ys = np.asarray(y, dtype=float)
    if xs.shape != ys.shape or xs.size == 0:
        raise ValueError("x and y must be non-empty and of equal length")
    keep = np.isfinite(xs) & np.isfinite(ys) & (xs > 0) & (ys > 0)
    xs, ys = xs[keep], ys[keep]
    if xs.size == 0:
        raise ValueError("no positive finite points to build a curve from")
    order = np.argsort(xs)
    xs, ys = xs[order], ys[order]
    bins = np.floor(np.log10(xs) * bins_per_decade).astype(int)
    bx, by, bw = [], [], []
    for b in np.unique(bins):
        sel = bins == b
        bx.append(float(np.exp(np.mean(np.log(xs[sel])))))
        by.append(float(np.median(ys[sel])))
        bw.append(float(sel.sum()))
    yv = np.asarray(by)
    if monotone and len(yv) > 1:
        yv = isotonic_regression(yv, weights=np.asarray(bw), increasing=True).x
    return CurvePoints(x=[_round(v) for v in bx], y=[_round(float(v)) for v in yv])


def _round(v: float, digits: int = 6) -> float:
    """Six significant digits: far finer than run-to-run noise, and readable JSON."""
    return float(f"{v:.{digits}g}")


def gemm_flops(m: int, n: int, k: int) -> float:
    """2*M*N*K: one multiply and one add per term."""
    return 2.0 * m * n * k


# A decoder layer: hidden size, the heads' width (q, o: Qwen3's is not the hidden size), KV width (GQA),
# FFN width, the width its q/k norms run over (q + KV where it has them, else 0) and its sandwich
# norms' (2 x hidden where it has them, else 0).
DECODER_WIDTHS = ("hidden", "attention_dim", "kv_dim", "ffn", "qk_norm_dim", "sandwich_norm_dim")
# Widths a layer may lack (0): a fit separates them only where some measured layer has them.
OPTIONAL_DECODER_WIDTHS = ("qk_norm_dim", "sandwich_norm_dim")
VISION_WIDTHS = ("hidden", "ffn")  # a ViT block: fused QKV over all heads, no KV width of its own


@dataclass(frozen=True)
class ElementwiseFit:
    """Effective bytes per token for each element of each width (`DECODER_WIDTHS`, `VISION_WIDTHS`)."""

    bytes_per_element: dict[str, float]
    worst_error: float  # the largest relative miss over the measured blocks


def decoder_row(row: dict) -> dict:
    """A measured decoder block with every width of `DECODER_WIDTHS`: blocks measured before the heads'
    width and the norms were recorded had heads as wide as the hidden size and neither kind of norm."""
    return {"attention_dim": row["hidden"], **{w: 0 for w in OPTIONAL_DECODER_WIDTHS}, **row}


def separated_decoder_widths(rows: list[dict]) -> tuple[str, ...]:
    """The widths of `DECODER_WIDTHS` that `rows` (`decoder_row`s) can tell apart: the heads' width only
    where some block's differs from its hidden size, a kind of norm only where some block has it."""
    return tuple(w for w in DECODER_WIDTHS
                 if not (w == "attention_dim" and all(r["attention_dim"] == r["hidden"] for r in rows))
                 and not (w in OPTIONAL_DECODER_WIDTHS and not any(r[w] for r in rows)))


def fit_elementwise(rows: list[dict], bandwidth: float, widths: tuple[str, ...]) -> ElementwiseFit:
    """Non-negative least squares of the blocks' measured elementwise seconds (`other_s`) against
    tokens x each of `widths` / bandwidth, each row weighted by its own time (relative errors): a
    decoder's `separated_decoder_widths`, a ViT block's `VISION_WIDTHS`."""
    if len(rows) < len(widths):
        raise ValueError(f"need at least {len(widths)} measured blocks to fit {len(widths)} widths, got {len(rows)}")
    a = np.array([[r["tokens"] * r[k] / bandwidth for k in widths] for r in rows], dtype=float)
    t = np.array([r["other_s"] for r in rows], dtype=float)
    coef = lsq_linear(a / t[:, None], np.ones(len(rows)), bounds=(0.0, np.inf)).x
    worst = float(np.max(np.abs(a @ coef / t - 1.0)))
    return ElementwiseFit(dict(zip(widths, (float(c) for c in coef))), worst_error=worst)


@dataclass(frozen=True)
class WaitDecayFit:
    hot_w: float
    decay_s: float
    gaps: int  # sleep lengths fitted


def busy_power_w(series: list[dict]) -> float:
    """The bursts' own power: that of the `wait_decay` window without gaps."""
    solid = next(s for s in series if s["gap_s"] == 0)
    return solid["gpu_energy_j"] / solid["time_s"]


def gap_power_w(series: list[dict]) -> list[tuple[float, float, float]]:
    """(gap seconds as slept, average GPU power through the gaps, the window's busy over idle seconds)
    of each window with gaps: its energy less the bursts', at the bursts' own power."""
    busy_w = busy_power_w(series)
    out = []
    for s in series:
        idle_s = s["time_s"] - s["busy_s"]
        if s["gap_s"] > 0 and idle_s > 0:
            out.append((idle_s / s["cycles"], (s["gpu_energy_j"] - busy_w * s["busy_s"]) / idle_s, s["busy_s"] / idle_s))
    return out


def fit_wait_decay(series: list[dict], wait_w: float) -> WaitDecayFit:
    """`hot_w` and `decay_s` of wait + (hot - wait) * (decay / g) * (1 - exp(-g / decay)) over the
    gaps g of a `wait_decay` calibration (models.profile.WaitDecay). `hot_w` is the power of the
    window without gaps: through gaps of 5-10 ms the GPU drew what it drew busy (H200, 2026-12-01),
    and with `hot_w` free the fit put it above the power cap. A window's gap power is uncertain in
    proportion to its busy over its idle seconds (the bursts' power's error is spread over the gaps),
    so that ratio weighs it."""
    from scipy.optimize import curve_fit

    points = gap_power_w(series)
    if len(points) < 3:
        raise ValueError(f"the wait decay needs at least 3 gap lengths, got {len(points)}")
    g, w, busy_per_idle = (np.array(v, dtype=float) for v in zip(*points))
    hot = max(busy_power_w(series), wait_w)

    def model(gap, decay):
        return wait_w + (hot - wait_w) * decay / gap * -np.expm1(-gap / decay)

    (decay,), _ = curve_fit(model, g, w, p0=(float(np.median(g)),), sigma=busy_per_idle, bounds=([1e-4], [10.0]))
    return WaitDecayFit(hot_w=float(hot), decay_s=float(decay), gaps=len(g))
