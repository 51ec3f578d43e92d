"""The shared-page-aware host memory reading: a real child process mapping the parent's shared
memory, a fake /proc, and how the window turns the ranks' readings into record fields."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from calibration.harness.shared_host_memory import SharedPeak, rollup_bytes
from calibration.harness.window import MeasuredWindow, WindowSettings
from runs.record import RunResult

MIB = 2**20
ROLLUP = Path("/proc/self/smaps_rollup")
SHM = Path("/dev/shm")


def test_rollup_reads_rss_and_pss_in_bytes(tmp_path):
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "smaps_rollup").write_text(
        "5581a000-7ffd1000 ---p 00000000 00:00 0    [rollup]\nRss:     2048 kB\nPss:     1536 kB\nShared_Clean: 0 kB\n")
    assert rollup_bytes(42, tmp_path) == (2048 * 1024, 1536 * 1024)
    assert rollup_bytes(43, tmp_path) is None  # gone
    (tmp_path / "44").mkdir()
    (tmp_path / "44" / "smaps_rollup").write_text("Rss: 10 kB\n")
    assert rollup_bytes(44, tmp_path) is None  # no Pss: not a peak to trust


def _in_a_fresh_process(code: str) -> dict:
    """Run `code` in a new interpreter and read the JSON it prints last: the test process has children
    of its own (other tests' workers), which a reading of its tree would count."""
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=repo)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_process_without_children_is_not_sampled():
    out = _in_a_fresh_process(
        "import json\nfrom calibration.harness.shared_host_memory import SharedHostMemory\n"
        "r = SharedHostMemory()\nprint(json.dumps({'started': r.start(), 'peak': r.stop()}))\n")
    assert out == {"started": False, "peak": None}


@pytest.mark.skipif(not ROLLUP.exists() or not SHM.is_dir(), reason="no smaps_rollup or /dev/shm")
def test_pages_shared_with_a_child_count_once_in_pss_and_twice_in_rss():
    """A parent and its child both touch a 256 MiB shared block: Rss counts it in each, Pss splits it."""
    size = 256 * MIB
    path = SHM / f"advisor-test-{os.getpid()}"
    touch = ("import mmap, sys, time\nf = open(sys.argv[1], 'rb')\n"
             "b = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\nsum(b[i] for i in range(0, len(b), 4096))\n"
             "print('ready', flush=True)\ntime.sleep(30)\n")
    parent = f"""
import json, mmap, subprocess, sys, time
from calibration.harness.shared_host_memory import SharedHostMemory
with open({str(path)!r}, 'w+b') as f:
    f.truncate({size})
    block = mmap.mmap(f.fileno(), {size})
    block[:] = b'\\x01' * {size}
    child = subprocess.Popen([sys.executable, '-c', {touch!r}, {str(path)!r}], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == 'ready'
    reading = SharedHostMemory(interval_s=0.05)
    started = reading.start()
    time.sleep(0.2)
    peak = reading.stop()
    child.kill()
    print(json.dumps({{'started': started, 'rss': peak.rss_bytes, 'pss': peak.pss_bytes, 'samples': peak.samples}}))
"""
    try:
        out = _in_a_fresh_process(parent)
    finally:
        path.unlink(missing_ok=True)
    assert out["started"] and out["samples"] >= 2
    # Rss counts the block in both processes, Pss splits it between them: the block once in all.
    assert out["rss"] - out["pss"] == pytest.approx(size, rel=0.1)


class _Monitor:
    def begin_window(self, name):
        pass

    def end_window(self, name):
        return SimpleNamespace(gpu_energy_j=None, gpu_power_avg_w=None, cpu_energy_j=None, cpu_energy_estimated=False)


def _ranks(shared: list[SharedPeak | None]) -> dict:
    w = MeasuredWindow(WindowSettings(warmup=1, steps=2, min_window_s=0.0, precision=0.0), _Monitor(),
                       sync=lambda: None, agree=lambda value, op: value, cpu_seconds=lambda: 0.0)
    while not w.step_done():
        pass
    everyone = [w.rank_summary(r, r, None, None, 3 * 2**30, None, s) for r, s in enumerate(shared)]
    return w.result_fields(everyone)


def test_the_record_sums_the_ranks_readings_and_leaves_them_out_unless_every_rank_has_one():
    gib = 2**30
    both = _ranks([SharedPeak(pss_bytes=2 * gib, rss_bytes=3 * gib, samples=4),
                   SharedPeak(pss_bytes=1 * gib, rss_bytes=2 * gib, samples=5)])
    assert (both["peak_host_mem_pss_gib"], both["peak_host_mem_sampled_gib"]) == (3.0, 5.0)
    assert both["peak_host_mem_gib"] == 6.0  # the high-water marks, unchanged
    one = _ranks([SharedPeak(pss_bytes=2 * gib, rss_bytes=3 * gib, samples=4), None])
    assert one["peak_host_mem_pss_gib"] is None and one["peak_host_mem_sampled_gib"] is None
    result = RunResult.from_dict({"status": "ok", **both})
    assert RunResult.from_dict(result.to_dict()).peak_host_mem_pss_gib == 3.0
