"""The trace-event part of the snapshot reader's stack machine: trace events read into columns
as they are met, so that a snapshot's traces never exist as a Python object per event.

Note [Streaming traces]
A stock-PyTorch snapshot of 1 GB holds millions of trace events; unpickled, each is a dict with
its own frames list and integers, about four times the file, and the memo keeps them all. When
the machine (stowage.snapshot_reader.machine) reads for columns, it builds everything as pickle does
except the events of device_traces[d]: those become rows of TraceColumns as they are read, their
frames a stored stack, and their memo slots are cleared (an event is never referred to again in
the pickles torch and stowage write). Events written as the C pickler writes them with protocol
4 or 5 (EMPTY_DICT MEMOIZE MARK, memo-referenced keys, integers, a frames list of memo
references, SETITEMS) are matched whole by one regular expression (_EVENT), so most events cost
one match; any other event goes through the machine's general path and becomes a row at the
APPENDS that takes it. The matched events' opcodes are checked as the machine checks them, with
its messages. A row is a copy of its event made when the event is read, so the machine must see
that nothing changes the event after: an event or frames list a row was made of is frozen
(FROZEN, TraceRows.frozen), and a matched event's place on the stack (QUEUED) may only be taken
by its trace's APPENDS. The plain-data walk (stowage.snapshot_reader.guard.check_plain) must refuse
what it refuses in plain data (a memo bomb, a cycle, nesting deeper than 64, anywhere in an
event too), so each trace counts what its events stood for (TraceBuilder.nodes) and is walked as
a TraceShape: those counts, then its stored stacks and user_metadata as often as events refer to
them. Anything this does not follow (an event referred to twice or changed after it was read, a
matched event dropped, repeated or stored, a stored stack or frozen list appended to, an event
holding a container the columns do not keep, a trace or device_traces referred to twice, sparse
memo indices, rows left outside a trace) raises LoadWhole, and the loader runs the same machine
again for plain data, then makes the columns of its traces (stowage.snapshot_reader.loading).
"""

from __future__ import annotations

import math
import mmap
import re
import struct
from collections import deque
from typing import Any

import numpy as np

from stowage.snapshot_reader.columns import ColumnsBuilder, Stack, StackTable, TraceColumns, columnar
from stowage.snapshot_reader.errors import SnapshotError
from stowage.snapshot_reader.guard import (MAX_NUMBER, SCALARS, TraceShape, check_plain, node_budget,
                                           number_error)
from stowage.snapshot_reader.schema import (ACTION_CODES, ACTIONS, FLOAT_BITS, HAS_ADDR, HAS_FRAMES, HAS_SIZE,
                                            HAS_STREAM, INT_BITS, MAX_SIZE, MISSING, TIME_FLOAT, TIME_INT,
                                            Row, check_structure, event_row)


class LoadWhole(Exception):
    """The pickle is laid out unlike those torch and stowage write: read it again as plain data."""


class EventDict(dict):  # type: ignore[type-arg]
    """A trace event on the general path; its memo slot is cleared once it is a row, and it is
    frozen (memo_index FROZEN): changing it after would leave the row stale."""

    __slots__ = ("memo_index",)


class EventList(list):  # type: ignore[type-arg]
    """A list made inside a trace event (its frames); its memo slot becomes the stored stack, a
    copy, so once copied it is frozen as its event is."""

    __slots__ = ("memo_index",)


FROZEN = -2  # the memo_index of an EventDict or EventList that a row was made of


class DeviceTraces(list):  # type: ignore[type-arg]
    """The snapshot's device_traces: the lists made in it are traces."""

    __slots__ = ()


class TraceBuilder(ColumnsBuilder):
    """A trace being read: rows matched whole wait in `pending`, in order, for the APPENDS that
    takes them (their places on the pickle's stack hold QUEUED)."""

    def __init__(self, device: int) -> None:
        super().__init__(device)
        self.pending: deque[Row | None] = deque()
        # What check_plain would count of the events but their frames lists and user_metadata
        # containers, which the columns keep (TraceShape).
        self.nodes = 0


def event_nodes(entry: dict[Any, Any]) -> int:
    """The values an event dict stands for in check_plain's tree but for its frames list and its
    user_metadata container, measured with the stacks and the metadata the columns keep. An event
    holding any other container (which the columns would drop unmeasured) is read again as
    plain data (LoadWhole)."""
    nodes = 1 + 2 * len(entry)
    for key, value in entry.items():
        if type(key) not in SCALARS:
            raise LoadWhole
        if type(value) not in SCALARS:
            if not ((key == "frames" and isinstance(value, list)) or key == "user_metadata"):
                raise LoadWhole
            nodes -= 1
    return nodes


# On the stack: the next pending row of the trace being filled. It stands for an event the
# trace's APPENDS has not taken yet, so it may not be dropped, repeated, stored or changed (the
# event would then be lost, repeated or changed): any opcode that would raises LoadWhole.
QUEUED = object()
CONSUMED = object()  # in the memo: an event that became a row
BINFLOAT = struct.Struct(">d")
_GET = rb"j....|h."
_VALUE = (_GET + rb"|\]\x94(?:\((?:j....|h.)++e|(?:j....|h.)a)?|\x8a(?:\x06.{6}|\x07.{7}|\x05.{5}|"
          rb"\x08.{8}|\x04.{4}|\x03.{3}|\x02.{2}|\x01.|\x00)|K.|J....|M..|N|\x88|\x89|G.{8}")
_FAST_FIELDS = 10
_PAIR = b"(" + _GET + b")(" + _VALUE + b")"
# The optional pairs are possessive: a pair once matched is never given back, which changes no
# match (a pair begins with a memo reference, never with the SETITEMS that ends an event) but
# keeps a failed match linear: with plain optional groups, an event the pattern does not fit
# (frames written as dicts in place) was tried every way of skipping pairs, 50 us an event.
_EVENT = re.compile(rb"\}\x94\(" + _PAIR + (b"(?:" + _PAIR + b")?+") * (_FAST_FIELDS - 1) + b"u", re.DOTALL)
_FIELDS = {name: slot for slot, name in enumerate(("action", "addr", "size", "stream", "time_us", "frames",
                                                   "device_free", "user_metadata"))}
_FRAMES_SLOT, _METADATA_SLOT = _FIELDS["frames"], _FIELDS["user_metadata"]
_PLAIN_ACTIONS = {action: ACTION_CODES[action] for action in ACTIONS if action not in ("oom", "snapshot")}


def plain_row(values: list[Any]) -> Row | None:
    """The row of an event as torch writes most (an action other than oom and snapshot, addr and
    size in range, an integer stream, an integer or float time, frames stored), from its values
    in _FIELDS order; None for any other, which event_row then checks."""
    action, addr, size, stream, time, frames, device_free, metadata = values
    code = _PLAIN_ACTIONS.get(action) if type(action) is str else None
    if (code is None or type(addr) is not int or type(size) is not int or not 0 <= addr < 2**64
            or not 0 <= size < MAX_SIZE or device_free is not MISSING or metadata is not MISSING):
        return None
    flags = HAS_ADDR | HAS_SIZE
    if stream is not MISSING:
        if type(stream) is not int or not 0 <= stream < 2**64:
            return None
        flags |= HAS_STREAM
    else:
        stream = 0
    if type(time) is int:
        flags |= TIME_INT
    elif type(time) is float:
        flags |= TIME_FLOAT
        time = INT_BITS.unpack(FLOAT_BITS.pack(time))[0]
    elif time is MISSING:
        time = 0
    else:
        return None
    stack = -1
    if frames is not MISSING:
        if type(frames) is not Stack:
            return None
        flags |= HAS_FRAMES
        if frames:
            stack = frames.stack_id
    return (code, flags, addr, size, stream, time, stack, None, MISSING)



class TraceRows:
    """What the machine keeps to read trace events into columns (Note [Streaming traces]); with
    `streaming` False it never finds a trace, and the machine builds plain data only."""

    def __init__(self, memo: list[Any], data: bytes | mmap.mmap, streaming: bool) -> None:
        # The machine's memo (stored to, never replaced) and bytes; nothing that holds the
        # machine, so that its memo goes with it when a reading ends.
        self.memo, self.data = memo, data
        self.streaming = streaming
        self.table = StackTable()
        self.empty = Stack()  # the memo's stand-in for every empty frames list
        self.builders: list[TraceBuilder] = []
        self.fields: dict[bytes, int] = {}  # memo reference of a key -> its _FIELDS slot (field)
        self.other_keys: dict[str, int] = {}  # keys of events inspect does not read -> their slot
        self.by_refs: dict[bytes, Stack] = {}  # a frames list's memo references -> its stack
        # Plain lists copied into stored stacks (frames shared with a segment, say), by id: they
        # may not change after (the stack would be stale); kept, so that ids stay theirs.
        self.frozen: dict[int, list[Any]] = {}

    def memo_changed(self) -> None:
        """A memo slot was stored again: what was learnt of memo references no longer holds."""
        self.fields.clear()
        self.by_refs.clear()

    @staticmethod
    def memoized(value: Any, index: int) -> None:
        """Notes the memo slot of an event or frames list; one stored twice (never written by
        Python's pickler) could be reached after its row was made through the slot not cleared."""
        if value is QUEUED:
            raise LoadWhole
        if type(value) is EventDict or type(value) is EventList:
            if value.memo_index != -1:
                raise LoadWhole
            value.memo_index = index

    def _freeze_frames(self, frames: Any) -> None:
        """A frames list a row was made of (copied into a stored stack) may not change after."""
        kind = type(frames)
        if kind is EventList:
            frames.memo_index = FROZEN
        elif kind is list:
            self.frozen[id(frames)] = frames

    def new_list(self, stack: list[Any], metastack: list[list[Any]]) -> Any:
        """What an EMPTY_LIST makes here: a trace (a TraceBuilder) in device_traces, an EventList
        as an event's frames, device_traces itself, or a list."""
        if not self.streaming:
            return []
        outer = metastack[-1][-1] if metastack and metastack[-1] else None
        top = stack[-1] if stack else None
        if type(outer) is DeviceTraces or type(top) is DeviceTraces:
            device = len(outer) + len(stack) if type(outer) is DeviceTraces else len(top)
            self.builders.append(TraceBuilder(device))
            return self.builders[-1]
        if ((type(outer) is EventDict and len(stack) % 2 == 1 and stack[-1] == "frames")
                or (len(stack) >= 2 and type(stack[-2]) is EventDict and stack[-1] == "frames")):
            made = EventList()
            made.memo_index = -1
            return made
        if self._is_device_traces(stack, metastack):
            return DeviceTraces()
        return []

    @staticmethod
    def new_event() -> EventDict:
        event = EventDict()
        event.memo_index = -1
        return event

    @staticmethod
    def _is_device_traces(stack: list[Any], metastack: list[list[Any]]) -> bool:
        """Whether a list made now is the value of the snapshot's 'device_traces'."""
        if metastack:
            return (len(metastack) == 1 and len(metastack[0]) == 1 and type(metastack[0][0]) is dict
                    and len(stack) % 2 == 1 and stack[-1] == "device_traces")
        return len(stack) == 2 and type(stack[0]) is dict and stack[1] == "device_traces"

    def _memo_at(self, reference: bytes) -> Any:
        memo = self.memo
        index = reference[1] if reference[0] == 0x68 else int.from_bytes(reference[1:5], "little")
        return memo[index] if index < len(memo) else MISSING

    def take(self, builder: TraceBuilder, items: list[Any]) -> None:
        """The APPENDS of `items` to a trace: each a pending row or an event to make one of."""
        rows: list[Row | None] = []
        memo = self.memo
        index = builder.count
        for item in items:
            if item is QUEUED:
                if not builder.pending:
                    raise LoadWhole
                rows.append(builder.pending.popleft())
            else:
                if type(item) is dict:
                    raise LoadWhole  # an event made elsewhere (a memo reference): referred to twice
                if type(item) is EventDict:
                    builder.nodes += event_nodes(item)
                row = None
                try:
                    row = event_row(item, builder.device, index, self.table)
                except SnapshotError as error:
                    builder.fail(index, str(error))
                rows.append(row)
                if type(item) is EventDict:
                    slot = item.memo_index
                    if 0 <= slot < len(memo) and memo[slot] is item:
                        memo[slot] = CONSUMED
                    item.memo_index = FROZEN
                    frames = item.get("frames")
                    if type(frames) is EventList and row is not None:
                        slot = frames.memo_index
                        if 0 <= slot < len(memo) and memo[slot] is frames:
                            memo[slot] = self.table.stacks[row[6]] if row[6] >= 0 else self.empty
                    self._freeze_frames(frames)
            index += 1
        builder.add(rows)  # type: ignore[arg-type]  (rows are None only after an error)

    def _fast_stack(self, raw: bytes) -> Stack | None:
        """The stored stack of a frames list matched by _EVENT (b']\\x94' and its references)."""
        references = raw[2:]
        if not references:
            return self.empty
        found = self.by_refs.get(references)
        if found is not None:
            return found
        body = references[1:-1] if references[0] == 0x28 else references[:-1]
        memo = self.memo
        frames = []
        i = 0
        while i < len(body):
            if body[i] == 0x68:
                index = body[i + 1]
                i += 2
            else:
                index = int.from_bytes(body[i + 1:i + 5], "little")
                i += 5
            frame = memo[index] if index < len(memo) else None
            if type(frame) is not dict:
                return None  # the general path says what is wrong
            frames.append(frame)
        stored = self.table.stacks[self.table.index_of(frames, 0, 0)]
        self.by_refs[references] = stored
        return stored

    def _field(self, reference: bytes) -> int | None:
        """The _FIELDS slot of a key matched by _EVENT, or for a key inspect does not read -1, -2,
        ..., one for each such key (so that an event's duplicate keys are seen); None when the
        key is not a string, or one of too many such keys."""
        key = self._memo_at(reference)
        if type(key) is not str:
            return None
        slot = _FIELDS.get(key)
        if slot is None:
            slot = self.other_keys.setdefault(key, -1 - len(self.other_keys))
            if slot < -60:
                return None
        self.fields[reference] = slot
        return slot

    def _fast_event(self, found: re.Match[bytes], builder: TraceBuilder, index: int) -> bool:
        """One event matched by _EVENT, as a pending row; False (nothing done) when it needs the
        general path."""
        groups = iter(found.groups())
        fields, memo = self.fields, self.memo
        values: list[Any] = [MISSING] * len(_FIELDS)
        lists: list[Stack] = []
        others = pairs = 0  # the unread keys seen (bits), the pairs
        for i, (reference, raw) in enumerate(zip(groups, groups)):
            if reference is None:
                break
            slot = fields.get(reference)
            if slot is None:
                slot = self._field(reference)
                if slot is None:
                    return False
            if slot >= 0:
                if values[slot] is not MISSING:
                    return False  # a duplicate key: the general path keeps the dict's count
            else:
                if others >> -slot & 1:
                    return False
                others |= 1 << -slot
            pairs += 1
            op = raw[0]
            value: Any
            if op == 0x8A:  # LONG1
                value = int.from_bytes(raw[2:], "little", signed=True)
                if len(raw) == 10 and not -MAX_NUMBER < value < MAX_NUMBER:
                    raise number_error(value, found.start(2 * i + 2))
            elif op == 0x68 or op == 0x6A:  # BINGET, LONG_BINGET
                at = raw[1] if op == 0x68 else int.from_bytes(raw[1:], "little")
                if at >= len(memo):
                    return False
                value = memo[at]
                if value is CONSUMED:
                    return False
                if type(value) not in SCALARS and slot != _FRAMES_SLOT and slot != _METADATA_SLOT:
                    return False  # a container, for which event_nodes raises LoadWhole
            elif op == 0x4B:  # BININT1
                value = raw[1]
            elif op == 0x5D:  # EMPTY_LIST MEMOIZE, references, APPENDS
                if slot != _FRAMES_SLOT:
                    return False
                value = self._fast_stack(raw)
                if value is None:
                    return False
                lists.append(value)
            elif op == 0x4A:  # BININT
                value = int.from_bytes(raw[1:], "little", signed=True)
            elif op == 0x4D:  # BININT2
                value = raw[1] | raw[2] << 8
            elif op == 0x47:  # BINFLOAT
                value = BINFLOAT.unpack(raw[1:])[0]
                if math.isnan(value) or not -MAX_NUMBER < value < MAX_NUMBER:
                    raise number_error(value, found.start(2 * i + 2))
            else:  # NONE, NEWTRUE, NEWFALSE
                value = None if op == 0x4E else op == 0x88
            if slot >= 0:
                values[slot] = value
        frames, metadata = values[_FRAMES_SLOT], values[_METADATA_SLOT]
        builder.nodes += (1 + 2 * pairs - isinstance(frames, list)
                          - (metadata is not MISSING and type(metadata) not in SCALARS))
        row = plain_row(values)
        if row is None:  # anything unusual: the general check, which names what is wrong
            entry = {name: value for name, value in zip(_FIELDS, values) if value is not MISSING}
            try:
                row = event_row(entry, builder.device, index, self.table)
            except SnapshotError as error:
                builder.fail(index, str(error))
            self._freeze_frames(frames)  # a memo reference to a list made before
        memo.append(CONSUMED)  # the event's slot, then its lists'
        memo.extend(lists)
        builder.pending.append(row)
        return True

    def events(self, builder: TraceBuilder, position: int, stack: list[Any], end: int) -> int:
        """Events matched whole from `position` on, in a batch of `builder`'s APPENDS, up to `end`
        (the end of the current frame, or of the pickle); returns where the general path goes
        on."""
        match = _EVENT.match
        data = self.data
        while True:
            found = match(data, position, end)  # type: ignore[call-overload]
            if found is None or not self._fast_event(found, builder, builder.count + len(stack)):
                break
            stack.append(QUEUED)
            position = found.end()
            if position >= end or data[position] != 0x7D:
                break
        return position

    def finish(self, root: Any) -> dict[str, Any]:
        """The snapshot the machine built (`root`) with its traces as TraceColumns, checked as
        plain data is checked."""
        traces = root.get("device_traces") if type(root) is dict else None
        done: set[int] = set()
        budget = node_budget(len(self.data))
        if isinstance(traces, list):
            traces = list(traces)
            shaped = list(traces)  # what check_plain walks: each trace read into columns as its shape
            for d, trace in enumerate(traces):
                if type(trace) is TraceBuilder:
                    if trace.pending or trace.device != d:
                        raise LoadWhole
                    traces[d] = trace.finish(self.table.stacks)
                    shaped[d] = self._shape(trace, traces[d])
                    done.add(id(trace))
            if any(id(builder) not in done for builder in self.builders):
                raise LoadWhole  # a trace list somewhere else than device_traces
            root["device_traces"] = shaped  # in place, so that the walk sees a cycle through root
            check_plain(root, budget)
            root["device_traces"] = traces
        else:
            if self.builders:
                raise LoadWhole  # a trace list somewhere else than device_traces
            check_plain(root, budget)
        check_structure(root)
        return columnar(root)

    @staticmethod
    def _shape(builder: TraceBuilder, trace: TraceColumns) -> TraceShape:
        """The trace as check_plain would measure its list of event dicts (TraceShape)."""
        framed = trace.stack[(trace.flags & HAS_FRAMES) != 0]
        stored = framed[framed >= 0]
        counts = np.bincount(stored) if len(stored) else np.zeros(0, np.int64)
        children: list[Any] = [trace.stacks[s] for s in np.flatnonzero(counts).tolist()]
        weights = [int(counts[s]) for s in np.flatnonzero(counts).tolist()]
        empty = int(np.count_nonzero(framed == -1))
        if empty:
            children.append([])
            weights.append(empty)
        containers: dict[int, list[Any]] = {}  # user_metadata containers by id: [value, references]
        for value in trace.user_metadata.values():
            if type(value) not in SCALARS:
                containers.setdefault(id(value), [value, 0])[1] += 1
        for value, references in containers.values():
            children.append(value)
            weights.append(references)
        return TraceShape(builder.nodes, builder.count, children, weights)

