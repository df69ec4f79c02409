"""The snapshot format: what a snapshot's fields must be, and trace events as rows.

``check_structure`` raises SnapshotError naming the first field that does not fit the format
(``device_traces[0][12].size: expected int, got str``); optional fields (time_us, frames,
allocator_settings, ...) may be missing. ``event_row`` checks one trace event as check_structure
does, with the same messages in the same order, and returns it as a row of TraceColumns
(stowage.snapshot_reader.columns): its action's code in ACTIONS, flags saying which optional fields it
had and the type of its time, and its values. A trace that was checked as it was read
(a CheckedTrace) carries its first bad event's message instead.
"""

from __future__ import annotations

import struct
from typing import Any, Protocol

from stowage.snapshot_reader.errors import SnapshotError

MAX_SIZE = 2**50  # bytes: far beyond any device
MAX_DEVICES = 1 << 16  # device indexes a snapshot may name

# Trace actions in the order of their codes in TraceColumns.action.
ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "snapshot", "oom")
TRACE_ACTIONS = set(ACTIONS)
ACTION_CODES = {action: code for code, action in enumerate(ACTIONS)}


def expect(value: Any, kinds: type | tuple[type, ...], where: str) -> None:
    if isinstance(value, bool) and kinds is int:
        raise SnapshotError(f"{where}: expected int, got bool")
    if not isinstance(value, kinds):
        expected = kinds.__name__ if isinstance(kinds, type) else " or ".join(k.__name__ for k in kinds)
        raise SnapshotError(f"{where}: expected {expected}, got {type(value).__name__}")


# TraceColumns.flags: which optional fields an event had, and the type of its time.
HAS_ADDR, HAS_SIZE, HAS_STREAM, HAS_DEVICE_FREE = 1, 2, 4, 8
TIME_INT, TIME_FLOAT, TIME_BOOL = 16, 32, 64
HAS_FRAMES = 128  # a frames field (a list: stack -1 when it is empty; None: stack -2)
TIME_KINDS = TIME_INT | TIME_FLOAT | TIME_BOOL
_RANGES = (("addr", 2**64, HAS_ADDR), ("size", MAX_SIZE, HAS_SIZE), ("stream", 2**64, HAS_STREAM),
           ("device_free", 2**64, HAS_DEVICE_FREE))
FLOAT_BITS = struct.Struct("<d")
INT_BITS = struct.Struct("<q")
MISSING = object()  # a field an event does not have
# A row: (action code, flags, addr, size, stream, time bits, stack, device_free or None,
# user_metadata or MISSING).
Row = tuple[int, int, int, int, int, int, int, "int | None", Any]


class StackIndex(Protocol):
    """Where an event's frames list is stored (stowage.snapshot_reader.columns.StackTable)."""

    def index_of(self, frames: list[Any], device: int, index: int) -> int: ...


class CheckedTrace:
    """A trace checked as it was read: `error` is the message naming its first malformed event,
    None when it has none."""

    error: str | None = None


def event_where(device: int, index: int) -> str:
    return f"device_traces[{device}][{index}]"


def event_row(entry: Any, device: int, index: int, stacks: StackIndex | None) -> Row:
    """Checks one trace event as check_structure does (the same messages, in the same order)
    and returns it as a row; with `stacks`, its frames must be a list of dicts, stored once."""
    if type(entry) is not dict:
        expect(entry, dict, event_where(device, index))
    action = entry.get("action")
    if action is None:
        raise SnapshotError(f"{event_where(device, index)}: missing 'action'")
    code = ACTION_CODES.get(action) if type(action) is str else None
    if code is None:
        expect(action, str, f"{event_where(device, index)}.action")
        raise SnapshotError(f"{event_where(device, index)}.action: unknown action {action!r}")
    # torch's oom entries carry device_free (the device's free bytes) where others carry
    # addr; stowage's older ones carry addr.
    if action == "oom":
        if "size" not in entry:
            raise SnapshotError(f"{event_where(device, index)}: missing 'size'")
        if "addr" not in entry and "device_free" not in entry:
            raise SnapshotError(f"{event_where(device, index)}: missing 'device_free'")
    elif action != "snapshot":
        for field in ("addr", "size"):
            if field not in entry:
                raise SnapshotError(f"{event_where(device, index)}: missing '{field}'")
    flags = 0
    values = [0, 0, 0, None]
    for slot, (field, upper, flag) in enumerate(_RANGES):
        if field in entry:
            value = entry[field]
            if type(value) is not int:
                expect(value, int, f"{event_where(device, index)}.{field}")
            if not 0 <= value < upper:
                raise SnapshotError(f"{event_where(device, index)}.{field}: {value} is out of range [0, {upper})")
            values[slot] = value
            flags |= flag
    time_bits = 0
    if "time_us" in entry:
        time = entry["time_us"]
        kind = type(time)
        if kind is int:
            flags |= TIME_INT
            time_bits = time
        elif kind is float:
            flags |= TIME_FLOAT
            time_bits = INT_BITS.unpack(FLOAT_BITS.pack(time))[0]
        elif kind is bool:
            flags |= TIME_BOOL
            time_bits = int(time)
        else:
            expect(time, (int, float), f"{event_where(device, index)}.time_us")
    stack = -1
    if stacks is not None and "frames" in entry:
        flags |= HAS_FRAMES
        frames = entry["frames"]
        if frames is None:
            stack = -2
        else:
            if not isinstance(frames, list):
                expect(frames, list, f"{event_where(device, index)}.frames")
            stack = stacks.index_of(frames, device, index)
    metadata = entry.get("user_metadata", MISSING)  # stowage.mark_step's marks, among others
    return (code, flags, values[0], values[1], values[2], time_bits, stack, values[3], metadata)


def check_structure(snapshot: Any) -> None:
    """Raises SnapshotError naming the first field that does not fit the snapshot format.
    A CheckedTrace was checked as it was read: its first error, if any, is raised in its turn."""
    expect(snapshot, dict, "snapshot")
    if "segments" not in snapshot and "device_traces" not in snapshot:
        raise SnapshotError("snapshot: has neither 'segments' nor 'device_traces'")
    segments = snapshot.get("segments", [])
    expect(segments, list, "segments")
    for i, segment in enumerate(segments):
        where = f"segments[{i}]"
        expect(segment, dict, where)
        for field in ("address", "total_size"):
            if field not in segment:
                raise SnapshotError(f"{where}: missing '{field}'")
            expect(segment[field], int, f"{where}.{field}")
        if "device" in segment:
            expect(segment["device"], int, f"{where}.device")
            if not 0 <= segment["device"] < MAX_DEVICES:
                raise SnapshotError(f"{where}.device: {segment['device']} is out of range [0, {MAX_DEVICES})")
        blocks = segment.get("blocks", [])
        expect(blocks, list, f"{where}.blocks")
        for j, block in enumerate(blocks):
            expect(block, dict, f"{where}.blocks[{j}]")
            for field in ("address", "size"):
                if field in block:
                    expect(block[field], int, f"{where}.blocks[{j}].{field}")
    traces = snapshot.get("device_traces", [])
    expect(traces, list, "device_traces")
    for d, trace in enumerate(traces):
        if isinstance(trace, CheckedTrace):
            if trace.error is not None:
                raise SnapshotError(trace.error)
            continue
        expect(trace, list, f"device_traces[{d}]")
        for k, entry in enumerate(trace):
            event_row(entry, d, k, None)

