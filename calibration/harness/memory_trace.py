"""What a run holds at its GPU memory peak: torch's allocation history, replayed to the peak, the
live allocations grouped by the line of code that made them.

Set ADVISOR_MEMORY_TRACE=1 for a harness run: every rank records its allocations from the first
training step on and writes `memory_trace.json` (rank 0) or `memory_trace-rank{r}.json` into the
run's folder. Every rank, because the run's peak is the largest over ranks, and ranks differ (ZeRO's
last partition, for one). The summary, not the snapshot (hundreds of MB), is what travels: the
peak, what was allocated before the recording began, the 30 largest sites alive at the peak, and
the stack of the allocation that reached it (which moment of the step the peak is). Beside it, the
pool (`pool_summary`): which requests made torch take new segments from CUDA after the recording
began, how much of the pool lay free when each did, and what was allocated when the pool was largest:
what `max_memory_reserved` holds beyond `max_memory_allocated`, and why.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

ENV = "ADVISOR_MEMORY_TRACE"
MAX_EVENTS = 3_000_000
TOP_SITES = 30
PEAK_STACK_FRAMES = 16


def wanted() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


TOP_SEGMENTS = 24


@dataclass(frozen=True)
class TraceBaseline:
    """What the pool held when the recording began: allocations and segments made before it."""

    allocated_bytes: int
    reserved_bytes: int


def start() -> TraceBaseline:
    """Begin recording; returns what is already allocated (model states, buffers) and reserved."""
    import torch

    torch.cuda.memory._record_memory_history(max_entries=MAX_EVENTS, stacks="python")
    return TraceBaseline(torch.cuda.memory_allocated(), torch.cuda.memory_reserved())


def _site(frames: list[dict]) -> str:
    """The innermost frame outside torch's own files: the line that asked for the memory."""
    for f in frames:
        name = f.get("filename", "")
        if "/torch/" not in name and "<" not in name:
            return f"{Path(name).name}:{f.get('line')} {f.get('name')}"
    return "torch internals"


def summary_name(rank: int) -> str:
    return "memory_trace.json" if rank == 0 else f"memory_trace-rank{rank}.json"


def _stack(frames: list[dict]) -> list[str]:
    """The allocation's Python stack, innermost first, outside torch's own files."""
    return [f"{Path(f.get('filename', '')).name}:{f.get('line')} {f.get('name')}" for f in frames
            if "/torch/" not in f.get("filename", "") and "<" not in f.get("filename", "")][:PEAK_STACK_FRAMES]


def peak_summary(events: list[dict], baseline: int) -> dict:
    """Replay alloc / free events from `baseline` bytes; the live allocations at the largest total."""
    live: dict[int, tuple[int, str]] = {}
    total = peak = baseline
    preexisting_freed = 0
    at_peak: dict[int, tuple[int, str]] = {}
    peak_frames: list[dict] = []
    for e in events:
        action, addr, size = e.get("action"), e.get("addr"), e.get("size", 0)
        if action == "alloc":
            live[addr] = (size, _site(e.get("frames", [])))
            total += size
            if total > peak:
                peak, at_peak, peak_frames = total, dict(live), e.get("frames", [])
        elif action == "free_completed":
            if addr in live:
                total -= live.pop(addr)[0]
            else:
                total -= size
                preexisting_freed += size
    sites: dict[str, list[int]] = {}
    for size, site in at_peak.values():
        entry = sites.setdefault(site, [0, 0])
        entry[0] += size
        entry[1] += 1
    top = sorted(sites.items(), key=lambda kv: -kv[1][0])[:TOP_SITES]
    return {"peak_bytes": peak, "baseline_bytes": baseline, "preexisting_freed_bytes": preexisting_freed,
            "events": len(events), "peak_stack": _stack(peak_frames),
            "sites_at_peak": [{"site": s, "bytes": b, "count": n} for s, (b, n) in top]}


SEGMENT_GROWS = ("segment_alloc", "segment_map")  # segment_map/unmap: expandable segments
SEGMENT_SHRINKS = ("segment_free", "segment_unmap")


def pool_summary(events: list[dict], baseline: TraceBaseline) -> dict:
    """Replay the pool with its allocations: every segment taken after `baseline` (its size, the line
    that asked, what was allocated and what lay free in the pool when it did: free bytes at least its
    size mean the free blocks were too small, the fragmentation the reserved pool pays for) and the
    pool's largest total with what was allocated then."""
    live: dict[int, int] = {}
    allocated, reserved = baseline.allocated_bytes, baseline.reserved_bytes
    peak_reserved, allocated_at_peak, peak_at = reserved, allocated, 0
    segments = []
    for i, e in enumerate(events):
        action, addr, size = e.get("action"), e.get("addr"), e.get("size", 0)
        if action == "alloc":
            live[addr] = size
            allocated += size
        elif action == "free_completed":
            allocated -= live.pop(addr, size)
        elif action in SEGMENT_GROWS:
            segments.append({"bytes": size, "site": _site(e.get("frames", [])), "allocated_bytes": allocated,
                             "free_in_pool_bytes": reserved - allocated, "event": i,
                             "stack": _stack(e.get("frames", []))[:6]})
            reserved += size
            if reserved > peak_reserved:
                peak_reserved, allocated_at_peak, peak_at = reserved, allocated, i
        elif action in SEGMENT_SHRINKS:
            reserved -= size
    sites: dict[str, list[int]] = {}
    for seg in segments:
        entry = sites.setdefault(seg["site"], [0, 0])
        entry[0] += seg["bytes"]
        entry[1] += 1
    return {"reserved_baseline_bytes": baseline.reserved_bytes, "peak_reserved_bytes": peak_reserved,
            "allocated_at_peak_reserved_bytes": allocated_at_peak, "peak_reserved_event": peak_at,
            "segments_taken": len(segments), "segment_bytes_taken": sum(seg["bytes"] for seg in segments),
            "segment_sites": [{"site": k, "bytes": b, "count": n}
                              for k, (b, n) in sorted(sites.items(), key=lambda kv: -kv[1][0])[:TOP_SITES]],
            "largest_segments": sorted(segments, key=lambda seg: -seg["bytes"])[:TOP_SEGMENTS]}


def write_summary(path: str | Path, baseline: TraceBaseline) -> None:
    """Stop recording and write the summary of the recorded peak and of the pool."""
    import torch

    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = snapshot["device_traces"][torch.cuda.current_device()]
    summary = peak_summary(events, baseline.allocated_bytes)
    summary["pool"] = pool_summary(events, baseline)
    summary["max_memory_allocated"] = torch.cuda.max_memory_allocated()
    summary["max_memory_reserved"] = torch.cuda.max_memory_reserved()
    Path(path).write_text(json.dumps(summary, indent=1))
