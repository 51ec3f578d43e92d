"""A wheelhouse for offline nodes: everything calibration and the real runs need, as wheels.

HPC compute nodes are often offline, and DeepSpeed ships only as an sdist. Built on a
machine with network access, the wheelhouse installs on the node with
    pip install --no-index --find-links DIR energy-advisor deepspeed
PyTorch itself is not included (it comes from the site's module or container).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

# DeepSpeed's runtime requirements (besides torch), and pydantic's own.
RUNTIME_PACKAGES = (
    "pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions",
    "hjson", "msgpack", "ninja", "py-cpuinfo", "psutil", "einops", "tqdm", "nvidia-ml-py", "packaging",
)
OLDEST_PYTHON_MINOR = 10  # pyproject's requires-python: >=3.10
# pip matches manylinux_2_N tags exactly (it expands only manylinux2014/2010), so list several.
MANYLINUX_GLIBC = (17, 24, 27, 28, 31, 34)
PROJECT_DIR = Path(__file__).resolve().parent.parent  # the checkout's root, where this runs from one


class NoProjectSource(ValueError):
    """The advisor's own wheel is built from its source, and an advisor installed from a wheel has none."""


def project_source(project_dir: Path = PROJECT_DIR) -> Path:
    """The folder whose pyproject.toml builds the advisor's wheel; NoProjectSource where there is none."""
    if not (project_dir / "pyproject.toml").is_file():
        raise NoProjectSource(f"advisor wheelhouse builds the advisor's own wheel from its source, and this "
                              f"advisor was installed without it ({project_dir} has no pyproject.toml): run it "
                              "from a checkout of the repository")
    return project_dir


def default_platforms(arch: str = "x86_64") -> list[str]:
    """manylinux2014 and manylinux_2_N tags for an architecture (x86_64 or aarch64 for GH200)."""
    return [f"manylinux2014_{arch}"] + [f"manylinux_2_{n}_{arch}" for n in MANYLINUX_GLIBC]


class WheelhouseError(ValueError):
    """A wheelhouse target that pip would take, or fail on, in ways that build nothing usable."""


def check_target(python_version: str, deepspeed_version: str, platforms: list[str], extra: tuple[str, ...]) -> None:
    """The node's Python (3.10 or newer, as MAJOR.MINOR), a DeepSpeed version pip can name, pip platform
    tags and requirement specifiers: checked before pip runs, which took `abc`, `2.7`, `sparc` and
    "not a version" and printed commands that could only fail."""
    match = re.fullmatch(r"3\.(\d{1,2})", python_version)
    if not match or int(match.group(1)) < OLDEST_PYTHON_MINOR:
        raise WheelhouseError(f"bad --python-version '{python_version}': give the node's Python as MAJOR.MINOR, "
                              f"3.{OLDEST_PYTHON_MINOR} or newer (the advisor's own minimum), e.g. 3.12")
    try:
        Version(deepspeed_version)
    except InvalidVersion:
        raise WheelhouseError(f"bad --deepspeed-version '{deepspeed_version}': not a version, e.g. 0.19.8") from None
    for tag in platforms:
        if not re.fullmatch(r"[a-z0-9]+(_[a-z0-9.]+)+", tag):
            raise WheelhouseError(f"bad --platform '{tag}': a pip platform tag, e.g. manylinux2014_aarch64")
    for spec in extra:
        try:
            Requirement(spec)
        except InvalidRequirement:
            raise WheelhouseError(f"bad --extra '{spec}': not a package requirement, e.g. flash-attn==2.7.4") from None


def project_dependencies(project_dir: Path = PROJECT_DIR) -> list[str]:
    """[project].dependencies of this project's pyproject.toml."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    data = tomllib.loads((project_dir / "pyproject.toml").read_text())
    return list(data["project"].get("dependencies", []))


@dataclass(frozen=True)
class Step:
    """One command of the build, with the environment variables it adds."""

    description: str
    argv: tuple[str, ...]
    env: dict = field(default_factory=dict)


def plan(out_dir: Path, *, python_version: str, platforms: list[str], deepspeed_version: str,
         project_dir: Path = PROJECT_DIR, extra: tuple[str, ...] = (), python: str = sys.executable) -> list[Step]:
    """The commands that build the wheelhouse; `run_plan` executes them."""
    project_dir = project_source(project_dir)
    pip = (python, "-m", "pip")
    out = str(out_dir)
    target = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
    for p in platforms:
        target += ["--platform", p]
    wanted = list(RUNTIME_PACKAGES) + project_dependencies(project_dir) + list(extra)
    return [
        Step("the advisor's own wheel (pure Python, with its presets, profiles and datasheets)",
             (*pip, "wheel", "--no-deps", "--wheel-dir", out, str(project_dir))),
        Step(f"DeepSpeed {deepspeed_version} as a pure-Python wheel (ops compile on the node at first use)",
             (*pip, "wheel", f"deepspeed=={deepspeed_version}", "--no-deps", "--no-build-isolation",
              "--wheel-dir", out), {"DS_BUILD_OPS": "0"}),
        Step(f"binary wheels for Python {python_version} on {', '.join(platforms)}",
             (*pip, "download", *target, "--dest", out, *wanted)),
    ]


def install_command(out_dir: Path) -> str:
    return f"pip install --no-index --find-links {out_dir} energy-advisor deepspeed nvidia-ml-py"


def run_plan(steps: list[Step], runner=None, echo=print) -> None:
    """Run each step, stopping at the first failure (CalledProcessError names the command)."""
    runner = runner or subprocess.run
    for step in steps:
        echo(f"{step.description}:\n  {' '.join(step.argv)}")
        runner(list(step.argv), env={**os.environ, **step.env}, check=True)


def write_readme(out_dir: Path, steps: list[Step]) -> Path:
    note = out_dir / "INSTALL.txt"
    lines = ["Offline install (PyTorch must already be installed on the node):", "",
             f"  {install_command(out_dir)}", "", "Built with:"]
    lines += [f"  {' '.join(f'{k}={v}' for k, v in s.env.items())} {' '.join(s.argv)}".rstrip() for s in steps]
    note.write_text("\n".join(lines) + "\n")
    return note
