"""A profile for a machine nobody has calibrated yet, from one recipe: a measured (and fitted)
reference profile, scaled by the ratios of two datasheets.

    python -m calibration.derive --reference h200 --datasheet gh200 --out models/profiles/gh200.json

What a datasheet states (bf16 peak, HBM, NVLink, host link, host memory bandwidth, capacities,
the power cap) enters as the ratio target / reference applied to the reference's *measured*
figure, so the measured share of peak carries over. What no datasheet states (overlap slowdowns,
efficiencies, DeepSpeed's overheads, fragmentation, power per phase) is the reference's own
measured or fitted value. Every constant says which rule made it; rerunning the command on the
same inputs writes the same file.
"""
from __future__ import annotations

import argparse
import json
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from models.profile import (
    BytesPerSecond,
    Count,
    FlopsPerSecond,
    GiB,
    HardwareProfile,
    ProfileError,
    Quantity,
    Watts,
    load_profile,
    parse_profile,
)

# The shipped datasheets (NAME.json), package data: `calibration.derive --datasheet NAME` reads them.
DATASHEETS = resources.files(__package__) / "datasheets"
NETWORK_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


class Datasheet(BaseModel):
    """A machine's published figures. The reference's sheet needs only the four that ratios use."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    machine: str
    gpu: str
    host_cpu: str
    host_link: Literal["pcie", "c2c"]
    nvml_scope: Literal["gpu", "module"]
    bf16_dense_flops: FlopsPerSecond
    hbm_bandwidth: BytesPerSecond
    gpu_link: BytesPerSecond  # NVLink (or other GPU-GPU link) each way per GPU
    host_link_bandwidth: BytesPerSecond  # host-device link each way per GPU
    gpus_per_node: Count
    power_cap: Watts
    gpu_memory_gib: GiB | None = None
    inter_node_link: BytesPerSecond | None = None  # network each way per GPU
    host_cores: Count | None = None
    host_memory_gib: GiB | None = None
    host_memory_bandwidth: BytesPerSecond | None = None
    module_host_idle: Watts | None = None  # the CPU's idle power inside a module-scope GPU meter
    cpu_idle: Watts | None = None
    cpu_optimizer: Watts | None = None
    # The target's host is the reference's kind (say, the same workplace's VMs beside another GPU): its
    # measured host figures (memory bandwidth, CPUAdam and the cast against threads) carry over as
    # measured, where otherwise they are rebuilt from the datasheet's memory bandwidth without curves.
    host_as_reference: bool = False


class DeriveError(ValueError):
    """Inputs the recipe cannot use; the message is one line for the user."""


def load_datasheet(name_or_path: str | Path) -> Datasheet:
    """A shipped datasheet by name (`gh200`), or any datasheet JSON by path."""
    path = Path(name_or_path)
    if path.suffix != ".json":
        path = DATASHEETS / f"{name_or_path}.json"
    try:
        return Datasheet.model_validate(json.loads(path.read_text()))
    except FileNotFoundError:
        raise DeriveError(f"datasheet not found: {path}") from None
    except (json.JSONDecodeError, ValidationError) as exc:
        raise DeriveError(f"{path}: not a datasheet ({str(exc).splitlines()[0]})") from None


def _target_only(sheet: Datasheet, *names: str) -> None:
    missing = [n for n in names if getattr(sheet, n) is None]
    if missing:
        raise DeriveError(f"datasheet '{sheet.name}' lacks {', '.join(missing)}, which the target's profile needs")


# How a decoder layer's memory-bound kernels (norms, RoPE, activations, casts) follow HBM bandwidth: their
# time as (HBM ratio)^-0.45, not ^-1. Calibrated on a lent H100 (2026-12-06) against the h200 profile, the
# eight elementwise widths moved 0.75-0.97 (median 0.83) of H200's bytes at 0.71 of its measured HBM rate:
# 1.17x H200's time where the HBM ratio says 1.41x (kernels of a few MB are partly latency-bound).
# tests/calibration/test_cal_derive.py recomputes it from the two calibrations.
ELEMENTWISE_HBM_EXPONENT = 0.45


def elementwise_bytes(measured: dict, hbm_ratio: float, origin: str) -> dict:
    """An elementwise width's bytes for a GPU of `hbm_ratio` times the reference's HBM bandwidth: scaled so
    its time goes as hbm_ratio ** -ELEMENTWISE_HBM_EXPONENT (the model divides bytes by the HBM rate)."""
    factor = hbm_ratio ** (1.0 - ELEMENTWISE_HBM_EXPONENT)
    return dict(measured, value=measured["value"] * factor,
                source=f"derived: {origin} x {factor:.4g} = (HBM ratio {hbm_ratio:.4g}) ^ (1 - "
                       f"{ELEMENTWISE_HBM_EXPONENT}), the exponent an H100 calibration measured against H200's: "
                       f"{measured['source']}")


def derive_profile(reference: HardwareProfile, ref_sheet: Datasheet, sheet: Datasheet, date: str) -> HardwareProfile:
    """`sheet`'s machine as `reference` measured it, scaled by the datasheets' ratios."""
    _target_only(sheet, "gpu_memory_gib", "inter_node_link", "host_cores", "host_memory_gib", "cpu_idle", "cpu_optimizer",
                 *(() if sheet.host_as_reference else ("host_memory_bandwidth",)))
    if sheet.nvml_scope == "module" and sheet.module_host_idle is None:
        raise DeriveError(f"datasheet '{sheet.name}' has a module-scope meter but no module_host_idle")
    ref = reference.model_dump()
    origin = f"the {reference.name} profile ({reference.provenance.kind}, {reference.provenance.date})"

    def datasheet(q: Quantity) -> dict:
        return q.model_dump()

    def scaled(measured: dict, ratio_of: str) -> dict:
        """The reference's figure times the datasheets' ratio for `ratio_of`."""
        t, r = getattr(sheet, ratio_of), getattr(ref_sheet, ratio_of)
        ratio = t.value / r.value
        rule = (f"derived: {origin} x {ratio:.4g}, the datasheet ratio of {ratio_of} "
                f"({sheet.name} {t.value:.4g} / {ref_sheet.name} {r.value:.4g} {t.unit}); there: {measured['source']}")
        if "y" in measured:
            return dict(measured, y=[y * ratio for y in measured["y"]], source=rule)
        return dict(measured, value=measured["value"] * ratio, source=rule)

    def carried(measured: dict) -> dict:
        return dict(measured, source=f"from {origin}, no datasheet figure: {measured['source']}")

    gpu = ref["gpu"]
    gpu.update(
        name=sheet.gpu, memory_gib=datasheet(sheet.gpu_memory_gib), power_cap=datasheet(sheet.power_cap),
        gemm_bf16=scaled(gpu["gemm_bf16"], "bf16_dense_flops"),
        attention_fwd_bf16=scaled(gpu["attention_fwd_bf16"], "bf16_dense_flops"),
        attention_bwd_bf16=scaled(gpu["attention_bwd_bf16"], "bf16_dense_flops"),
        hbm_bandwidth=scaled(gpu["hbm_bandwidth"], "hbm_bandwidth"),
    )
    for ratio in ("attention_fwd_head_dim_ratio", "attention_bwd_head_dim_ratio"):
        if gpu.get(ratio):  # the same kernels on the same architecture (Hopper): no datasheet figure
            gpu[ratio] = carried(gpu[ratio])
    hbm_ratio = sheet.hbm_bandwidth.value / ref_sheet.hbm_bandwidth.value
    for block in ("layer_elementwise", "vision_elementwise"):  # the same kernels: their time follows HBM in part
        if gpu.get(block):
            gpu[block] = {k: elementwise_bytes(v, hbm_ratio, origin) for k, v in gpu[block].items() if v is not None}
    if gpu.get("optimizer_step_bytes_per_param"):  # the same step's kernels, as bytes: likewise
        gpu["optimizer_step_bytes_per_param"] = carried(gpu["optimizer_step_bytes_per_param"])
    host = ref["host"]
    host.update(cpu=sheet.host_cpu, cores=datasheet(sheet.host_cores), memory_gib=datasheet(sheet.host_memory_gib),
                link=sheet.host_link, h2d=scaled(host["h2d"], "host_link_bandwidth"),
                d2h=scaled(host["d2h"], "host_link_bandwidth"))
    if sheet.host_as_reference:  # the same kind of host: what it measured carries over as measured
        host.update({key: carried(host[key]) if host.get(key) else None for key in
                     ("memory_bandwidth", "cpu_adam", "cpu_adam_threads", "param_cast_threads",
                      "param_direct_upload_threads")})
    else:
        # CPUAdam is memory-bound: the reference's params/s per byte/s of its measured host memory
        # bandwidth, at the target's datasheet bandwidth (an upper bound: peak, not measured).
        adam_per_byte = reference.host.cpu_adam.value / reference.host.memory_bandwidth.value
        host.update(
            memory_bandwidth=datasheet(sheet.host_memory_bandwidth),
            cpu_adam=dict(host["cpu_adam"], value=adam_per_byte * sheet.host_memory_bandwidth.value,
                          source=f"derived: {origin}'s CPUAdam rate per byte/s of its measured host memory bandwidth "
                                 f"({adam_per_byte:.4g} params per byte) x the datasheet's "
                                 f"{sheet.host_memory_bandwidth.value:.4g} bytes/s (peak: an upper bound); not measured"),
            cpu_adam_threads=None,  # a thread's speed is the core's: the reference's curve does not carry over
            # The same for the parameter cast (then taken from the datasheet's memory bandwidth); the direct
            # copy through pageable memory is a property of the host link (PCIe here, NVLink-C2C there): it
            # does not carry over either, and is taken as the cast plus a pinned upload (not measured).
            param_cast_threads=None,
            param_direct_upload_threads=None,
        )
    if host.get("issue_per_layer"):  # the host's single-thread issue speed: no datasheet figure, the reference's own
        host["issue_per_layer"] = carried(host["issue_per_layer"])
    for key in ("pass_issue", "zero3_hook_pass"):  # each pass's share of the host's work: torch's and DeepSpeed's code, no datasheet figure
        if host.get(key):
            host[key] = {k: carried(v) for k, v in host[key].items()}
    intra = {op: _scaled_collective(ref["intra_node"][op], sheet.gpu_link.value / ref_sheet.gpu_link.value,
                                    f"derived: {origin}'s intra-node {op} x {sheet.gpu_link.value / ref_sheet.gpu_link.value:.4g}, "
                                    f"the datasheet ratio of GPU links ({sheet.gpu_link.value:.4g} / {ref_sheet.gpu_link.value:.4g} bytes/s)", origin)
             for op in NETWORK_OPS}
    inter_ratio = sheet.inter_node_link.value / ref_sheet.gpu_link.value
    inter = {op: _scaled_collective(ref["intra_node"][op], inter_ratio,
                                    f"derived: {origin}'s intra-node {op} x {inter_ratio:.4g}, the ratio of {sheet.name}'s "
                                    f"network per GPU to {ref_sheet.name}'s GPU link ({sheet.inter_node_link.value:.4g} / "
                                    f"{ref_sheet.gpu_link.value:.4g} bytes/s)", origin)
             for op in NETWORK_OPS}
    extra_w = sheet.module_host_idle.value if sheet.nvml_scope == "module" else 0.0
    cap = sheet.power_cap.value

    def derived_watts(q: dict) -> dict:
        watts = min(cap, q["value"] + extra_w)
        rule = f"from {origin}: {q['value']:.0f} W"
        if extra_w:
            rule += f" + the CPU's idle {extra_w:.0f} W inside the module meter ({sheet.module_host_idle.source})"
        if watts == cap:
            rule += f", capped at {cap:.0f} W"
        return dict(q, value=watts, source=f"{rule}; there: {q['source']}")

    gpu_power = {phase: derived_watts(q) for phase, q in ref["power"]["gpu"].items() if phase != "wait_decay"}
    decay = ref["power"]["gpu"].get("wait_decay")
    if decay is not None:  # how fast the power falls after work: no datasheet figure, the reference's own
        gpu_power["wait_decay"] = {key: dict(q, source=f"from {origin} (no datasheet figure); there: {q['source']}")
                                   for key, q in decay.items()}
    power = {
        "gpu": gpu_power,
        "cpu": {"idle": datasheet(sheet.cpu_idle), "optimizer": datasheet(sheet.cpu_optimizer), "measured": False,
                "sensor": f"none: derived profile ({sheet.name} datasheet); calibrate to measure"},
        "nvml_scope": sheet.nvml_scope,
    }
    data = dict(
        ref,
        name=sheet.name,
        provenance={
            "kind": "derived", "date": date, "machine": sheet.machine, "gpu": sheet.gpu, "driver": None, "cuda": None,
            "torch": None, "deepspeed": None, "host_cpu": sheet.host_cpu,
            "notes": (f"Derived by `python -m calibration.derive` from {origin}: {reference.provenance.notes[:200]} "
                      f"Datasheet figures ({sheet.name} over {ref_sheet.name}) scale the reference's measurements; "
                      "what no datasheet states (overlap, efficiencies, DeepSpeed's overheads, fragmentation, power "
                      "per phase) is the reference's. Not measured on this machine: run `advisor calibrate` there."),
        },
        gpus_per_node=datasheet(sheet.gpus_per_node), gpu=gpu, host=host,
        intra_node=intra, inter_node=inter, power=power,
        overlap={k: carried(v) for k, v in ref["overlap"].items()},
        overheads={k: (carried(v) if v is not None else None) for k, v in ref["overheads"].items()},
        memory={k: (carried(v) if v is not None else None) for k, v in ref["memory"].items()},
        fit=None,
    )
    try:
        return parse_profile(data, origin=f"{sheet.name} derived from {reference.name}")
    except ProfileError as exc:
        raise DeriveError(str(exc)) from None


def _scaled_collective(measured: dict, ratio: float, rule: str, origin: str) -> dict:
    """An alpha-beta collective with every bus bandwidth (each group size too) times `ratio`; the
    alphas (latency, which no datasheet states) as measured."""

    def at(point: dict) -> dict:
        return dict(point, alpha=dict(point["alpha"], source=f"from {origin}, no datasheet figure: {point['alpha']['source']}"),
                    bus_bandwidth=dict(point["bus_bandwidth"], value=point["bus_bandwidth"]["value"] * ratio,
                                       source=f"{rule}; there: {point['bus_bandwidth']['source']}"))

    return dict(at(measured), by_group_size=[at(p) for p in measured["by_group_size"]])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reference", required=True, help="measured or fitted profile (name or JSON path)")
    p.add_argument("--reference-datasheet", help="the reference machine's datasheet (default: the shipped datasheet of the reference's name)")
    p.add_argument("--datasheet", required=True, help="the target machine's datasheet (name or JSON path)")
    p.add_argument("--date", required=True, help="the date to record (YYYY-MM-DD): the same inputs give the same file")
    p.add_argument("--out", required=True, help="profile JSON to write")
    args = p.parse_args(argv)
    try:
        reference = load_profile(args.reference)
        if reference.provenance.kind not in ("measured", "fitted"):
            raise DeriveError(f"{args.reference} is a {reference.provenance.kind} profile: derive from a measured one")
        ref_sheet = load_datasheet(args.reference_datasheet or reference.name)
        profile = derive_profile(reference, ref_sheet, load_datasheet(args.datasheet), args.date)
    except (DeriveError, ProfileError) as exc:
        raise SystemExit(f"error: {exc}") from None
    Path(args.out).write_text(profile.to_json() + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
