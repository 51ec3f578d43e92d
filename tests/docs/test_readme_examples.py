"""The README's CPU example of the validation loop, run as written in a fresh folder."""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def readme_block(marker: str) -> list[str]:
    """The command lines of the README's bash block whose first line is the comment `marker`."""
    for block in re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.DOTALL):
        lines = block.strip().splitlines()
        if lines and lines[0].strip() == marker:
            return [line for line in lines[1:] if line.strip() and not line.startswith("#")]
    raise AssertionError(f"no README block starts with {marker!r}")


@pytest.mark.slow
def test_the_cpu_validation_example_runs_as_written(tmp_path):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}  # the default store, not the user's
    for line in readme_block("# on a CPU, in any folder"):
        done = subprocess.run(line, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{line}\n{done.stderr[-3000:]}"
    records = [json.loads(x) for x in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert records and all(r["result"]["status"] == "ok" for r in records), records
    assert records[0]["prediction"]["step_time_s"] > 0
