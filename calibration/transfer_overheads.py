"""Copy DeepSpeed's fitted overhead terms from a fitted profile into a profile of another machine.

    python -m calibration.transfer_overheads --from data/profiles/h200.json --into data/profiles/gh200.json

A datasheet profile (gh200) has no real runs to fit DeepSpeed's host-side costs to; zero would
predict small models and ZeRO-3 far too fast. The host-side terms of a fitted profile are the
best stand-in until the machine is calibrated; each copied constant says where it came from and
that it was not measured there. Efficiencies stay: they belong to the other machine's curves.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from models.profile import load_profile, parse_profile

TRANSFERRED = tuple(f"overheads.{name}" for name in (
    "step", "layer_pass", "zero3_module_pass", "host_sync_per_doubling", "offload_step_per_gparam",
    "super_offload_step_per_gparam")) + ("memory.host_process_per_rank",)


def transferred_profile(source: str | Path, target: str | Path) -> dict:
    """`target` with the overhead terms in TRANSFERRED taken from the fitted profile `source`."""
    fitted = load_profile(str(source))
    if fitted.fit is None:
        raise ValueError(f"{source} is {fitted.provenance.kind}, not fitted: nothing learnt from real runs to transfer")
    what = (f"transferred from the {fitted.name} profile's fit to {len(fitted.fit.run_ids)} real DeepSpeed "
            f"{fitted.provenance.deepspeed} runs on {fitted.provenance.gpu} with {fitted.provenance.host_cpu} "
            f"({fitted.provenance.date}): DeepSpeed's host-side cost and a process's own host memory, assumed "
            "similar here; not measured on this machine")
    data = load_profile(str(target)).model_dump()
    for name in TRANSFERRED:
        section, key = name.split(".")
        data[section][key] = dict(getattr(getattr(fitted, section), key).model_dump(), source=what)
    note = f" DeepSpeed overhead terms ({', '.join(TRANSFERRED)}) are transferred from the {fitted.name} fit"
    notes = data["provenance"]["notes"]
    data["provenance"]["notes"] = (notes.split(" DeepSpeed overhead terms (")[0]
                                   + note + ", not measured on this machine.")
    parse_profile(data, origin=f"{target} + overheads of {source}")
    return data


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--from", dest="source", required=True, help="fitted profile (name or JSON path)")
    p.add_argument("--into", required=True, help="profile JSON path to update in place")
    args = p.parse_args(argv)
    out = Path(args.into)
    out.write_text(json.dumps(transferred_profile(args.source, out), indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
