"""The harness's host-memory peak: kernel high-water marks, reset at the start of the steps."""
import sys
import types

import numpy as np
import pytest

from calibration.harness.measure import HostMemoryPeak

MIB = 2**20
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and clear_refs are Linux's")


@linux
def test_a_peak_between_reads_is_seen_without_a_sampling_thread():
    meter = HostMemoryPeak()
    meter.reset()
    before = meter.read()
    block = np.ones(256 * MIB // 8)  # touched: resident
    del block  # freed again before the read: only the kernel's mark remembers it
    assert meter.read() >= before + 200 * MIB


@linux
def test_reset_forgets_the_peak_before_it():
    meter = HostMemoryPeak()
    block = np.ones(256 * MIB // 8)
    del block
    before_reset = meter.read()
    meter.reset()
    assert meter.marks_reset
    assert meter.read() < before_reset - 200 * MIB


def test_without_kernel_marks_the_peak_is_the_largest_total_read(monkeypatch):
    # A process whose resident size the test sets: whether the allocator hands a freed block back
    # to the kernel depends on what ran before (torch's allocator kept it in CI, 2026-12-01).
    class Process:
        pid = -1  # no /proc entry: nothing to reset
        rss = 600 * MIB

        def memory_info(self):
            return types.SimpleNamespace(rss=self.rss)

    proc = Process()
    monkeypatch.setattr(HostMemoryPeak, "_high_water_bytes", staticmethod(lambda proc: None))
    monkeypatch.setattr(HostMemoryPeak, "_tree", staticmethod(lambda: [proc]))
    meter = HostMemoryPeak()
    meter.reset()
    proc.rss += 128 * MIB  # a block allocated
    held = meter.sample()
    proc.rss -= 128 * MIB  # and freed
    now = meter.sample()
    assert held - now > 100 * MIB  # the block is gone ...
    assert meter.read() >= held  # ... and the peak still holds it
