"""Put what one calibration's raw file measured into an existing profile, keeping the rest.

    python -m calibration.merge RAW.jsonl [RAW2.jsonl ...] --into models/profiles/h200.json [--out PATH]

Several raw files are one machine's repeated runs, pooled: each family's median is taken over the
rows of all of them.

A profile fitted to real runs should not be recalibrated from scratch to learn one more thing:
this keeps every other constant (and its fit) and replaces what RAW measured. Collectives: the
intra-node alpha-beta constants at each group size (2, 4, 8 ...), the node-wide group as the
headline values. The CPU optimizer on all cores: `host.cpu_adam` and `host.cores`; against threads:
`host.cpu_adam_threads`; the parameter refresh
against threads: `host.param_cast_threads`, `host.param_direct_upload_threads`; the GPU's power
through waits after dense work: `power.gpu.wait_decay` (toward the profile's `wait`); the host's issue
time: `host.issue_per_layer` (the issue constants then scale with it), and of each pass of a layer:
`host.pass_issue`, and ZeRO-3's hooks in each pass: `host.zero3_hook_pass`; attention at
head dims besides 128: `gpu.attention_{fwd,bwd}_head_dim_ratio`; a decoder layer's elementwise
kernels: `gpu.layer_elementwise`, and a ViT block's: `gpu.vision_elementwise` (both at the profile's HBM
bandwidth). Sources name RAW.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from calibration import profile_destination
from calibration.fitting import COLLECTIVE_OPS
from calibration.profile_writer import ProfileBuilder, relabel
from calibration.rawlog import RawLogMismatch, read_raw
from models.profile import load_profile, parse_profile


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]  # str.capitalize would lower "ZeRO"


def _read(path: Path) -> tuple[dict, dict]:
    try:
        return read_raw(path)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not a calibration raw file (JSON lines of `advisor calibrate`): {exc}") from None


def _pooled_raw(raw_paths: list[Path]) -> tuple[dict, dict]:
    """The header and results of one raw file, or of several runs of one machine pooled: each row
    kept, so a family's median is taken over all of them (lent hosts drift between runs)."""
    runs = [_read(path) for path in raw_paths]
    if len(runs) == 1:
        return runs[0]
    header = runs[0][0]
    for path, (other, _) in zip(raw_paths[1:], runs[1:]):
        if (other.get("device"), other.get("gpus_per_node")) != (header.get("device"), header.get("gpus_per_node")):
            raise ValueError(f"{path}: measured on {other.get('gpus_per_node')} x {other.get('device')}, "
                             f"{raw_paths[0]} on {header.get('gpus_per_node')} x {header.get('device')}: not one machine's runs")
    return header, {f"{path.name}:{key}": result for path, (_, results) in zip(raw_paths, runs)
                    for key, result in results.items()}


def merged_profile(raw_path: str | Path | list[str | Path], profile: str | Path) -> dict:
    """The profile at `profile` with what `raw_path` (one raw file, or several runs pooled) measured
    of the families merged here."""
    raw_paths = [Path(p) for p in (raw_path if isinstance(raw_path, list) else [raw_path])]
    header, results = _pooled_raw(raw_paths)
    label = " + ".join(p.name for p in raw_paths)
    base = load_profile(str(profile))
    env = {"kind": "measured", "host_cores": base.host.cores.value, "gpus_per_node": header["gpus_per_node"],
           "host_cpu": base.host.cpu, "host_memory_gib": base.host.memory_gib.value, "link": base.host.link}
    builder = ProfileBuilder(env, results, name=base.name, raw_file=label)
    data, merged = base.model_dump(), []
    sizes = sorted({r["group_size"] for r in builder.family("collective") if r["scope"] == "intra"})
    if sizes and sizes[-1] >= 2:
        for op in COLLECTIVE_OPS:
            measured = builder.intra_collective(op, sizes[-1])
            if measured is None:
                raise ValueError(f"{label}: {'; '.join(builder.missing)}")
            data["intra_node"][op] = relabel(measured, f"{label}: ")
        merged.append(f"intra-node collectives at group sizes {', '.join(map(str, sizes))}")
    host = builder.host()
    if host.get("cpu_adam"):  # the all-core rate the node's ranks share, and the cores it ran on
        all_cores = builder.family("cpu_adam")[0]["threads"]
        data["host"]["cpu_adam"] = relabel(host["cpu_adam"], f"{label}, on {header.get('device')}: ")
        data["host"]["cores"] = {"value": float(all_cores), "unit": "count",
                                 "source": f"{label}: the cores its all-core CPUAdam step ran on"}
        merged.append("the CPU optimizer on all the host's cores, and their count")
    for key, what in (("cpu_adam_threads", "the CPU optimizer against threads"),
                      ("param_cast_threads", "the parameter cast against threads"),
                      ("param_direct_upload_threads", "the direct parameter upload against threads"),
                      ("issue_per_layer", "the host's issue time per layer"),
                      ("pass_issue", "the host's issue time of each pass"),
                      ("zero3_hook_pass", "ZeRO-3's hooks in each pass")):
        if host.get(key):
            data["host"][key] = relabel(host[key], f"{label}, on {header.get('device')}: ")
            merged.append(what)
    for family, fit_of, least, what in (
            ("layer_elementwise", builder.layer_elementwise, "3 decoder layers", "the decoder layer's elementwise kernels"),
            ("vision_elementwise", builder.vision_elementwise, "2 ViT blocks", "the ViT block's elementwise kernels")):
        if builder.family(family):
            fitted = fit_of(base.gpu.hbm_bandwidth.value)
            if fitted is None:
                raise ValueError(f"{label}: fewer than {least} measured (calibration family {family})")
            data["gpu"][family] = relabel(fitted, f"on {header.get('device')}: ")
            merged.append(what)
    if builder.family("wait_decay"):
        decay = builder.wait_decay(base.power.gpu.wait.value)
        data["power"]["gpu"]["wait_decay"] = relabel(decay, f"{label}, on {header.get('device')}: ")
        merged.append("the GPU's power through waits after dense work")
    ratios = builder.head_dim_ratios("measured")
    for key, curve in ratios.items():
        data["gpu"][key] = relabel(curve, f"{label}, on {header.get('device')}: ")
    if ratios:
        merged.append("attention's rate against head dim")
    if not merged:
        raise ValueError(f"{label}: nothing to merge (collectives of two or more ranks, CPUAdam or the "
                         "parameter refresh against threads, the host's issue time (per layer or per pass), ZeRO-3's hooks per pass, the wait decay, attention at head dims besides 128, "
                         "decoder layers' or ViT blocks' elementwise kernels)")
    data["provenance"]["notes"] += (f" {_sentence('; '.join(merged))} replaced by those measured in {label} "
                                    f"({header.get('started', '?')}, {header.get('gpus_per_node')} GPUs of "
                                    f"{header.get('device')}).")
    parse_profile(data, origin=f"{profile} + {label}")
    return data


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("raw", nargs="+", help="raw JSONL (several: one machine's runs, pooled) of an `advisor calibrate --only collective` (or cpu_adam_threads, "
                               "param_refresh, host_issue, pass_issue, zero3_hooks, wait_decay, attention, layer_elementwise, vision_elementwise) run")
    profile_destination.add_arguments(p)
    args = p.parse_args(argv)
    out = profile_destination.out_path(p, args)
    try:
        merged = merged_profile(args.raw, args.into)
        profile_destination.write(merged, out)
    except (OSError, ValueError, RawLogMismatch) as exc:  # missing or unreadable files, nothing to merge
        raise SystemExit(f"error: {' '.join(str(exc).split())}") from None
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
