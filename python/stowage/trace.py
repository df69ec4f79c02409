"""From a snapshot's device trace to what replay needs.

``device_events`` turns one device's trace into the arrays that ``stowage._core.Trace`` takes:
its ``alloc`` events and its ``free_completed`` events (the moment memory really became free;
``free_requested`` only says a free was asked for). ``native_figures`` reads what the allocator
that recorded the trace did: the peak of its reserved memory (the running sum of segment_alloc
and segment_map bytes minus segment_free and segment_unmap bytes), and the segments that held
memory before the trace began, which make that figure incomparable with a replay from empty
when the trace's own allocations land in them.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

import numpy as np

from stowage import _core

ALLOC = 0
FREE = 1
MARK_STEP = 2
MARK_STEP_METADATA = "stowage.mark_step"  # a "snapshot" entry with this user_metadata
_GROW = {"segment_alloc", "segment_map"}
_SHRINK = {"segment_free", "segment_unmap"}


def device_events(trace: list[dict[str, Any]]) -> _core.Trace:
    """The alloc and free_completed events of one device, and the ends of steps that
    stowage.mark_step() recorded, in order, as a replayable Trace."""
    kinds: list[int] = []
    addresses: list[int] = []
    sizes: list[int] = []
    streams: list[int] = []
    for entry in trace:
        action = entry["action"]
        if action == "alloc":
            kinds.append(ALLOC)
        elif action == "free_completed":
            kinds.append(FREE)
        elif action == "snapshot" and entry.get("user_metadata") == MARK_STEP_METADATA:
            kinds.append(MARK_STEP)
            addresses.append(0)
            sizes.append(0)
            streams.append(0)
            continue
        else:
            continue
        addresses.append(entry["addr"])
        sizes.append(entry["size"])
        streams.append(entry.get("stream", 0))
    return _core.Trace(
        np.asarray(kinds, dtype=np.uint8),
        np.asarray(addresses, dtype=np.uint64),
        np.asarray(sizes, dtype=np.uint64),
        np.asarray(streams, dtype=np.uint64),
    )


@dataclass
class NativeFigures:
    """What the recording allocator did, as far as the snapshot tells."""

    peak_reserved: int | None  # None when the trace has no segment events
    preexisting_segments: int  # segments in the snapshot that no trace event created
    preexisting_bytes: int
    allocs_in_preexisting: int  # trace allocations that landed in those segments
    bytes_in_preexisting: int  # and their requested bytes

    def comparable(self, peak_requested: int) -> bool:
        """Whether the native peak can be set beside a replay that starts from empty: the trace
        has segment events, and what its allocations took from memory cached before it began
        is negligible (at most 0.1% of its peak of requested bytes)."""
        return self.peak_reserved is not None and self.bytes_in_preexisting * 1000 <= peak_requested


def native_figures(snapshot: dict[str, Any], device: int) -> NativeFigures:
    traces = snapshot.get("device_traces", [])
    trace = traces[device] if device < len(traces) else []
    reserved = 0
    peak = 0
    saw_segment_event = False
    created: set[int] = set()
    for entry in trace:
        action = entry["action"]
        if action in _GROW:
            saw_segment_event = True
            reserved += entry["size"]
            peak = max(peak, reserved)
            created.add(entry["addr"])
        elif action in _SHRINK:
            saw_segment_event = True
            reserved -= entry["size"]
    preexisting = sorted(
        (segment["address"], segment["total_size"])
        for segment in snapshot.get("segments", [])
        if segment.get("device", device) == device and segment["address"] not in created
    )
    starts = [address for address, _ in preexisting]
    landed = 0
    landed_bytes = 0
    for entry in trace:
        if entry["action"] != "alloc" or not preexisting:
            continue
        index = bisect.bisect_right(starts, entry["addr"]) - 1
        if index >= 0 and entry["addr"] < preexisting[index][0] + preexisting[index][1]:
            landed += 1
            landed_bytes += entry["size"]
    return NativeFigures(
        peak_reserved=peak if saw_segment_event else None,
        preexisting_segments=len(preexisting),
        preexisting_bytes=sum(size for _, size in preexisting),
        allocs_in_preexisting=landed,
        bytes_in_preexisting=landed_bytes,
    )
