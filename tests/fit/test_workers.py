"""The refits' worker processes die with the command, however it dies."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's parent-death signal is Linux's")
def test_workers_die_when_their_parent_is_killed(tmp_path):
    """A killed `advisor fit --jobs 100000` left 522 loky workers alive, holding 20 GB."""
    pids = tmp_path / "pids"
    script = textwrap.dedent(f"""
        import os, time
        from joblib import delayed
        from models.workers import parallel

        def task(_):
            with open({str(pids)!r}, "a") as f:
                f.write(f"{{os.getpid()}}\\n")
            time.sleep(120)

        if __name__ == "__main__":
            parallel(2, 2)(delayed(task)(i) for i in range(2))
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(REPO)},
                              stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(pids.read_text().split() if pids.exists() else []) < 2:
        time.sleep(0.2)
    workers = [int(p) for p in pids.read_text().split()]
    assert len(workers) == 2 and parent.pid not in workers
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in workers):
        time.sleep(0.1)
    survivors = [p for p in workers if _alive(p)]
    for pid in survivors:  # the test's own clean-up: each by its id
        os.kill(pid, signal.SIGKILL)
    assert not survivors


def test_no_more_workers_than_tasks_or_cores():
    from models.workers import parallel

    assert parallel(100_000, 3).n_jobs == min(3, os.cpu_count() or 1)
    assert parallel(-1, 10**6).n_jobs == (os.cpu_count() or 1)
    assert parallel(4, 0).n_jobs == 1
