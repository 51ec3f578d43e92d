"""Host memory of a rank whose process tree shares pages: the tree's proportional set size (Pss in
/proc/PID/smaps_rollup), summed over its processes and sampled for its peak.

Why: `peak_host_mem_gib` sums each process's resident peak (VmHWM). SuperOffload's CPU optimizer
runs in a spawned worker that maps the tensors the rank hands it (torch multiprocessing moves their
storage to shared memory), so that sum counts those pages once per process: by it, SuperOffload runs
measured 22-33% above the host memory model of 2026-12-02, while every other offload path was
within -3% to +6%.
Pss splits each shared page among the processes that map it, so the tree's sum counts every page
once. The kernel keeps no peak of it, hence a sampling thread; it runs only for a tree with child
processes, because a sampling thread slows host-bound steps and a single process gains nothing
(its Pss is its Rss but for shared libraries). The resident sum is sampled beside it: its peak,
next to the high-water marks, says whether the sampling caught the peak.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

SAMPLE_INTERVAL_S = 0.25


def rollup_bytes(pid: int, proc: Path = Path("/proc")) -> tuple[int, int] | None:
    """(Rss, Pss) of one process in bytes, from smaps_rollup; None where the kernel does not say."""
    fields = {}
    try:
        for line in (proc / str(pid) / "smaps_rollup").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name in ("Rss", "Pss"):
                fields[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return (fields["Rss"], fields["Pss"]) if len(fields) == 2 else None


@dataclass(frozen=True)
class SharedPeak:
    """Peaks over the samples, summed over the tree's processes, bytes."""

    pss_bytes: int
    rss_bytes: int
    samples: int


class SharedHostMemory:
    """`start()` after the start-up peaks are reset, `stop()` when the window has closed."""

    def __init__(self, interval_s: float = SAMPLE_INTERVAL_S, proc: Path = Path("/proc")):
        self.interval_s, self.proc = interval_s, proc
        self._pids: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pss = self._rss = self._samples = 0
        self._unreadable = False

    def start(self) -> bool:
        """Begin sampling if this process has children; returns whether it did."""
        import psutil  # a GPU extra: `advisor recommend` imports this module's neighbours without it

        me = psutil.Process()
        children = me.children(recursive=True)
        if not children:
            return False
        self._pids = [me.pid, *(c.pid for c in children)]
        self._sample()
        self._thread = threading.Thread(target=self._run, name="shared-host-memory", daemon=True)
        self._thread.start()
        return True

    def _sample(self) -> None:
        readings = [rollup_bytes(pid, self.proc) for pid in self._pids]
        if any(r is None for r in readings):  # a process has gone, or the kernel has no rollup
            self._unreadable = True
            return
        self._rss = max(self._rss, sum(r[0] for r in readings))
        self._pss = max(self._pss, sum(r[1] for r in readings))
        self._samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def stop(self) -> SharedPeak | None:
        """The peaks; None when nothing was sampled or a reading failed (a peak with holes in it)."""
        if self._thread is None:
            return None
        self._stop.set()
        self._thread.join()
        self._sample()
        if self._unreadable or not self._samples:
            return None
        return SharedPeak(pss_bytes=self._pss, rss_bytes=self._rss, samples=self._samples)
