"""The advisor's CLI in a process of its own, as a user runs it."""
from __future__ import annotations

import subprocess
import sys


def advisor(*args, cwd, env):
    """`python -m advisor.cli ARGS` in `cwd`: the completed process."""
    return subprocess.run([sys.executable, "-m", "advisor.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)
