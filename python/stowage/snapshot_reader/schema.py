"""The snapshot format: what a snapshot's fields must be, and what trace columns hold.

``check_structure`` raises SnapshotError naming the first field that does not fit the format
(``device_traces[0][12].size: expected int, got str``); optional fields (time_us, frames,
allocator_settings, ...) may be missing. The checks are the C++ reader's (snapshot/structure.hpp
and snapshot/event_row.hpp, through stowage._core), which also checks each trace event as it
reads it into columns, with the same messages in the same order: a trace read into columns
(TraceColumns) carries its first bad event's message instead.
"""

from __future__ import annotations

import struct
from typing import Any

from stowage import _core
from stowage.snapshot_reader.errors import SnapshotError

MAX_SIZE: int = _core.snapshot_limits["max_size"]  # bytes: far beyond any device
MAX_DEVICES: int = _core.snapshot_limits["max_devices"]  # device indexes a snapshot may name

# Trace actions in the order of their codes in TraceColumns.action (snapshot/names.hpp's order).
ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "snapshot", "oom")
TRACE_ACTIONS = set(ACTIONS)
ACTION_CODES = {action: code for code, action in enumerate(ACTIONS)}

# TraceColumns.flags: which optional fields an event had, and the type of its time
# (snapshot/trace_columns.hpp).
HAS_ADDR, HAS_SIZE, HAS_STREAM, HAS_DEVICE_FREE = 1, 2, 4, 8
TIME_INT, TIME_FLOAT, TIME_BOOL = 16, 32, 64
HAS_FRAMES = 128  # a frames field (a list: stack -1 when it is empty; None: stack -2)
TIME_KINDS = TIME_INT | TIME_FLOAT | TIME_BOOL
FLOAT_BITS = struct.Struct("<d")
INT_BITS = struct.Struct("<q")


class CheckedTrace:
    """A trace checked as it was read: `error` is the message naming its first malformed event,
    None when it has none."""

    error: str | None = None


def check_structure(snapshot: Any) -> None:
    """Raises SnapshotError naming the first field that does not fit the snapshot format. A
    CheckedTrace (a trace read into columns) was checked as it was read: its first error, if
    any, is raised once the rest is checked."""
    traces = snapshot.get("device_traces") if isinstance(snapshot, dict) else None
    checked = [trace for trace in traces if isinstance(trace, CheckedTrace)] if isinstance(traces, list) else []
    plain = snapshot
    if checked:
        plain = {**snapshot, "device_traces": [[] if isinstance(trace, CheckedTrace) else trace for trace in traces]}
    try:
        _core.check_snapshot_structure(plain)
    except _core.SnapshotRefused as error:
        raise SnapshotError(str(error)) from None
    for trace in checked:
        if trace.error is not None:
            raise SnapshotError(trace.error)
