"""The advisor's CLI in a process of its own, as a user runs it."""
from __future__ import annotations

import json
import subprocess
import sys


def advisor(*args, cwd, env):
    """`python -m advisor.cli ARGS` in `cwd`: the completed process."""
    return subprocess.run([sys.executable, "-m", "advisor.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)


def rerun_runs_nothing(*args, cwd, env) -> dict:
    """The same `--json` command again, resumed: it runs nothing; its output."""
    again = advisor(*args, cwd=cwd, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "[ok]" not in again.stderr
    return json.loads(again.stdout)

