"""The worker processes that share the held-out refits: no more than there are tasks or cores, and
none outliving the command.

joblib's loky workers outlive a parent killed with SIGKILL (they wait out an idle timeout of
minutes): a killed `advisor fit --jobs 100000` left 522 of them holding 20 GB. On Linux each worker
asks the kernel, as it starts, to kill it when its parent dies (prctl PR_SET_PDEATHSIG), and leaves
at once where its parent is already gone. Elsewhere loky's own timeout remains.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys

from joblib import Parallel

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def parallel(jobs: int, tasks: int, **kwargs) -> Parallel:
    """A joblib Parallel of at most `jobs` workers (below 1: one a core), no more than `tasks` or the
    machine's cores, each dying with this process."""
    cores = os.cpu_count() or 1
    workers = max(1, min(jobs if jobs >= 1 else cores, tasks, cores))
    return Parallel(n_jobs=workers, initializer=_die_with_parent, initargs=(os.getpid(),), **kwargs)


def _die_with_parent(parent_pid: int) -> None:
    """In a worker as it starts: SIGKILL when the parent dies; exit now if it already has."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)
