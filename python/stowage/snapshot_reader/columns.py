"""Trace events as columns: TraceColumns, what inspect, diff, the HTML report and replay read of
a device's trace, without a Python object per event.

A TraceColumns holds one device's events in order as numpy arrays (action code, flags, address,
size, stream, time, an index into the distinct stacks) and, by event index, the few fields that
are rarely there (device_free, user_metadata). Rows (stowage.snapshot_reader.schema.event_row) are
gathered by a ColumnsBuilder; a StackTable stores each distinct frames list once. ``columnar``
turns a snapshot whose traces are lists of event dicts (already checked) into one whose traces
are TraceColumns.
"""

from __future__ import annotations

import array
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from stowage.snapshot_reader.schema import (ACTIONS, FLOAT_BITS, HAS_ADDR, HAS_DEVICE_FREE, HAS_FRAMES,
                                            HAS_SIZE, HAS_STREAM, INT_BITS, MISSING, TIME_BOOL, TIME_FLOAT,
                                            TIME_INT, TIME_KINDS, CheckedTrace, Row, event_row, event_where,
                                            expect)


class Stack(list):  # type: ignore[type-arg]
    """A stack stored once for every trace event that has it (a list of frame dicts), and its
    index in the table (-1: the empty stack)."""

    __slots__ = ("stack_id",)

    def __init__(self, frames: list[Any] = [], stack_id: int = -1) -> None:  # noqa: B006 (copied)
        super().__init__(frames)
        self.stack_id = stack_id


class StackTable:
    """The distinct stacks of a snapshot's trace events: a frames list is stored once, however
    many events carry an equal one (equal: the same frame objects, as the pickle's memo shares
    them)."""

    def __init__(self) -> None:
        self.stacks: list[Stack] = []
        self._by_id: dict[int, int] = {}  # id of a stored stack -> its index
        self._by_frames: dict[tuple[int, ...], int] = {}

    def index_of(self, frames: list[Any], device: int, index: int) -> int:
        """The index of a frames list's stack, stored if new; -1 for an empty one."""
        found = self._by_id.get(id(frames))
        if found is not None:
            return found
        if not frames:
            return -1
        for j, frame in enumerate(frames):
            if type(frame) is not dict:
                expect(frame, dict, f"{event_where(device, index)}.frames[{j}]")
        key = tuple(map(id, frames))
        found = self._by_frames.get(key)
        if found is None:
            found = len(self.stacks)
            stored = Stack(frames, found)
            self.stacks.append(stored)
            self._by_frames[key] = found
            self._by_id[id(stored)] = found
        return found


class TraceColumns(CheckedTrace, Sequence[dict[str, Any]]):
    """One device's trace events as columns, in order; what inspect, diff and the HTML report
    read of them, without a dict per event.

    ``action`` (uint8): codes into ACTIONS; ``flags`` (uint8): the optional fields the event had
    (HAS_ADDR, HAS_SIZE, HAS_STREAM, HAS_DEVICE_FREE, HAS_FRAMES) and the type of its time
    (TIME_INT, TIME_FLOAT, TIME_BOOL); ``addr``, ``size``, ``stream`` (uint64, 0 where absent);
    ``time_us`` (int64: the time, or a float time's bits); ``stack`` (int32): an index into
    ``stacks``, -1 where the event has no frames or an empty list, -2 where its frames are None; ``device_free`` and
    ``user_metadata``: those fields of the events that have them, by event index.

    As a Sequence it gives each event back as a dict of those fields (frames as the stored
    stack), for code that reads events one by one. Fields the inspector does not read are not
    kept.
    """

    def __init__(self, action: np.ndarray, flags: np.ndarray, addr: np.ndarray, size: np.ndarray,
                 stream: np.ndarray, time_us: np.ndarray, stack: np.ndarray, stacks: list[Stack],
                 device_free: dict[int, int], user_metadata: dict[int, Any],
                 error: str | None = None) -> None:
        self.action, self.flags, self.addr, self.size = action, flags, addr, size
        self.stream, self.time_us, self.stack, self.stacks = stream, time_us, stack, stacks
        self.device_free, self.user_metadata = device_free, user_metadata
        self.error = error  # the first malformed event, when the trace has one

    @classmethod
    def from_events(cls, events: Sequence[Any], device: int = 0,
                    stacks: StackTable | None = None) -> TraceColumns:
        """Columns from a list of event dicts; raises SnapshotError at the first malformed one."""
        builder = ColumnsBuilder(device)
        table = stacks if stacks is not None else StackTable()
        rows = [event_row(entry, device, k, table) for k, entry in enumerate(events)]
        builder.add(rows)
        return builder.finish(table.stacks)

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


def time_of(flags: int, bits: int) -> int | float | bool | None:
    kind = flags & TIME_KINDS
    if kind == TIME_INT:
        return bits
    if kind == TIME_FLOAT:
        return float(FLOAT_BITS.unpack(INT_BITS.pack(bits))[0])
    return bool(bits) if kind == TIME_BOOL else None


class ColumnsBuilder:
    """Rows gathered into growing arrays, then TraceColumns."""

    def __init__(self, device: int) -> None:
        self.device = device
        self.count = 0  # events seen, including any after an error
        self.error: tuple[int, str] | None = None  # (event index, message) of the first bad event
        self.columns = (array.array("B"), array.array("B"), array.array("Q"), array.array("Q"),
                        array.array("Q"), array.array("q"), array.array("i"))
        self.free_at: dict[int, int] = {}
        self.metadata_at: dict[int, Any] = {}

    def add(self, rows: list[Row]) -> None:
        if self.error is None and rows:
            for column, values in zip(self.columns, zip(*rows)):
                column.extend(values)
            for k, row in enumerate(rows):
                if row[7] is not None:
                    self.free_at[self.count + k] = row[7]
                if row[8] is not MISSING:
                    self.metadata_at[self.count + k] = row[8]
        self.count += len(rows)

    def fail(self, index: int, message: str) -> None:
        if self.error is None or index < self.error[0]:
            self.error = (index, message)

    def finish(self, stacks: list[Stack]) -> TraceColumns:
        dtypes = (np.uint8, np.uint8, np.uint64, np.uint64, np.uint64, np.int64, np.int32)
        arrays = [np.frombuffer(column, dtype=dtype) if len(column) else np.zeros(0, dtype)
                  for column, dtype in zip(self.columns, dtypes)]
        return TraceColumns(*arrays, stacks=stacks, device_free=self.free_at, user_metadata=self.metadata_at,
                            error=None if self.error is None else self.error[1])



def columnar(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The snapshot with each device's trace (a list of event dicts, already checked) as
    TraceColumns; raises SnapshotError for frames that are not lists of dicts."""
    traces = snapshot.get("device_traces", [])
    stacks = StackTable()
    converted = [trace if isinstance(trace, TraceColumns) else TraceColumns.from_events(trace, d, stacks)
                 for d, trace in enumerate(traces)]
    return {**snapshot, "device_traces": converted} if "device_traces" in snapshot else snapshot
