"""Raw results -> a HardwareProfile dict (validated by models.profile.parse_profile).

Every constant says where it came from. A constant that this machine could not measure
(a collective on one GPU, the inter-node network on one node, GPU power on a CPU-only
run) is either copied from a reference profile (`fill_from`) or filled with a stated
placeholder whose source says "not measured" and why. A constant that should have been
measured but failed is an error naming the benchmarks to rerun, never a made-up number.
"""
from __future__ import annotations

from statistics import median

from calibration.cpu_power import estimate_cpu_power
from calibration.fitting import (COLLECTIVE_OPS, VISION_WIDTHS, bus_factor, build_curve, decoder_row, fit_alpha_beta,
                                 fit_elementwise, fit_wait_decay, separated_decoder_widths)
from models.flops import ATTENTION_BWD_PER_FWD, causal_attention_flops
from calibration.rawlog import RawResult
from calibration.carried import carried_memory, carried_overheads
from models.profile import SCHEMA_VERSION, HardwareProfile, HostSpec, parse_profile

NEUTRAL_OVERHEADS = {  # not this calibration's job: fitted later from short real DeepSpeed runs
    "step": (0.0, "s"), "micro_step": (0.0, "s"), "layer_pass": (0.0, "s"),
    "zero3_module_pass": (0.0, "s"), "zero12_grad_hook": (0.0, "s"),
    "zero12_step_per_tensor": (0.0, "s"), "step_per_tensor": (0.0, "s"), "zero3_host_serial": (0.0, "fraction"),
    "offload_step_per_gparam": (0.0, "s"), "offload_step_serial_per_gparam": (0.0, "s"),
    "zero3_offload_step_per_tensor": (0.0, "s"),
    "super_offload_step_per_gparam": (0.0, "s"), "compute_efficiency": (1.0, "fraction"),
}


class MissingMeasurements(RuntimeError):
    """Required measurements are absent or failed; the message lists them and the fix."""


# The profile's key and the width's name for each width of an elementwise fit.
_ELEMENTWISE_KEYS = {"hidden": "per_hidden", "attention_dim": "per_attention", "kv_dim": "per_kv", "ffn": "per_ffn",
                     "qk_norm_dim": "per_qk_norm", "sandwich_norm_dim": "per_sandwich_norm"}
_WIDTH_NAMES = {"hidden": "the hidden size", "attention_dim": "the heads' width", "kv_dim": "the KV width",
                "ffn": "the FFN width", "qk_norm_dim": "the width the q/k norms normalise",
                "sandwich_norm_dim": "the width the sandwich norms normalise"}


def _q(value: float, unit: str, source: str) -> dict:
    return {"value": float(value), "unit": unit, "source": source}


def relabel(node: dict, prefix: str) -> dict:
    """Copy of a quantity or curve (or a group of them) with `prefix` before every source."""
    if "source" in node:
        return dict(node, source=prefix + node["source"])

    def one(v):
        if isinstance(v, dict):
            return relabel(v, prefix)
        return [one(x) for x in v] if isinstance(v, list) else v

    return {k: one(v) for k, v in node.items()}


def _span(values, unit="B") -> str:
    """'32 KiB-512 MiB'; '?' for no values (a family left out with --only)."""
    if not values:
        return "?"
    lo, hi = min(values), max(values)
    fmt = (lambda v: f"{v / 2**20:g} MiB" if v >= 2**20 else f"{v / 2**10:g} KiB") if unit == "B" else str
    return f"{fmt(lo)}-{fmt(hi)}"


class ProfileBuilder:
    """Builds one profile dict from a calibration's environment facts and raw results."""

    def __init__(self, env: dict, results: dict[str, RawResult], *, name: str, raw_file: str,
                 fill_from: HardwareProfile | None = None, reference: HardwareProfile | None = None,
                 cpu_tdp_w: float | None = None, cpu_idle_w: float | None = None):
        self.env, self.name, self.raw_file, self.ref = env, name, raw_file, fill_from
        # where the terms no microbenchmark measures are carried from (calibration.carried)
        self.carry_from = fill_from or reference
        self.ok = {k: r for k, r in results.items() if r.status == "ok"}
        self.failed = {k: r for k, r in results.items() if r.status == "failed"}
        self.skipped = {k: r for k, r in results.items() if r.status == "skipped"}
        self.cpu = env["kind"] == "cpu"
        self.missing: list[str] = []
        self.estimate = estimate_cpu_power(int(env["host_cores"]), cpu_tdp_w, cpu_idle_w)
        self.cpu_tag = "placeholder for a CPU profile (not measured on a GPU)"

    # -- helpers ---------------------------------------------------------------------------
    def family(self, fam: str) -> list[dict]:
        return [r.data for r in self.ok.values() if r.family == fam and r.data.get("ran", True)]

    def need(self, fam: str, what: str) -> list[dict]:
        rows = self.family(fam)
        if not rows:
            why = "; ".join(f"{k}: {r.reason}" for k, r in self.failed.items() if r.family == fam)
            self.missing.append(f"{what} (benchmark family '{fam}'{': ' + why if why else ': no results'})")
        return rows

    def from_ref(self, path: str, why: str):
        """The reference profile's value at `path` (dotted), re-labelled, or None."""
        if self.ref is None:
            return None
        node = self.ref.model_dump(exclude_none=True)  # a group's optional members the reference lacks stay unset
        for part in path.split("."):
            node = node.get(part) if node is not None else None
        return None if node is None else relabel(node, f"from profile '{self.ref.name}' ({why}): ")

    def _curve(self, rows, xk, yk, x_unit, y_unit, what) -> dict | None:
        if not rows:
            return None
        pts = build_curve([r[xk] for r in rows], [r[yk] for r in rows])
        return {"x_unit": x_unit, "y_unit": y_unit, "x": pts.x, "y": pts.y, "source": what}

    @staticmethod
    def attention_rates(rows: list[dict]) -> list[dict]:
        """Rates from the measured times and the cost model's own FLOP count, whatever count the raw
        file was written with (files before 2026-11-30 counted backward as 2.5x forward)."""
        return [{**r, "fwd_flop_per_s": float(causal_attention_flops(r["batch"], r["heads"], r["seq_len"],
                                                                     r["head_dim"])) / r["fwd_time_s"],
                 "bwd_flop_per_s": float(causal_attention_flops(r["batch"], r["heads"], r["seq_len"],
                                                                r["head_dim"], backward=True)) / r["bwd_time_s"]}
                for r in rows]

    @staticmethod
    def reference_head_dim(rows: list[dict]) -> int:
        """The head dim the attention curves are of: 128 where measured, else the median one."""
        if any(r["head_dim"] == 128 for r in rows):
            return 128
        return median([r["head_dim"] for r in rows]) if rows else 128

    def head_dim_ratios(self, where: str) -> dict[str, dict]:
        """`gpu.attention_{fwd,bwd}_head_dim_ratio`: the rate at each other head dim over the
        reference head dim's at the same sequence length, the median over the sequences both were
        measured at. Empty where no other head dim shares a sequence with the reference; the
        reference profile's where attention was not measured at all."""
        rows = self.attention_rates(self.family("attention"))
        if not rows:  # attention not measured here (--only ... --fill-from): the reference's, labelled
            return {key: value for key in ("attention_fwd_head_dim_ratio", "attention_bwd_head_dim_ratio")
                    if (value := self.from_ref(f"gpu.{key}", "not measured in this calibration")) is not None}
        ref_d = self.reference_head_dim(rows)
        ref = {r["seq_len"]: r for r in rows if r["head_dim"] == ref_d}
        shared = [r for r in rows if r["head_dim"] != ref_d and r["seq_len"] in ref]
        if not shared:
            return {}
        seqs = ", ".join(str(q) for q in sorted({r["seq_len"] for r in shared}))
        out = {}
        for fb, what in (("fwd", "forward"), ("bwd", "backward")):
            by_dim: dict[int, list[float]] = {}
            for r in shared:
                by_dim.setdefault(r["head_dim"], []).append(r[f"{fb}_flop_per_s"] / ref[r["seq_len"]][f"{fb}_flop_per_s"])
            points = sorted({**{d: median(v) for d, v in by_dim.items()}, ref_d: 1.0}.items())
            out[f"attention_{fb}_head_dim_ratio"] = {
                "x_unit": "head_dim", "y_unit": "ratio", "x": [float(d) for d, _ in points],
                "y": [float(y) for _, y in points],
                "source": f"{where}: torch SDPA causal {what} at head dims {', '.join(str(d) for d, _ in points)} "
                          f"over head dim {ref_d}, median over sequences {seqs}; raw in {self.raw_file}"}
        return out

    def layer_elementwise(self, bandwidth: float | None) -> dict | None:
        """`gpu.layer_elementwise`: the decoder layers' elementwise seconds fitted as effective bytes
        at `bandwidth`; the reference profile's where not measured here, else None (counted bytes)."""
        rows = [decoder_row(r) for r in self.family("layer_elementwise")]
        return self._elementwise("layer_elementwise", rows, separated_decoder_widths(rows), "harness decoder block",
                                 "preset", bandwidth)

    def vision_elementwise(self, bandwidth: float | None) -> dict | None:
        """`gpu.vision_elementwise`: the same for a ViT block of the vision tower (two widths)."""
        return self._elementwise("vision_elementwise", self.family("vision_elementwise"), VISION_WIDTHS, "ViT block",
                                 "shape", bandwidth)

    def _elementwise(self, family: str, rows: list[dict], widths: tuple[str, ...], block: str, name_key: str,
                     bandwidth: float | None) -> dict | None:
        if len(rows) < len(widths) or not bandwidth:
            return self.from_ref(f"gpu.{family}", "not measured in this calibration")
        fit = fit_elementwise(rows, bandwidth, widths)
        where = "measured on the CPU path" if self.cpu else "measured"
        source = (f"{where}: torch.profiler time of the kernels that are neither GEMMs nor attention in one {block}'s "
                  f"forward and backward, {len(rows)} blocks ({', '.join(sorted({r[name_key] for r in rows}))}"
                  f" at {', '.join(str(t) for t in sorted({r['tokens'] for r in rows}))} tokens), fitted as bytes per token over "
                  f"{bandwidth / 1e12:.2f} TB/s (worst block {fit.worst_error:.0%} off); raw in {self.raw_file}")
        return {_ELEMENTWISE_KEYS[width]: _q(value, "bytes", f"{source}; per element of {_WIDTH_NAMES[width]}")
                for width, value in fit.bytes_per_element.items()}

    # -- sections --------------------------------------------------------------------------
    def gpu(self) -> dict:
        env, tag = self.env, self.cpu_tag
        gemm = self.need("gemm", "gpu.gemm_bf16")
        att = self.need("attention", "gpu.attention_*_bf16")
        hbm = self.need("hbm", "gpu.hbm_bandwidth")
        ref_d = self.reference_head_dim(att)
        att = [r for r in att if r["head_dim"] == ref_d]
        where = tag if self.cpu else "measured"
        gemm_src = (f"{where}: bf16 torch.matmul at {len(gemm)} transformer shapes (tokens x hidden, hidden x FFN, "
                    f"weight gradients, logits), median of timed batches; log-binned, isotonic non-decreasing; "
                    f"raw points in {self.raw_file}")
        att_src = lambda fb: (f"{where}: torch SDPA causal {fb}, head_dim {att[0]['head_dim'] if att else '?'}, "
                              f"counting causal FLOPs only (bwd = {ATTENTION_BWD_PER_FWD:g} x fwd, models.flops); "
                              f"raw in {self.raw_file}")
        att = self.attention_rates(att)
        if self.cpu:
            memory = _q(env["host_memory_gib"] or 0.0, "GiB", f"{tag}: host memory (psutil)")
            cap = _q(self.estimate.busy_w, "W", f"{tag}: host CPU busy power, {self.estimate.basis}")
        else:
            memory = _q(env["gpu_memory_gib"], "GiB", "torch.cuda.get_device_properties(0).total_memory")
            if env.get("gpu_power_limit_w"):
                cap = _q(env["gpu_power_limit_w"], "W", "NVML enforced power limit (nvmlDeviceGetEnforcedPowerLimit)")
            else:
                cap = self.from_ref("gpu.power_cap", "NVML unavailable here")
                if cap is None:
                    self.missing.append("gpu.power_cap (NVML unavailable: pip install nvidia-ml-py)")
        hbm_src = (f"{tag}: multi-threaded host memory copy, bytes read + written" if self.cpu else
                   f"measured: device-to-device copy of {_span([r['bytes'] for r in hbm])}, "
                   "bytes read + written, best size")
        hbm_q = _q(max(r["bytes_per_s"] for r in hbm), "bytes/s", hbm_src) if hbm else None
        bandwidth = hbm_q["value"] if hbm_q else (self.ref.gpu.hbm_bandwidth.value if self.ref else None)
        return {
            "name": env["gpu"] or f"{env['host_cpu']} (CPU profile)",
            "memory_gib": memory,
            "gemm_bf16": self._curve(gemm, "flops", "flop_per_s", "flop", "flop/s", gemm_src),
            "attention_fwd_bf16": self._curve(att, "seq_len", "fwd_flop_per_s", "tokens", "flop/s", att_src("forward")),
            "attention_bwd_bf16": self._curve(att, "seq_len", "bwd_flop_per_s", "tokens", "flop/s", att_src("backward")),
            **self.head_dim_ratios(where),
            "hbm_bandwidth": hbm_q,
            "power_cap": cap,
            **({"layer_elementwise": layers} if (layers := self.layer_elementwise(bandwidth)) else {}),
            **({"vision_elementwise": vit} if (vit := self.vision_elementwise(bandwidth)) else {}),
            # No calibration family measures the optimizer step: real runs' phase traces do
            # (calibration.optimizer_step). The reference's, labelled, where it has one: its fitted
            # overheads assume it.
            **({"optimizer_step_bytes_per_param": step} if (step := self.from_ref(
                "gpu.optimizer_step_bytes_per_param", "not measured by a calibration")) else {}),
        }

    def host(self) -> dict:
        env, tag = self.env, self.cpu_tag
        one_way = self.need("hostlink", "host.h2d / host.d2h")
        adam = self.need("cpu_adam", "host.cpu_adam")
        mem = self.need("host_memory", "host.memory_bandwidth")

        def link_curve(direction):
            rows = [r for r in one_way if r["direction"] == direction]
            if self.cpu:
                src = f"{tag}: host-to-host copy, no device link"
            else:
                src = (f"measured: pinned {direction.upper()} copies of {_span([r['bytes'] for r in rows])}, "
                       f"one way ({env['link']}); both-ways results in {self.raw_file}")
            return self._curve(rows, "bytes", "bytes_per_s", "bytes", "bytes/s", src)

        adam_q = None
        if adam:
            a = adam[0]
            adam_q = _q(a["params_per_s"], "params/s",
                        f"{'measured' if not self.cpu else 'measured on the CPU path'}: {a['optimizer']} step of "
                        f"{a['params']} fp32 params on {a['threads']} threads, median ({a['why']})")
        by_threads = [r for r in self.family("cpu_adam_threads") if r.get("ran", True)]
        threads_curve = None
        if len(by_threads) >= 2:
            a = by_threads[0]
            threads_curve = self._curve(
                by_threads, "threads", "params_per_s", "threads", "params/s",
                f"{'measured' if not self.cpu else 'measured on the CPU path'}: {a['optimizer']} step of "
                f"{a['params']} fp32 params in one process on {_span([r['threads'] for r in by_threads], '')} "
                f"threads, median")
        refresh = {}
        for path, key in (("cast", "param_cast_threads"), ("direct", "param_direct_upload_threads")):
            rows = [r for r in self.family("param_refresh") if r.get("ran", True) and r["path"] == path]
            if len(rows) >= 2:
                refresh[key] = self._curve(
                    rows, "threads", "params_per_s", "threads", "params/s",
                    f"{'measured' if not self.cpu else 'measured on the CPU path'}: parameter refresh "
                    f"({path}) of {rows[0]['params']} fp32 params on {_span([r['threads'] for r in rows], '')} "
                    f"threads, median")
        issue_us = [r["us_per_layer"] for r in self.family("host_issue") if r.get("ran", True)]
        issue_q = _q(median(issue_us) * 1e-6, "s",
                     f"{'measured' if not self.cpu else 'measured on the CPU path'}: the host probe's issue time "
                     f"of a tiny layer's forward and backward, the median of {len(issue_us)} reading(s) through "
                     f"the calibration ({', '.join(f'{us:.0f}' for us in issue_us)} us)") if issue_us else None
        passes = self.pass_issue()
        hooks = self.zero3_hook_pass()
        mem_q = None
        if mem:
            m = mem[0]
            mem_q = _q(m["bytes_per_s"], "bytes/s", f"measured: torch copy of {m['bytes'] >> 20} MiB on "
                       f"{m['threads']} threads, bytes read + written")
        return {
            "cpu": env["host_cpu"],
            "cores": _q(env["host_cores"], "count", "os.sched_getaffinity (cores this process may use)"),
            "memory_gib": _q(env["host_memory_gib"] or 0.0, "GiB", "psutil.virtual_memory().total"),
            "memory_bandwidth": mem_q,
            "link": env["link"],
            "h2d": link_curve("h2d"),
            "d2h": link_curve("d2h"),
            "cpu_adam": adam_q,
            **({"cpu_adam_threads": threads_curve} if threads_curve else {}),  # optional: older calibrations lack it
            **refresh,  # optional, as the thread curve
            **({"issue_per_layer": issue_q} if issue_q else {}),  # optional, as the thread curve
            **({"pass_issue": passes} if passes else {}),  # optional, as the thread curve
            **({"zero3_hook_pass": hooks} if hooks else {}),  # optional, as the thread curve
        }

    def pass_issue(self) -> dict | None:
        """`host.pass_issue`: each pass's issue time over the forward's, the median over the layers
        measured (calibration.microbench.pass_issue); None where none was."""
        return self._pass_ratios("pass_issue", "harness decoder layers", "issue time")

    def zero3_hook_pass(self) -> dict | None:
        """`host.zero3_hook_pass`: ZeRO-3's hooks in each pass over the forward's, the median over the
        layers measured (calibration.microbench.zero3_hooks); None where none was."""
        return self._pass_ratios("zero3_hooks", "harness decoder layers in a DeepSpeed engine", "ZeRO-3 hooks' time")

    def _pass_ratios(self, family: str, layers: str, what: str) -> dict | None:
        rows = [r for r in self.family(family) if r.get("ran", True)]
        if not rows:
            return None
        where = "measured" if not self.cpu else "measured on the CPU path"
        # pooled runs of one machine (calibration.merge) repeat the presets: each is named once
        presets = f"{len(rows)} layers of " + ", ".join(dict.fromkeys(r["preset"] for r in rows))

        def ratio(key: str, which: str) -> dict:
            values = [r[key] for r in rows]
            return _q(median(values), "ratio", f"{where}: {which} over the plain forward's, {rows[0]['layers']} "
                      f"{layers} at {rows[0]['tokens']} tokens, median of {presets} "
                      f"({min(values):.2f}-{max(values):.2f})")

        return {"backward": ratio("backward_ratio", f"the backward's {what}"),
                "checkpointed_forward": ratio("checkpointed_forward_ratio", f"a checkpointed forward's {what}"),
                "recompute": ratio("recompute_ratio", f"what checkpointing adds to the backward's {what}")}

    def collective(self, op: str, scope: str, size: int, label: str) -> dict | None:
        rows = [r for r in self.family("collective") if r["op"] == op and r["scope"] == scope
                and r["group_size"] == size]
        if len(rows) < 2:
            self.missing.append(f"{label}.{op} (collective benchmarks for {scope} group of {size})")
            return None
        factor = bus_factor(op, size)
        fit = fit_alpha_beta([r["bytes"] for r in rows], [r["time_s"] for r in rows], factor)
        what = (f"{rows[0]['backend']} {rows[0]['dtype']}, {len(rows)} sizes {_span([r['bytes'] for r in rows])}, "
                f"group of {size} ({'within a node' if scope == 'intra' else 'across nodes'})")
        prefix = f"{self.cpu_tag}: gloo" if self.cpu else "measured"
        alpha = _q(fit.alpha_s, "s", f"{prefix}: alpha-beta fit (relative least squares), {what}; "
                   f"max rel. error {fit.max_rel_error:.0%}")
        if fit.bus_bandwidth_bytes_per_s is not None:
            bw = _q(fit.bus_bandwidth_bytes_per_s, "bytes/s", f"{prefix}: alpha-beta fit, {what}, nccl-tests bus factor")
        else:
            big = max(rows, key=lambda r: r["bytes"])
            ref = self.from_ref(f"{label}.{op}.bus_bandwidth", f"group of {size} crosses no link here")
            bw = ref or _q(big["algbw_bytes_per_s"], "bytes/s",
                           f"not measured: a group of {size} crosses no link; placeholder = the local rate "
                           f"({big['bytes'] >> 20} MiB, bytes/time), not a link bandwidth")
        return {"alpha": alpha, "bus_bandwidth": bw,
                "group_size_measured": _q(size, "count", f"ranks in the measured group ({scope})")}

    def intra_sizes_measured(self, op: str) -> list[int]:
        return sorted({r["group_size"] for r in self.family("collective")
                       if r["op"] == op and r["scope"] == "intra" and r["group_size"] >= 2})

    def intra_collective(self, op: str, local: int) -> dict | None:
        """The node-wide group's constants, plus each smaller group measured (full mode)."""
        node = self.collective(op, "intra", local, "intra_node")
        sizes = self.intra_sizes_measured(op)
        if node is None or len(sizes) < 2:
            return node
        points = []
        for size in sizes:
            c = node if size == local else self.collective(op, "intra", size, "intra_node")
            if c is not None:
                points.append({"group_size": c["group_size_measured"], "alpha": c["alpha"],
                               "bus_bandwidth": c["bus_bandwidth"]})
        return dict(node, by_group_size=points)

    def unmeasured_network(self, label: str, why: str) -> dict | None:
        """A network no group of this calibration crossed: the --fill-from profile's, carried and flagged; else
        the reference's as a placeholder (`models.term_basis` refuses plans that need it); else None."""
        if self.ref is not None:
            return relabel(self.ref.model_dump()[label], f"from profile '{self.ref.name}' ({why}): ")
        if self.carry_from is None:
            return None
        return relabel(self.carry_from.model_dump()[label],
                       f"placeholder, not measured ({why}): profile '{self.carry_from.name}' stands in, "
                       "and plans that need it are refused: ")

    def networks(self) -> tuple[dict, dict]:
        local, world = int(self.env["gpus_per_node"]), int(self.env["world_size"])
        if world == 1:  # a group of one times no collective (calibration.microbench.collectives)
            intra = self.unmeasured_network("intra_node", "a one-GPU calibration times no collective")
            inter = self.unmeasured_network("inter_node", "a one-GPU calibration crosses no network")
            if intra is not None and inter is not None:
                return intra, inter
        intra = {op: self.intra_collective(op, local) for op in COLLECTIVE_OPS}
        if world > local:
            inter = {op: self.collective(op, "inter", world, "inter_node") for op in COLLECTIVE_OPS}
        else:
            inter = {}
            for op in COLLECTIVE_OPS:
                ref = self.from_ref(f"inter_node.{op}", "single-node calibration") if self.ref else None
                if ref is not None:
                    inter[op] = ref
                elif intra[op] is not None:
                    inter[op] = {k: dict(v, source=f"not measured (single-node calibration): placeholder copied "
                                         f"from intra_node: {v['source']}")
                                for k, v in intra[op].items() if k != "by_group_size"}
                else:
                    inter[op] = None
        return intra, inter

    def overlap(self) -> dict:
        rows = {r["partner"]: r for r in self.family("overlap")}

        def frac(partner, key, field):
            r = rows.get(partner)
            if r is None:
                skip = self.skipped.get(f"overlap/{partner}")
                if skip is None:
                    self.missing.append(f"overlap.{field} (benchmark overlap/{partner})")
                    return None
                return self.from_ref(f"overlap.{field}", skip.reason) or _q(
                    0.0, "fraction", f"not measured ({skip.reason}); 0 is a placeholder")
            v = r[key]
            note = f"; measured {v:+.1%}, clamped to 0 (noise)" if v < 0 else ""
            src = (f"{'measured' if not self.cpu else self.cpu_tag + ' (two threads)'}: bf16 GEMM stream beside "
                   f"{partner.replace('_', '-')} of {r['partner_bytes'] >> 20} MiB, interleaved launches, "
                   f"{r['world_size']} ranks; slowdown while overlapped (the stream ending last is credited its "
                   f"alone speed once the other ends){note}")
            return _q(max(v, 0.0), "fraction", src)

        return {
            "compute_slowdown_with_collective": frac("all_gather", "compute_slowdown", "compute_slowdown_with_collective"),
            "compute_slowdown_with_all_to_all": frac("all_to_all", "compute_slowdown", "compute_slowdown_with_all_to_all"),
            "compute_slowdown_with_copy": frac("host_copy", "compute_slowdown", "compute_slowdown_with_copy"),
            "collective_slowdown_with_compute": frac("all_gather", "other_slowdown", "collective_slowdown_with_compute"),
        }

    def _within_idle_and_cap(self, phase: str, watts: float, source: str, idle_w: float | None) -> dict:
        """A phase's measured power, taken at the enforced limit where it read above it, or at idle where it
        read below: a window's mean from the energy counter runs up to a percent past the limiter (a lent
        H100 read 702 W over a 3-s window at its 700 W limit), and the model's powers lie between the two."""
        cap_w = self.env.get("gpu_power_limit_w")
        if cap_w and watts > cap_w:
            return _q(cap_w, "W", f"{source}; read {watts:.1f} W, above the enforced limit: taken at the limit")
        if idle_w is not None and phase != "idle" and watts < idle_w:
            return _q(idle_w, "W", f"{source}; read {watts:.1f} W, below the idle window's: taken at idle")
        return _q(watts, "W", source)

    def power(self) -> dict:
        phases = {r["phase"]: r for r in self.family("power")}
        est = self.estimate

        def gpu_phase(phase):
            if self.cpu:
                idle_like = phase in ("idle", "wait")
                v = est.idle_w if idle_like else est.busy_w
                return _q(v, "W", f"{self.cpu_tag}: no GPU power meter; host CPU {'idle' if idle_like else 'busy'} "
                                  f"{est.basis}")
            r = phases.get(phase)
            if r is not None and r["gpu_power_w"] is not None:
                return self._within_idle_and_cap(
                    phase, r["gpu_power_w"], f"measured: NVML energy counter over {r['time_s']:.1f} s, "
                    f"{r.get('workload', r.get('cpu_work', ''))}, mean over {len(r['per_rank'])} GPU(s)",
                    phases.get("idle", {}).get("gpu_power_w"))
            skip = self.skipped.get(f"power/{phase}")
            ref = self.from_ref(f"power.gpu.{phase if phase != 'dense_compute' else 'compute'}",
                                skip.reason if skip else "not measured here")
            if ref is not None:
                return ref
            if skip is not None and phase == "collective" and phases.get("memory_bound", {}).get("gpu_power_w"):
                return _q(phases["memory_bound"]["gpu_power_w"], "W",
                          f"not measured ({skip.reason}); placeholder = measured memory-bound power")
            self.missing.append(f"power.gpu.{phase} (benchmark power/{phase}; NVML needed: pip install nvidia-ml-py)")
            return None

        gpu = {"idle": gpu_phase("idle"), "wait": gpu_phase("wait"), "compute": gpu_phase("dense_compute"),
               "memory_bound": gpu_phase("memory_bound"), "collective": gpu_phase("collective"),
               "host_copy": gpu_phase("host_copy"), "overlap": gpu_phase("overlap")}
        decay = (self.wait_decay(gpu["wait"]["value"]) if gpu["wait"] else None) or \
            self.from_ref("power.gpu.wait_decay", "not measured here")
        if decay is not None:  # absent, the model's waits draw `wait` (models.profile.GpuPower)
            gpu["wait_decay"] = decay
        idle, wait = phases.get("idle", {}), phases.get("wait", {})
        if idle.get("cpu_power_w") is not None and wait.get("cpu_power_w") is not None:
            sensor = idle["cpu_meter"]
            cpu = {"idle": _q(idle["cpu_power_w"], "W", f"measured: {sensor} over the idle window"),
                   "optimizer": _q(wait["cpu_power_w"], "W", f"measured: {sensor} while {wait.get('cpu_work')}"),
                   "measured": True, "sensor": sensor}
        else:
            cpu = {"idle": _q(est.idle_w, "W", f"absent sensor; {est.basis}"),
                   "optimizer": _q(est.busy_w, "W", f"absent sensor; {est.basis}"),
                   "measured": False, "sensor": "absent"}
        return {"gpu": gpu, "cpu": cpu, "nvml_scope": self.env.get("nvml_scope", "gpu")}

    def wait_decay(self, wait_w: float) -> dict | None:
        """The GPU's power after dense work (family wait_decay), fitted over its gaps toward `wait_w`;
        None where not measured."""
        rows = self.family("wait_decay")
        if not rows:
            return None
        fit = fit_wait_decay(rows[0]["series"], wait_w)
        source = (f"measured: NVML energy counter through gaps of {fit.gaps} lengths after "
                  f"{rows[0]['burst_s'] * 1e3:.0f} ms bf16 GEMM bursts")
        return {"decay_s": _q(fit.decay_s, "s", source + f", fitted from their own power ({fit.hot_w:.0f} W) "
                                                  f"toward power.gpu.wait ({wait_w:.0f} W)"),
                "burst_s": _q(rows[0]["burst_s"], "s", source + ", the bursts' length")}

    def memory(self) -> dict:
        rows = self.family("memory")
        if rows:
            fr = _q(rows[0]["framework_gib"], "GiB", "measured: device memory in use minus torch's reserved pool "
                    "after cuBLAS, SDPA and NCCL were loaded (largest over ranks)")
        else:
            fr = self.from_ref("memory.framework_reserved", "not measured here") or _q(
                0.0, "GiB", f"{self.cpu_tag}: no device memory" if self.cpu else
                "not measured (benchmark memory/framework_reserved failed); 0 is a placeholder")
        if self.carry_from is not None:
            return {"framework_reserved": fr, **carried_memory(self.carry_from)}
        return {"framework_reserved": fr, "fragmentation": _q(
            0.0, "fraction", "placeholder, not measured: fitted from real runs (calibration harness)")}

    def overheads(self, host: dict) -> dict:
        if self.carry_from is not None and not self.cpu:
            return carried_overheads(HostSpec.model_validate(host), self.env["gpus_per_node"], self.carry_from)
        out = {}
        for k, (v, unit) in NEUTRAL_OVERHEADS.items():
            out[k] = self.from_ref(f"overheads.{k}", "fitted from real runs, not microbenchmarks") or _q(
                v, unit, "placeholder, not measured: neutral value until fitted from short real DeepSpeed runs")
        return out

    def build(self) -> dict:
        env = self.env
        intra, inter = self.networks()
        profile = {
            "schema_version": SCHEMA_VERSION,
            "name": self.name,
            "provenance": {
                "kind": "cpu" if self.cpu else "measured",
                "date": env["date"], "machine": env["machine"], "gpu": env["gpu"] or "none (CPU profile)",
                "driver": env.get("driver"), "cuda": env.get("cuda"), "torch": env.get("torch"),
                "deepspeed": env.get("deepspeed"), "host_cpu": env.get("host_cpu"),
                "notes": self.notes(),
            },
            "gpus_per_node": _q(env["gpus_per_node"], "count", "ranks per node in the calibration run"),
            "gpu": self.gpu(), "host": self.host(), "intra_node": intra, "inter_node": inter,
            "overlap": self.overlap(), "power": self.power(), "memory": self.memory(),
        }
        if self.missing and self.ref is not None:
            unfilled = self._fill_unmeasured(profile, self.ref.model_dump(), "")
            self.missing = [f"{path} (not measured, and the reference has none)" for path in unfilled]
        if self.missing:
            raise MissingMeasurements(
                "cannot write the profile, these were not measured: " + "; ".join(self.missing) +
                ". Run the same command again to retry only what is missing (the raw file is kept), "
                "or pass --fill-from PROFILE to take them from another profile.")
        profile["overheads"] = self.overheads(profile["host"])  # rescaled by the host as measured (or filled)
        return profile

    def _fill_unmeasured(self, node: dict, ref: dict, path: str) -> list[str]:
        """Replace each None in `node` by the reference profile's value, labelled; return the
        paths the reference could not fill. This is what `--only FAMILY --fill-from PROFILE` uses."""
        unfilled = []
        for key, value in node.items():
            where = f"{path}.{key}" if path else key
            if key == "provenance":
                continue  # this calibration's own, never another's
            if value is None:
                if isinstance(ref, dict) and isinstance(ref.get(key), dict):
                    node[key] = relabel(ref[key], f"from profile '{self.ref.name}' (not measured in this calibration): ")
                else:
                    unfilled.append(where)
            elif isinstance(value, dict) and "source" not in value and isinstance(ref, dict) and key in ref:
                unfilled += self._fill_unmeasured(value, ref[key], where)
        return unfilled

    def notes(self) -> str:
        env = self.env
        parts = [f"advisor calibrate{' --quick' if env.get('quick') else ''}: {env['world_size']} rank(s) on "
                 f"{env.get('nodes', 1)} node(s); raw measurements in {self.raw_file}"]
        if env.get("nvml_scope_basis"):
            parts.append(f"NVML scope: {env.get('nvml_scope')} ({env['nvml_scope_basis']})")
        if self.failed:
            parts.append("failed: " + ", ".join(sorted(self.failed)))
        if self.skipped:
            parts.append("skipped: " + "; ".join(f"{k} ({r.reason})" for k, r in sorted(self.skipped.items())))
        return ". ".join(parts)


def build_profile(env: dict, results: dict[str, RawResult], **kwargs) -> dict:
    """A validated profile dict; raises MissingMeasurements or models.profile.ProfileError."""
    data = ProfileBuilder(env, results, **kwargs).build()
    parse_profile(data, origin=f"calibration of {env.get('machine')}")
    return data
