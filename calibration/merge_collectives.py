"""Put the collectives of one calibration's raw file into an existing profile, by group size.

    python -m calibration.merge_collectives RAW.jsonl --into data/profiles/h200.json [--out PATH]

A profile fitted to real runs should not be recalibrated from scratch to learn how collectives
behave on a bigger node: this keeps every other constant (and its fit) and replaces the
intra-node alpha-beta constants with those measured in RAW at each group size (2, 4, 8 ...),
the node-wide group as the headline values. Sources name RAW and the group of each point.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from calibration.fitting import COLLECTIVE_OPS
from calibration.profile_writer import ProfileBuilder, relabel
from calibration.rawlog import read_raw
from models.profile import load_profile, parse_profile


def merged_profile(raw_path: str | Path, profile: str | Path) -> dict:
    """The profile at `profile` with its intra-node collectives taken from `raw_path`."""
    raw_path = Path(raw_path)
    header, results = read_raw(raw_path)
    base = load_profile(str(profile))
    env = {"kind": "measured", "host_cores": base.host.cores.value, "gpus_per_node": header["gpus_per_node"]}
    builder = ProfileBuilder(env, results, name=base.name, raw_file=raw_path.name)
    sizes = sorted({r["group_size"] for r in builder.family("collective") if r["scope"] == "intra"})
    if not sizes or sizes[-1] < 2:
        raise ValueError(f"{raw_path}: no intra-node collective of two or more ranks to merge")
    data = base.model_dump()
    for op in COLLECTIVE_OPS:
        measured = builder.intra_collective(op, sizes[-1])
        if measured is None:
            raise ValueError(f"{raw_path}: {'; '.join(builder.missing)}")
        data["intra_node"][op] = relabel(measured, f"{raw_path.name}: ")
    data["provenance"]["notes"] += (f" Intra-node collectives replaced by those measured at group sizes "
                                    f"{', '.join(map(str, sizes))} in {raw_path.name} ({header.get('started', '?')}, "
                                    f"{header.get('gpus_per_node')} GPUs of {header.get('device')}).")
    parse_profile(data, origin=f"{profile} + {raw_path.name}")
    return data


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("raw", help="raw JSONL of an `advisor calibrate --only collective` run")
    p.add_argument("--into", required=True, help="profile (name or JSON path) to take everything else from")
    p.add_argument("--out", help="where to write (default: over --into when it is a path)")
    args = p.parse_args(argv)
    out = Path(args.out or args.into)
    if out.suffix != ".json":
        p.error("--out must be a .json path when --into is a profile name")
    out.write_text(json.dumps(merged_profile(args.raw, args.into), indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
