"""`advisor calibrate` and `advisor wheelhouse` (click). torch is imported only when they run."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import click

from advisor.inputs import FiniteFloatRange
from advisor.outputs import output_file, output_folder
from calibration import FAMILIES as FAMILY_CHOICES
from models.limits import MAX_GPUS_PER_NODE


def torchrun_argv(nproc: int, forwarded: list[str], python: str = sys.executable) -> list[str]:
    """One process per local GPU through torch.distributed.run (torchrun)."""
    return [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "calibration.calibrate", *forwarded]


def _forwarded(out, name, quick, fresh, cpu_adam, fill_from, cpu_tdp_w, cpu_idle_w, only) -> list[str]:
    args = ["--out", str(out), "--cpu-adam", cpu_adam]
    if name:
        args += ["--name", name]
    if quick:
        args.append("--quick")
    if fresh:
        args.append("--fresh")
    if fill_from:
        args += ["--fill-from", fill_from]
    if cpu_tdp_w is not None:
        args += ["--cpu-tdp-w", str(cpu_tdp_w)]
    if cpu_idle_w is not None:
        args += ["--cpu-idle-w", str(cpu_idle_w)]
    for fam in only:
        args += ["--only", fam]
    return args


@click.command("calibrate")
@click.option("--quick", is_flag=True, help="Small sizes: about 2-3 minutes on a GPU node.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Profile JSON to write; raw results go to PATH.raw.jsonl beside it. Default: NAME.json.")
@click.option("--name", default=None, help="Profile name (default: from the GPU model and count).")
@click.option("--gpus", type=click.IntRange(1, MAX_GPUS_PER_NODE), default=None,
              help="GPUs of this node to use (default: all). N>1 starts torchrun with N processes.")
@click.option("--fresh", is_flag=True, help="Ignore an existing raw file and measure everything again.")
@click.option("--cpu-adam", type=click.Choice(["auto", "deepspeed", "torch"]), default="auto", show_default=True,
              help="CPU optimizer to measure; auto = DeepSpeedCPUAdam (built at first use) on GPU nodes.")
@click.option("--fill-from", default=None, help="Profile (name or path) to take constants this machine cannot measure.")
@click.option("--cpu-tdp-w", type=FiniteFloatRange(min=0, min_open=True), default=None, help="Host CPU TDP for the CPU power estimate when no sensor exists.")
@click.option("--cpu-idle-w", type=FiniteFloatRange(min=0), default=None, help="Host CPU idle power for that estimate.")
@click.option("--only", multiple=True, type=click.Choice(FAMILY_CHOICES), help="Run only these benchmark families.")
def calibrate(quick, out, name, gpus, fresh, cpu_adam, fill_from, cpu_tdp_w, cpu_idle_w, only):
    """Measure this node's GPUs, host link, CPU optimizer, collectives, overlap and power; write a profile.

    About 5.5-6 minutes on one H100, real DeepSpeed steps of each one-GPU family included (DeepSpeed's
    overheads are fitted to them); 3.5 on 2 H200s, which time collectives instead of steps. Without
    a GPU it runs the same benchmarks on the CPU (gloo, small sizes, no power meter: about a minute
    on 2 cores) and writes a profile marked
    `cpu`, good for trying the tool, not for decisions. Interrupted runs resume: rerun the same
    command. For several nodes, start `python -m calibration.calibrate` under torchrun on each
    node (docs/CALIBRATION.md).
    """
    out = out or Path(f"{name or 'calibrated-profile'}.json")
    reads = (_fill_from_file(fill_from),) if fill_from else ()
    _check_cpu_power(cpu_tdp_w, cpu_idle_w)
    if importlib.util.find_spec("torch") is None:  # a laptop install: the arguments above were checked first
        raise click.ClickException("calibrate measures with PyTorch, which is not installed here: "
                                   "pip install 'energy-advisor[gpu]'")
    output_file(str(out), "--out", make_folder=True, reads=reads)  # its raw file is written from the first result
    forwarded = _forwarded(out, name, quick, fresh, cpu_adam, fill_from, cpu_tdp_w, cpu_idle_w, only)
    under_torchrun = "WORLD_SIZE" in os.environ and "RANK" in os.environ
    if not under_torchrun:
        import torch

        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
        nproc = gpus if gpus is not None else max(1, available)
        if available and nproc > available:
            raise click.BadParameter(f"asked for {nproc} GPUs, this node has {available}", param_hint="--gpus")
        if nproc > 1 and not available:
            click.echo(f"no GPU: running {nproc} CPU processes with gloo", err=True)
        if nproc > 1:
            argv = torchrun_argv(nproc, forwarded)
            click.echo("running: " + " ".join(argv), err=True)
            raise SystemExit(subprocess.run(argv, check=False).returncode)
    from calibration.calibrate import build_arg_parser, options_from_args, run

    result = run(options_from_args(build_arg_parser().parse_args(forwarded)))
    if result.interrupted:
        click.echo(f"Error: {result.error}", err=True)
        raise SystemExit(130)
    if result.error:
        raise click.ClickException(result.error)


def _fill_from_file(fill_from: str) -> Path:
    """The --fill-from profile's file, read now: a bad one fails before any measurement, not after."""
    from models.profile import ProfileError, load_profile, profile_path

    try:
        load_profile(fill_from)
    except ProfileError as exc:
        raise click.BadParameter(str(exc), param_hint="--fill-from") from None
    return profile_path(fill_from)


def _check_cpu_power(cpu_tdp_w: float | None, cpu_idle_w: float | None) -> None:
    """An idle power below the busy power it is an estimate beside (the TDP given, else the cores')."""
    if cpu_idle_w is None:
        return
    from calibration.cpu_power import estimate_cpu_power

    cores = os.cpu_count() or 1
    estimate = estimate_cpu_power(cores, cpu_tdp_w, cpu_idle_w)
    if estimate.idle_w >= estimate.busy_w:
        busy = f"--cpu-tdp-w {cpu_tdp_w:g} W" if cpu_tdp_w else f"the {estimate.busy_w:g} W estimated for {cores} cores"
        raise click.BadParameter(f"{cpu_idle_w:g} W is not below {busy}; idle power is less than busy power",
                                 param_hint="--cpu-idle-w")


@click.command("wheelhouse")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option("--python-version", default=f"{sys.version_info.major}.{sys.version_info.minor}", show_default=True,
              help="Python version of the offline node, e.g. 3.12.")
@click.option("--platform", "platforms", multiple=True,
              help="pip platform tag of the node (repeatable). Default: manylinux tags for --arch.")
@click.option("--arch", type=click.Choice(["x86_64", "aarch64"]), default="x86_64", show_default=True,
              help="x86_64, or aarch64 for GH200 nodes.")
@click.option("--deepspeed-version", default=None, help="Default: the installed DeepSpeed's version.")
@click.option("--extra", multiple=True, help="More packages to download (repeatable).")
@click.option("--dry-run", is_flag=True, help="Print the commands without running them.")
def wheelhouse(out_dir, python_version, platforms, arch, deepspeed_version, extra, dry_run):
    """Build a directory of wheels to install calibration and real runs on an offline node."""
    from calibration import wheelhouse as wh
    from calibration.environment import package_version

    version = deepspeed_version or package_version("deepspeed")
    if not version:
        raise click.BadParameter("DeepSpeed is not installed here; pass --deepspeed-version", param_hint="--deepspeed-version")
    platforms = list(platforms) or wh.default_platforms(arch)
    wh.check_target(python_version, version, platforms, tuple(extra))
    steps = wh.plan(out_dir, python_version=python_version, platforms=platforms, deepspeed_version=version,
                    extra=tuple(extra))
    if dry_run:
        for s in steps:
            click.echo(" ".join([*(f"{k}={v}" for k, v in s.env.items()), *s.argv]))
        return
    output_folder(str(out_dir), "--out")
    try:
        wh.run_plan(steps, echo=lambda m: click.echo(m, err=True))
    except subprocess.CalledProcessError as exc:
        raise click.ClickException(f"command failed ({exc.returncode}): {' '.join(map(str, exc.cmd))}") from None
    note = wh.write_readme(out_dir, steps)
    click.echo(f"wheelhouse ready in {out_dir}; install on the node with:\n  {wh.install_command(out_dir)}\n({note})")
