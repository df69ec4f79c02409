"""The snapshot format, and trace events as columns: TraceColumns, what inspect, diff, the HTML
report and replay read of a device's trace, without a Python object per event.

The C++ reader makes the columns (snapshot/trace_columns.hpp, through stowage._core), storing each
distinct frames list once as a Stack; ``columnar`` turns a snapshot whose traces are lists of event
dicts into one whose traces are TraceColumns. Both check the format as the C++ reader does
(snapshot/structure.hpp, snapshot/event_row.hpp), raising SnapshotError naming the first field
that does not fit (``device_traces[0][12].size: expected int, got str``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from stowage import _core
from stowage.snapshot_reader.reading import SnapshotError

# Trace actions in the order of their codes in TraceColumns.action (snapshot/names.hpp's order).
ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "snapshot", "oom")
ACTION_CODES = {action: code for code, action in enumerate(ACTIONS)}

# TraceColumns.flags: which optional fields an event had, and the type of its time
# (snapshot/trace_columns.hpp).
HAS_ADDR, HAS_SIZE, HAS_STREAM, HAS_DEVICE_FREE = 1, 2, 4, 8
TIME_INT, TIME_FLOAT, TIME_BOOL = 16, 32, 64
HAS_FRAMES = 128  # a frames field (a list: stack -1 when it is empty; None: stack -2)
TIME_KINDS = TIME_INT | TIME_FLOAT | TIME_BOOL
FLOAT_BITS = struct.Struct("<d")
INT_BITS = struct.Struct("<q")


class Stack(list):  # type: ignore[type-arg]
    """A stack stored once for every trace event that has it (a list of frame dicts), and its
    index in the table (-1: the empty stack)."""

    __slots__ = ("stack_id",)

    def __init__(self, frames: list[Any] = [], stack_id: int = -1) -> None:  # noqa: B006 (copied)
        super().__init__(frames)
        self.stack_id = stack_id


class TraceColumns(Sequence[dict[str, Any]]):
    """One device's trace events as columns, in order; what inspect, diff and the HTML report
    read of them, without a dict per event.

    ``action`` (uint8): codes into ACTIONS; ``flags`` (uint8): the optional fields the event had
    (HAS_ADDR, HAS_SIZE, HAS_STREAM, HAS_DEVICE_FREE, HAS_FRAMES) and the type of its time
    (TIME_INT, TIME_FLOAT, TIME_BOOL); ``addr``, ``size``, ``stream`` (uint64, 0 where absent);
    ``time_us`` (int64: the time, or a float time's bits); ``stack`` (int32): an index into
    ``stacks``, -1 where the event has no frames or an empty list, -2 where its frames are None; ``device_free`` and
    ``user_metadata``: those fields of the events that have them, by event index (an empty
    user_metadata, which torch writes on every event, only in ``empty_metadata``, a mask).

    As a Sequence it gives each event back as a dict of those fields (frames as the stored
    stack), for code that reads events one by one. Fields the inspector does not read are not
    kept.
    """

    def __init__(self, action: np.ndarray, flags: np.ndarray, addr: np.ndarray, size: np.ndarray,
                 stream: np.ndarray, time_us: np.ndarray, stack: np.ndarray, stacks: list[Stack],
                 device_free: dict[int, int], user_metadata: dict[int, Any],
                 empty_metadata: np.ndarray | None = None) -> None:
        self.action, self.flags, self.addr, self.size = action, flags, addr, size
        self.stream, self.time_us, self.stack, self.stacks = stream, time_us, stack, stacks
        self.device_free, self.user_metadata = device_free, user_metadata
        self.empty_metadata = empty_metadata  # (bool by event: its user_metadata is "", as torch writes every one)

    @classmethod
    def from_events(cls, events: Sequence[Any], device: int = 0) -> TraceColumns:
        """Columns from a list of event dicts (device `device`'s, for messages); raises
        SnapshotError at the first malformed one."""
        traces = [[] for _ in range(device)] + [events if isinstance(events, list) else list(events)]
        return columnar({"device_traces": traces})["device_traces"][device]  # type: ignore[no-any-return]

    def __len__(self) -> int:
        return len(self.action)

    def time_at(self, index: int) -> int | float | bool | None:
        """The event's time_us as the snapshot wrote it, None when it had none."""
        return time_of(int(self.flags[index]), int(self.time_us[index]))

    def first_time(self) -> int | float | bool | None:
        timed = np.flatnonzero(self.flags & TIME_KINDS)
        return self.time_at(int(timed[0])) if len(timed) else None

    def _events(self, start: int, stop: int) -> Iterator[dict[str, Any]]:
        columns = (self.action, self.flags, self.addr, self.size, self.stream, self.time_us, self.stack)
        for chunk in range(start, stop, 1 << 16):
            end = min(stop, chunk + (1 << 16))
            values = zip(*(column[chunk:end].tolist() for column in columns))
            for index, (action, flags, addr, size, stream, time, stack) in enumerate(values, chunk):
                entry: dict[str, Any] = {"action": ACTIONS[action]}
                if flags & HAS_ADDR:
                    entry["addr"] = addr
                if flags & HAS_SIZE:
                    entry["size"] = size
                if flags & HAS_STREAM:
                    entry["stream"] = stream
                if flags & HAS_DEVICE_FREE:
                    entry["device_free"] = self.device_free[index]
                if flags & TIME_KINDS:
                    entry["time_us"] = time_of(flags, time)
                if flags & HAS_FRAMES:
                    entry["frames"] = self.stacks[stack] if stack >= 0 else [] if stack == -1 else None
                if self.user_metadata and index in self.user_metadata:
                    entry["user_metadata"] = self.user_metadata[index]
                elif self.empty_metadata is not None and self.empty_metadata[index]:
                    entry["user_metadata"] = ""
                yield entry

    def event(self, index: int) -> dict[str, Any]:
        """The event as a dict of the fields kept (frames: the stored stack)."""
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("trace event index out of range")
        return next(self._events(index, index + 1))

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self.event(i) for i in range(*index.indices(len(self)))]
        return self.event(index)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self._events(0, len(self))


def as_columns(trace: TraceColumns | Sequence[dict[str, Any]]) -> TraceColumns:
    """The trace as columns; a list of event dicts (a live stowage.snapshot()'s) is checked and made
    columns."""
    return trace if isinstance(trace, TraceColumns) else TraceColumns.from_events(trace)


def time_of(flags: int, bits: int) -> int | float | bool | None:
    kind = flags & TIME_KINDS
    if kind == TIME_INT:
        return bits
    if kind == TIME_FLOAT:
        return float(FLOAT_BITS.unpack(INT_BITS.pack(bits))[0])
    return bool(bits) if kind == TIME_BOOL else None


def columnar(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The snapshot with each device's trace (a list of event dicts, already checked) as
    TraceColumns, the traces' stacks stored once across them; raises SnapshotError for frames
    that are not lists of dicts."""
    traces = snapshot.get("device_traces") if isinstance(snapshot, dict) else None
    if not isinstance(traces, list):
        return snapshot
    if any(isinstance(trace, TraceColumns) for trace in traces):  # some read into columns already
        converted = [trace if isinstance(trace, TraceColumns) else TraceColumns.from_events(trace, d)
                     for d, trace in enumerate(traces)]
        return {**snapshot, "device_traces": converted}
    try:
        return _core.snapshot_columns(snapshot, TraceColumns, Stack)  # type: ignore[no-any-return]
    except _core.SnapshotRefused as error:
        raise SnapshotError(str(error)) from None

