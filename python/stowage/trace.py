"""From a snapshot's device trace to what replay needs, read from the trace's columns.

``device_events`` turns one device's trace into the arrays that ``stowage._core.Trace`` takes:
its ``alloc`` events and its ``free_completed`` events (the moment memory really became free;
``free_requested`` only says a free was asked for), and the ends of steps that
stowage.mark_step() recorded. ``native_figures`` reads what the allocator that recorded the
trace did: the peak of its reserved memory (the running sum of segment_alloc and segment_map
bytes minus segment_free and segment_unmap bytes), and the segments that held memory before the
trace began, which make that figure incomparable with a replay from empty when the trace's own
allocations land in them.

Both read a trace as TraceColumns (stowage.snapshot_reader.columns), as load_snapshot_columnar gives
it, in C++ over whole columns (snapshot/device_events.hpp): no Python object per event. A list of
event dicts (a live stowage.snapshot(), say) is made columns first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stowage import _core
from stowage.snapshot_reader import ACTION_CODES, TraceColumns

ALLOC = 0
FREE = 1
MARK_STEP = 2
MARK_STEP_METADATA = "stowage.mark_step"  # a "snapshot" entry with this user_metadata
_ADDRESSES = 2**64  # trace addresses are below this (stowage.snapshot_reader.schema)

TraceLike = TraceColumns | Sequence[dict[str, Any]]


def as_columns(trace: TraceLike) -> TraceColumns:
    """The trace as columns; a list of event dicts is checked and made columns."""
    return trace if isinstance(trace, TraceColumns) else TraceColumns.from_events(trace)


def _step_marks(columns: TraceColumns) -> np.ndarray:
    """The event indexes whose user_metadata is stowage.mark_step()'s (the C++ keeps the
    "snapshot" events among them)."""
    return np.array(sorted(index for index, value in columns.user_metadata.items() if value == MARK_STEP_METADATA),
                    dtype=np.int64)


def device_events(trace: TraceLike) -> _core.Trace:
    """The alloc and free_completed events of one device, and the ends of steps that
    stowage.mark_step() recorded, in order, as a replayable Trace."""
    return _core.Trace(*device_event_arrays(trace))


def device_event_arrays(trace: TraceLike) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """device_events' arrays: kinds (uint8: 0 alloc, 1 free, 2 a step's end), addresses, sizes
    and streams (uint64), the arguments of stowage._core.Trace."""
    columns = as_columns(trace)
    return _core.device_event_arrays(columns.action, columns.addr, columns.size, columns.stream, _step_marks(columns))


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


def _peak_reserved(columns: TraceColumns) -> tuple[int | None, set[int]]:
    """The peak of the running sum of segment growth (None without segment events), and the
    addresses of the segments the trace created."""
    peak, created = _core.reserved_peak(columns.action, columns.addr, columns.size)  # (exact past int64)
    return peak, set(created.tolist())


def _landed(columns: TraceColumns, preexisting: list[tuple[int, int]]) -> tuple[int, int]:
    """The trace's allocations whose address lies in a preexisting segment (the last one, in
    (address, size) order, that begins at or below it): their count and requested bytes."""
    alloc = np.flatnonzero(columns.action == ACTION_CODES["alloc"])
    searched = [(address, size) for address, size in preexisting if address < _ADDRESSES]
    if not len(alloc) or not searched:
        return 0, 0
    # Segment bounds clamped to trace addresses, which keeps every comparison's outcome:
    # starts below 0 to 0, the last address in a segment to at most 2**64 - 1.
    starts = np.asarray([max(address, 0) for address, _ in searched], dtype=np.uint64)
    lasts = np.asarray([min(max(address + size - 1, 0), _ADDRESSES - 1) for address, size in searched],
                       dtype=np.uint64)
    ends_above_zero = np.asarray([address + size > 0 for address, size in searched], dtype=bool)
    addresses = columns.addr[alloc]
    index = np.searchsorted(starts, addresses, side="right") - 1
    inside = index >= 0
    at = np.where(inside, index, 0)
    inside &= ends_above_zero[at] & (addresses <= lasts[at])
    return int(np.count_nonzero(inside)), sum(columns.size[alloc[inside]].tolist())


def native_figures(snapshot: dict[str, Any], device: int) -> NativeFigures:
    traces = snapshot.get("device_traces", [])
    columns = as_columns(traces[device] if device < len(traces) else [])
    peak, created = _peak_reserved(columns)
    preexisting = sorted(
        (segment["address"], segment["total_size"])
        for segment in snapshot.get("segments", [])
        if segment.get("device", device) == device and segment["address"] not in created
    )
    landed, landed_bytes = _landed(columns, preexisting)
    return NativeFigures(
        peak_reserved=peak,
        preexisting_segments=len(preexisting),
        preexisting_bytes=sum(size for _, size in preexisting),
        allocs_in_preexisting=landed,
        bytes_in_preexisting=landed_bytes,
    )


def step_period(kinds: np.ndarray, sizes: np.ndarray) -> int | None:
    """The number of steps after which the trace's steps repeat (1: every step alike; 4: a cycle
    of four shapes), judged by the sizes each step allocates in order, leaving out the first step
    (it makes the optimizer's state); None when they never repeat. Steps end at the marks."""
    return _core.step_period(kinds, sizes)
