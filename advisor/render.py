"""Readable output: rich tables for `predict` and `recommend` (the `--json` path skips this)."""
from __future__ import annotations

import json
import math

from rich.console import Console
from rich.table import Table

from advisor.launch import Launch
from advisor.search import SearchResult
from runs.record import memory_limit_note


def console() -> Console:
    # Wide enough for the Pareto table when stdout is a file or a pipe.
    c = Console()
    return c if c.is_terminal else Console(width=140)


def _kwh(j: float) -> str:
    return figure(j / 3.6e6)


def _hours(s: float) -> str:
    return figure(s / 3600)


def energy_text(j: float) -> str:
    """Joules in the unit that shows them: J below 1 kJ, kJ below 1 MJ, else MJ (a tiny model's step
    is a few joules, which a kJ column showed as 0.0)."""
    for unit, scale in (("MJ", 1e6), ("kJ", 1e3)):
        if abs(j) >= scale:
            return f"{j / scale:,.1f} {unit}"
    return f"{figure(j)} J"


def _band_text(band, level, regime: str | None) -> str:
    """The band, and whose it is: that of host-bound or GPU-bound steps, or of all runs."""
    if band is None:
        return ""
    whose = {"host_bound": " of host-bound steps", "gpu_bound": " of GPU-bound steps"}.get(regime, "")
    return f" ({level:.0%} band{whose} {band[0]:,.3g} - {band[1]:,.3g})"


def show_prediction(out: Console, pred, strategy, title: str, trust: str, bands: dict, level: float | None,
                    band_note: str) -> None:
    """One strategy: totals with their band, then where the time and energy go."""
    out.print(f"[bold]{trust}[/bold]", highlight=False)
    summary = Table(title=title, show_header=False, title_justify="left")
    summary.add_column("", style="bold")
    summary.add_column("")
    cpu_note = " (estimated)" if getattr(pred, "cpu_energy_estimated", False) else ""
    if getattr(pred, "cpu_energy_in_gpu_energy", False):
        cpu_note += ", inside the GPU figure (module meter), not added again"
    regime = bands["band_regime"]
    rows = [
        ("strategy", strategy.label()),
        ("global batch", f"{strategy.global_batch} sequences (micro-batch {strategy.micro_batch} x dp {strategy.dp}"
                         f" x accumulation {strategy.grad_accum})"),
        ("step time", f"{pred.step_time_s:,.3f} s{_band_text(bands['step_time_s_band'], level, regime)}"),
        ("throughput", f"{pred.tokens_per_s:,.0f} tokens/s"),
        ("GPU energy / step", f"{pred.gpu_energy_j:,.0f} J (all {strategy.gpus} GPUs)"),
        ("CPU energy / step", f"{pred.cpu_energy_j:,.0f} J{cpu_note}"),
        ("energy / step", f"{pred.energy_j:,.0f} J{_band_text(bands['energy_j_band'], level, regime)}"),
        ("peak GPU memory", f"{pred.peak_gpu_mem_gib:,.1f} GiB{_band_text(bands['peak_gpu_mem_gib_band'], level, None)}: "
                            f"torch allocates {pred.allocated_gpu_mem_gib:,.1f} "
                            f"(max_memory_allocated), its pool {pred.reserved_gpu_mem_gib:,.1f} (max_memory_reserved), "
                            f"{pred.peak_gpu_mem_gib - pred.reserved_gpu_mem_gib:,.1f} outside it"),
        ("peak host memory", f"{pred.peak_host_mem_gib:,.1f} GiB"),
        ("feasible", "yes" if pred.feasible else "[red]no[/red]: " + "; ".join(pred.reasons)),
        ("profile", str(getattr(pred, "profile", ""))),
    ]
    for k, v in rows:
        summary.add_row(k, v)
    out.print(summary)
    if band_note:
        out.print(f"[dim]{band_note}[/dim]", highlight=False)
    phases = Table(title="Breakdown (exposed time per phase)", title_justify="left")
    for col in ("phase", "time s", "share", "GPU energy J", "CPU energy J"):
        phases.add_column(col, justify="left" if col == "phase" else "right")
    total = pred.step_time_s or 1.0
    for ph in pred.breakdown:
        if ph.time_s == 0 and ph.gpu_energy_j == 0 and ph.cpu_energy_j == 0:
            continue  # phases this strategy does not have (no offload, no Ulysses, ...)
        phases.add_row(ph.name, f"{ph.time_s:,.4f}", f"{100 * ph.time_s / total:.1f}%",
                       f"{ph.gpu_energy_j:,.0f}", f"{ph.cpu_energy_j:,.0f}")
    out.print(phases)


HOSTFILE_LINES_SHOWN = 8


def show_recommendation(out: Console, result: SearchResult, seq_len: int, header: str, trust: str, notes: list[str],
                        others: list, picked_by: str = "the model") -> None:
    """The Pareto front, the notes, the best of each family and the pick; its config follows
    (`show_config`), after the validation table where one ran."""
    c = result.candidates
    out.print(f"[bold]{trust}[/bold]", highlight=False)
    table = Table(title=f"Pareto front ({header})", title_justify="left")
    for col in ("", "strategy", "step s", "tokens/s", "energy/step", "run h", "run kWh", "GPU GiB", "host GiB"):
        table.add_column(col, justify="left" if col in ("", "strategy") else "right", no_wrap=col == "strategy")
    for i in result.pareto:
        m = c.metrics
        tokens_per_s = c.strategies[i].global_batch * seq_len / m["step_time_s"][i]
        table.add_row(
            "*" if i == result.pick else "",
            c.strategies[i].label(),
            figure(m["step_time_s"][i]),
            f"{tokens_per_s:,.0f}",
            energy_text(m["energy_j"][i]),
            _hours(c.run_time_s[i]),
            _kwh(c.run_energy_j[i]),
            f"{m['peak_gpu_mem_gib'][i]:,.1f}",
            f"{m['peak_host_mem_gib'][i]:,.1f}",
            style="bold green" if i == result.pick else None,
        )
    out.print(table)
    for note in notes:
        out.print(f"[dim]{note}[/dim]", highlight=False)
    if others:
        out.print(_alternatives_table(result, others))
    if picked_by == "the model":
        out.print(f"\n[bold]Recommended[/bold] (*): {c.strategies[result.pick].label()}")
    else:
        out.print("\n[bold]Recommended by measurement[/bold]: see the validation table below")


def show_config(out: Console, ds_config: dict, launch: Launch, training=None) -> None:
    """The pick's DeepSpeed config, its TrainingArguments for the Trainer (`training`:
    advisor.hf_trainer.TrainingArgs), and the launch line."""
    title = ' (for the Trainer: "auto" where TrainingArguments sets the value)' if training else ""
    out.print(f"\n[bold]ds_config.json[/bold]{title}", highlight=False)
    out.print_json(json.dumps(ds_config))
    if training:
        out.print("\n[bold]TrainingArguments[/bold] (the layout; the recipe stays yours)")
        out.print(training.python(), soft_wrap=True, highlight=False)
    out.print("\n[bold]Launch[/bold]")
    out.print(launch.deepspeed, soft_wrap=True, highlight=False)
    if launch.torchrun:
        out.print(f"[dim]or on every node:[/dim] {launch.torchrun}", soft_wrap=True, highlight=False)
    if launch.hostfile:
        hosts = launch.hostfile.splitlines()
        shown = "\n".join(hosts[:HOSTFILE_LINES_SHOWN])
        more = f"\n... {len(hosts) - HOSTFILE_LINES_SHOWN} more lines, one per node" if len(hosts) > HOSTFILE_LINES_SHOWN else ""
        out.print(f"[dim]hostfile:[/dim]\n{shown}{more}", highlight=False)
    for note in launch.notes:
        out.print(f"[dim]note:[/dim] {note}", highlight=False)


def _gap(x: float) -> str:
    return "-" if abs(x) < 5e-4 else f"{x:+.1%}"


def _alternatives_table(result: SearchResult, others: list) -> Table:
    """The best strategy of each family, against the pick."""
    c = result.candidates
    table = Table(title="Best of each family (gaps against the pick, whole run)", title_justify="left")
    for col in ("family", "strategy", "step s", "energy/step", "GPU GiB", "time", "energy"):
        table.add_column(col, justify="left" if col in ("family", "strategy") else "right",
                         no_wrap=col == "strategy")
    for a in others:
        i = a.index
        slow = "" if a.within_slowdown else " (too slow)"
        table.add_row(a.family, c.strategies[i].label() + (" *" if a.is_pick else ""),
                      figure(c.metrics["step_time_s"][i]), energy_text(c.metrics["energy_j"][i]),
                      f"{c.metrics['peak_gpu_mem_gib'][i]:,.1f}", _gap(a.time_gap) + slow, _gap(a.energy_gap),
                      style="bold green" if a.is_pick else None)
    return table


def figure(value, digits: int = 3) -> str:
    """A measured or predicted figure: three significant digits, whole numbers from 1,000 up."""
    if value is None:
        return "-"
    return f"{value:,.{digits}g}" if abs(value) < 1000 else f"{value:,.0f}"


def error_suffix(error_pct: float | None) -> str:
    """A prediction's error after its figure: " (+12%)"; nothing where it is unknown."""
    return "" if error_pct is None else f" ({error_pct:+.0f}%)"


def probed_host_line(label: str, again: dict) -> str:
    """`advisor.validate.at_probed_host`'s prediction as one line: what the model says at the run's own host."""
    figures = " and ".join(f"{figure(again[k])} {unit}{error_suffix(again['error_pct'][k])}"
                           for k, unit in (("step_time_s", "s"), ("gpu_energy_j", "J")))
    return (f"{label}: at the host its probes measured ({again['issue_us_per_layer']:.0f} us a layer) "
            f"the model predicts {figures}.")


def _scatter(lead) -> str:
    """A regret's scatter over the rounds it was measured in: " +-2.0% (3 rounds)"."""
    if lead is None or lead.stderr is None:
        return ""
    return f" \u00b1{math.expm1(lead.stderr):.1%} ({lead.rounds} rounds)"


def rounds_line(loop) -> str:
    """Whether the rounds told the pick from the closest candidate measured again."""
    v = loop.verdict
    # Behind the pick on its figure; one ahead of it was out of the slowdown limit.
    again = {i: lead for i, lead in v.leads.items() if lead.stderr is not None and lead.log_ratio > 0}
    if not again:
        return "No candidate within the slowdown limit was measured again beside the pick."
    i, closest = min(again.items(), key=lambda kv: kv[1].log_ratio)
    gap = (f"{loop.plan[v.measured_pick]['label']} led {loop.plan[i]['label']} by {math.expm1(closest.log_ratio):.1%} "
           f"\u00b1{math.expm1(closest.stderr):.1%} over {closest.rounds} interleaved rounds")
    if closest.separated:
        return f"{gap}: a lead beyond the rounds' scatter."
    return f"{gap}: within the rounds' scatter, so the two are equal as far as this host can tell; either will do."


ESTIMATED_CPU_NOTE = ("est.: the host CPU's energy is estimated from its utilization, not measured (this host has no "
                      "CPU power sensor: RAPL or hwmon)")


def retry_hint(statuses) -> str | None:
    """How to run failed candidates again: a stored failure stands until --retry names its status."""
    failed = sorted(set(statuses) - {"ok"})
    if not failed:
        return None
    flags = " ".join(f"--retry {status}" for status in failed)
    return f"a stored {' / '.join(failed)} stands until it is run again: once its cause is fixed, add {flags}"


def estimated_cpu_note(records) -> str | None:
    """Where a measured energy holds an estimate: the host's CPU share, from its utilization."""
    if not any(r and r.result.cpu_energy_estimated and r.result.cpu_energy_j is not None for r in records):
        return None
    return ESTIMATED_CPU_NOTE


def show_loop(out: Console, loop) -> None:
    """The candidates the loop measures: predicted (with the band) against measured, and the pick."""
    from runs.measured import default_allocator_reserved_gib  # the fit's imports: only where a loop ran

    table = Table(title="Validation: predicted \\[band] / measured, per optimizer step", title_justify="left")
    for col in ("", "strategy", "why", "step s", "energy kJ", "pool GiB", "status", "regret"):
        table.add_column(col, justify="left" if col in ("", "strategy", "why", "status") else "right")
    v = loop.verdict
    reasons = []
    for i, p in enumerate(loop.plan):
        m = loop.measured[i] if loop.measured else None
        t_band, e_band, r_band = p.get("step_time_s_band"), p.get("energy_j_band"), p.get("reserved_gpu_mem_gib_band")
        t = figure(p["step_time_s"]) + (f" [{figure(t_band[0])}-{figure(t_band[1])}]" if t_band else "")
        e = figure(p["energy_j"] / 1e3) + (f" [{figure(e_band[0] / 1e3)}-{figure(e_band[1] / 1e3)}]" if e_band else "")
        pool = (figure(p["reserved_gpu_mem_gib"]) + (f" [{figure(r_band[0])}-{figure(r_band[1])}]" if r_band else "")
                if "reserved_gpu_mem_gib" in p else "")  # a plan stored before it kept the pool
        status, regret, mark = "planned", "", ""
        if m is not None:
            t += f" / {figure(m.time_s)}"
            e += f" / {figure(m.energy_j / 1e3 if m.energy_j is not None else None)}"
            if m.energy_j is not None and estimated_cpu_note([m.record]):
                e += " est."
            pool += f" / {figure(default_allocator_reserved_gib(m.record.result) if m.record else None)}"
            kind = m.record.result.status if m.record else "not run"
            why_not = m.not_run_reason if m.record is None else m.record.result.reason if not m.ok else ""
            status = kind + (": see below" if why_not else "")
            if why_not:  # whole, below the table: in a cell it squeezed the figures or was cut
                reasons.append(f"{p['label']}: {kind}: {why_not}")
            regret = "" if v.regret.get(i) is None else f"{v.regret[i]:+.1%}" + _scatter(v.leads.get(i))
            mark = "*" if v.measured_pick == i else ""
        table.add_row(mark, p["label"], p["why"], t, e, pool, status, regret, style="bold green" if mark else None)
    out.print(table)
    for reason in reasons:
        out.print(reason, highlight=False, markup=False, soft_wrap=True)
    if loop.measured is None:
        out.print("[dim]planned only (--plan-only): nothing was run[/dim]")
        return
    if v.measured_pick is not None:
        by = {"energy": "least measured energy", "time": "fastest measured", "edp": "least measured energy x time"}
        out.print(f"[bold]Picked by measurement[/bold] (*): {loop.plan[v.measured_pick]['label']} "
                  f"({by[v.by]} within the slowdown limit of the fastest measured; regret: the figure per token "
                  f"against the pick's; runs took {loop.run_seconds:,.0f} s)", highlight=False)
        if loop.rounds > 1:
            out.print(rounds_line(loop), highlight=False)
    shown_energy = [m.record for m in loop.measured if m.energy_j is not None]
    for note in (v.note, loop.refit_note, loop.host_note, estimated_cpu_note(shown_energy),
                 retry_hint(m.record.result.status for m in loop.measured if m.record)):
        if note:
            out.print(f"[dim]{note}[/dim]", highlight=False)
    for p, m in zip(loop.plan, loop.measured):
        tight = m.record and memory_limit_note(m.record.result.status, m.record.result.gpu_alloc_retries)
        if tight:
            out.print(f"[dim]{p['label']}: {tight}[/dim]", highlight=False)
    if loop.host_note:  # the runs' host strayed from the profile's: the model again at the host they had
        for p, again in zip(loop.plan, loop.at_probed_host):
            if again:
                out.print(f"[dim]{probed_host_line(p['label'], again)}[/dim]", highlight=False)
