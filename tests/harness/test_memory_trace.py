"""The memory trace's replay: what is alive at the largest total, grouped by the line that allocated it."""
from calibration.harness.memory_trace import peak_summary, summary_name

MODEL = [{"filename": "/x/lib/torch/nn/functional.py", "line": 1, "name": "linear"},
         {"filename": "/repo/calibration/harness/model.py", "line": 99, "name": "forward"}]
LOSS = [{"filename": "/repo/calibration/harness/model.py", "line": 250, "name": "forward"}]


def test_the_peak_and_who_holds_it():
    events = [
        {"action": "alloc", "addr": 1, "size": 100, "frames": MODEL},
        {"action": "alloc", "addr": 2, "size": 300, "frames": LOSS},
        {"action": "alloc", "addr": 3, "size": 50, "frames": MODEL},   # peak: 1000 + 450
        {"action": "free_completed", "addr": 2, "size": 300},
        {"action": "free_completed", "addr": 77, "size": 200},         # allocated before the recording
        {"action": "alloc", "addr": 4, "size": 400, "frames": LOSS},   # 1000 - 200 + 150 + 400 = 1350 < 1450
    ]
    s = peak_summary(events, baseline=1000)
    assert s["peak_bytes"] == 1450 and s["preexisting_freed_bytes"] == 200
    assert s["sites_at_peak"] == [{"site": "model.py:250 forward", "bytes": 300, "count": 1},
                                  {"site": "model.py:99 forward", "bytes": 150, "count": 2}]
    assert s["peak_stack"] == ["model.py:99 forward"]  # the allocation that reached the peak, torch frames left out


def test_each_rank_writes_its_own_summary():
    assert summary_name(0) == "memory_trace.json" and summary_name(3) == "memory_trace-rank3.json"


def test_the_pool_replayed_names_who_took_segments_and_what_lay_free():
    from calibration.harness.memory_trace import TraceBaseline, pool_summary

    events = [
        {"action": "segment_alloc", "addr": 10, "size": 400, "frames": LOSS},   # nothing free: 800 reserved
        {"action": "alloc", "addr": 1, "size": 400, "frames": LOSS},
        {"action": "free_completed", "addr": 1, "size": 400},                   # 400 free in the pool
        {"action": "segment_alloc", "addr": 20, "size": 300, "frames": MODEL},  # 400 free, yet a new one
        {"action": "alloc", "addr": 2, "size": 300, "frames": MODEL},
        {"action": "segment_free", "addr": 10, "size": 400},
        {"action": "free_completed", "addr": 99, "size": 100},                  # allocated before the recording
    ]
    s = pool_summary(events, TraceBaseline(allocated_bytes=300, reserved_bytes=400))
    assert s["peak_reserved_bytes"] == 1100 and s["allocated_at_peak_reserved_bytes"] == 300
    assert s["segments_taken"] == 2 and s["segment_bytes_taken"] == 700
    first, second = sorted(s["largest_segments"], key=lambda seg: seg["event"])
    assert (first["free_in_pool_bytes"], first["allocated_bytes"]) == (100, 300)
    assert (second["free_in_pool_bytes"], second["allocated_bytes"]) == (500, 300)
    assert [x["site"] for x in s["segment_sites"]] == ["model.py:250 forward", "model.py:99 forward"]
