"""Human-readable one-liners per result and the closing summary table (rich)."""
from __future__ import annotations

from rich.table import Table


def _rate(v: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {prefix}{unit}"
    return f"{v:.3g} {unit}"


def one_line(family: str, data: dict) -> str:
    """A few words on one result, shown beside the progress bar."""
    if not data or data.get("ran") is False:
        return "done"
    if family == "gemm":
        return _rate(data["flop_per_s"], "FLOP/s")
    if family == "attention":
        return f"fwd {_rate(data['fwd_flop_per_s'], 'FLOP/s')}, bwd {_rate(data['bwd_flop_per_s'], 'FLOP/s')}"
    if family in ("hbm", "hostlink", "host_memory"):
        return _rate(data["bytes_per_s"], "B/s")
    if family == "hostlink_both":
        return f"H2D {_rate(data['h2d_bytes_per_s'], 'B/s')}, D2H {_rate(data['d2h_bytes_per_s'], 'B/s')}"
    if family in ("cpu_adam", "cpu_adam_threads"):
        return f"{_rate(data['params_per_s'], 'params/s')} ({data['optimizer']})"
    if family == "param_refresh":
        return f"{_rate(data['params_per_s'], 'params/s')} ({data['path']})"
    if family == "collective":
        return f"{data['time_s'] * 1e6:.0f} us, bus {_rate(data['busbw_bytes_per_s'], 'B/s')}"
    if family == "overlap":
        return f"compute {data['compute_slowdown']:+.1%}, other {data['other_slowdown']:+.1%}"
    if family == "power":
        gpu = "GPU n/a" if data["gpu_power_w"] is None else f"GPU {data['gpu_power_w']:.0f} W"
        cpu = "" if data["cpu_power_w"] is None else f", CPU {data['cpu_power_w']:.0f} W"
        return gpu + cpu
    if family == "memory":
        return f"{data['framework_gib']:.2f} GiB"
    if family == "ds_steps" and "result" in data:
        r = data["result"]
        return f"{r['step_time_s']:.3f} s a step over {r['measured_steps']}"
    if family == "ds_steps":
        return (f"DeepSpeed {data['deepspeed']} in {data['time_s']:.0f} s; optimizer ops: CPU Adam "
                f"{data['cpu_adam_op']}, fused Adam {data.get('fused_adam_op', 'not recorded')}")
    return "done"


def step_fit_table(fit) -> Table:
    """What the calibration's DeepSpeed steps did to the carried overhead terms (calibration.step_fit)."""
    t = Table(title=f"DeepSpeed overheads fitted to {len(fit.steps)} steps (prior strength {fit.prior_strength:g})")
    for name, justify in (("step", "left"), ("measured s", "right"), ("carried terms", "right"),
                          ("fitted", "right"), ("held out", "right")):
        t.add_column(name, justify=justify)
    for s in fit.steps:
        t.add_row(s.case, f"{s.measured_s:.3f}", *(f"{v / s.measured_s - 1:+.1%}" for v in (s.carried_s, s.fitted_s,
                                                                                         s.held_out_s)))
    moved = ", ".join(f"{n.removeprefix('overheads.')} {a:.3g} -> {b:.3g}" for n, (a, b) in sorted(fit.fitted.items()))
    t.caption = f"fitted: {moved or 'none'}; kept (no step responds to it): {', '.join(fit.kept) or 'none'}"
    return t


def summary_table(profile: dict) -> Table:
    """The headline numbers of a written profile."""
    t = Table(title=f"profile {profile['name']} ({profile['provenance']['kind']})")
    t.add_column("constant")
    t.add_column("value", justify="right")
    t.add_column("source", overflow="fold")
    g, h, p = profile["gpu"], profile["host"], profile["power"]

    def row(name, q, unit):
        t.add_row(name, _rate(q["value"], unit) if unit else f"{q['value']:.3g} {q['unit']}", q["source"][:90])

    t.add_row("GEMM bf16 (largest)", _rate(g["gemm_bf16"]["y"][-1], "FLOP/s"), g["gemm_bf16"]["source"][:90])
    t.add_row("attention fwd (longest)", _rate(g["attention_fwd_bf16"]["y"][-1], "FLOP/s"), "")
    t.add_row("attention bwd (longest)", _rate(g["attention_bwd_bf16"]["y"][-1], "FLOP/s"), "")
    row("memory-bound bandwidth", g["hbm_bandwidth"], "B/s")
    t.add_row("H2D (largest)", _rate(h["h2d"]["y"][-1], "B/s"), h["h2d"]["source"][:90])
    t.add_row("D2H (largest)", _rate(h["d2h"]["y"][-1], "B/s"), "")
    row("CPU Adam", h["cpu_adam"], "params/s")
    for op, c in profile["intra_node"].items():
        t.add_row(f"{op} (node)", f"{c['alpha']['value'] * 1e6:.1f} us + {_rate(c['bus_bandwidth']['value'], 'B/s')}",
                  c["bus_bandwidth"]["source"][:90])
    for k, q in profile["overlap"].items():
        row(k, q, "")
    decay = p["gpu"].get("wait_decay")
    for k, q in p["gpu"].items():
        if k != "wait_decay":
            row(f"GPU power {k}", q, "")
    if decay:
        t.add_row("GPU power after work", f"falls in {decay['decay_s']['value'] * 1e3:.0f} ms after "
                  f"{decay['burst_s']['value'] * 1e3:.0f} ms busy", decay["decay_s"]["source"][:90])
    row("CPU power idle", p["cpu"]["idle"], "")
    row("CPU power optimizer", p["cpu"]["optimizer"], "")
    return t
