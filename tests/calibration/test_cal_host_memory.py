"""The harness's host-memory peak: kernel high-water marks, reset at the start of the steps."""
import sys

import numpy as np
import psutil
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
    monkeypatch.setattr(HostMemoryPeak, "_high_water_bytes", staticmethod(lambda proc: None))
    # This process alone: children that earlier tests left running change the tree's total.
    monkeypatch.setattr(HostMemoryPeak, "_tree", staticmethod(lambda: [psutil.Process()]))
    meter = HostMemoryPeak()
    meter.reset()
    block = np.ones(128 * MIB // 8)
    held = meter.sample()
    del block
    now = meter.sample()
    assert held - now > 100 * MIB  # the block is gone ...
    assert meter.read() >= held  # ... and the peak still holds it
