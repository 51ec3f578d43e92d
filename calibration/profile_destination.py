"""Where a command that updates a profile reads it and writes it: `--into` and `--out`, one owner for
`calibration.merge` and `calibration.optimizer_step`."""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--into", required=True, help="profile (name or JSON path) to take everything else from")
    p.add_argument("--out", help="where to write (default: over --into when it is a path)")


def out_path(p: argparse.ArgumentParser, args: argparse.Namespace) -> Path:
    """--out, or --into where it is a path; a usage error where neither is a .json path."""
    out = Path(args.out or args.into)
    if out.suffix != ".json":
        p.error("--out must be a .json path when --into is a profile name")
    return out


def write(data: dict, out: Path) -> None:
    out.write_text(json.dumps(data, indent=2) + "\n")
