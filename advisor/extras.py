"""The `gpu` extra: what calibration and real runs import beyond the core dependencies, and the one
line a user gets where it is missing.

`predict` and `recommend` need only the core; `calibrate` and the real runs (`validate`,
`recommend --validate`) need torch, DeepSpeed, nvidia-ml-py and psutil. Without them a command
should say which extra to install, not end in a traceback from deep inside an import.
"""
from __future__ import annotations

from importlib.util import find_spec

GPU_MODULES = ("torch", "deepspeed", "pynvml", "psutil")  # pynvml: the nvidia-ml-py package
INSTALL_GPU = "pip install 'energy-advisor[gpu]'"


def is_gpu_module(name: str | None) -> bool:
    """Whether a module that failed to import is one the gpu extra installs (or part of one)."""
    return (name or "").split(".")[0] in GPU_MODULES


def missing_line(command: str | None, module: str) -> str:
    where = f"advisor {command}" if command else "advisor"
    return (f"{where}: {module.split('.')[0]} is not installed; calibration and real runs need the gpu extra: "
            f"{INSTALL_GPU}")


def require_gpu_extra(modules: tuple[str, ...] = ("torch", "deepspeed")) -> None:
    """Raise ModuleNotFoundError for the first of `modules` that is not installed: before real runs,
    whose subprocesses would otherwise each fail on the import, one by one."""
    for module in modules:
        if find_spec(module) is None:
            raise ModuleNotFoundError(f"No module named '{module}'", name=module)
