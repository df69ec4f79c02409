"""The snapshot reader's one pickle stack machine, which both loaders run.

``Machine(data, progress, streaming).run()`` reads a pickle's opcodes in order and builds what
they make, as pickle's unpickler does, for the opcodes that build plain data only, enforcing the
safety policy of stowage.snapshot_reader.guard as it meets each opcode (refused opcodes, memo bounds,
numbers, frames, tuple depth and tuple keys): nothing else reads a snapshot's pickle, so no
other code can disagree with it on what the bytes mean. With ``streaming`` False it builds plain
Python data (``read_plain``: what ``load_snapshot`` returns); with ``streaming`` True the events
of device_traces become rows of TraceColumns as they are read (``read_columns``: what
``load_snapshot_columnar`` returns; stowage.snapshot_reader.events, Note [Streaming traces]), and a
pickle laid out unlike those torch and stowage write raises LoadWhole, after which the loader
reads it again with ``streaming`` False. Either way the result is then walked by
guard.check_plain and checked by schema.check_structure.

Every failure raises SnapshotError (without the file's name, which the loaders add): a refused
opcode or value, or, for anything the bytes do not make sense as, "not a readable pickle (...);
is the file truncated?".

The opcode loop is one function, as pickle's own unpickler is: the commonest opcodes come
first, and the state that each opcode touches (the stack, the mark stack, the frame, how far a
large file has been read) stays in local variables, where a function an opcode would have to
keep it in attributes and pay a call for each opcode. Only rare opcodes (those whose argument is
a line of text) and what is particular to traces (stowage.snapshot_reader.events) are called out.
"""

from __future__ import annotations

import codecs
import math
import mmap
import pickle
import pickletools
import struct
from typing import Any

from stowage.snapshot_reader.columns import Stack
from stowage.snapshot_reader.errors import Progress, SnapshotError
from stowage.snapshot_reader.events import (BINFLOAT, DeviceTraces, EventDict, EventList, FROZEN, QUEUED,
                                            CONSUMED, LoadWhole, TraceBuilder, TraceRows)
from stowage.snapshot_reader.guard import (COLUMNS_MEMORY_PER_BYTE, MAX_NUMBER, PLAIN_MEMORY_PER_BYTE,
                                           PLAIN_OPCODES, RESIDENT_CHECK_EVERY, MemoryGuard, TupleGuard, check_plain,
                                           checked_number, frame_error, memo_beyond_file, nested_frame_error,
                                           node_budget, number_error, refused_opcode)
from stowage.snapshot_reader.reading import FileWindow
from stowage.snapshot_reader.schema import check_structure

_REPORT_EVERY = RESIDENT_CHECK_EVERY  # bytes between progress reports and memory checks
_RELEASE_EVERY = 8 << 20  # bytes of a large file's window given back at a time
_OPCODE_NAMES = {op.code.encode("latin-1")[0]: op.name for op in pickletools.opcodes}
# Numbers, strings and bytes whose length precedes them -> the width of the length: LONG1,
# LONG4, SHORT_BINUNICODE, BINUNICODE, BINUNICODE8, SHORT_BINBYTES, BINBYTES, BINBYTES8,
# SHORT_BINSTRING, BINSTRING.
_COUNTED = dict(zip(b"\x8a\x8b\x8cX\x8dCB\x8eUT", (1, 4, 1, 4, 8, 1, 4, 8, 1, 4)))
_SIGNED_COUNTS = frozenset(b"\x8bT")  # LONG4, BINSTRING
# The opcodes of protocols 0 and 1 whose argument is a line of text (Machine._text).
_TEXT_OPCODES = frozenset("INT LONG FLOAT STRING UNICODE GET PUT".split())
assert _TEXT_OPCODES <= PLAIN_OPCODES


class Machine:
    """A pickle's stack machine for plain data. One use: run(), then read_plain's or
    TraceRows.finish's checks of what it built."""

    def __init__(self, data: bytes | FileWindow, progress: Progress | None, streaming: bool,
                 memory_per_byte: int = PLAIN_MEMORY_PER_BYTE) -> None:
        self.window = data if isinstance(data, FileWindow) else None  # read as the machine goes
        self.data: bytes | mmap.mmap = data.buffer if isinstance(data, FileWindow) else data
        self.size = len(self.data)
        self.progress = progress
        self.memo: list[Any] = []
        # Memo slots stored beyond the memo's end (never written by Python's pickler; plain data
        # only): a dict, so that an index near the file's size costs one slot, not a list that long.
        self.sparse: dict[int, Any] = {}
        self.tuples = TupleGuard()
        self.rows = TraceRows(self.memo, self.data, streaming)
        self.next_report = 0
        self.released = 0
        self.memory = MemoryGuard(self.size, memory_per_byte)

    def report(self, position: int) -> None:
        """Tells `progress` how far the machine has read, checks the memory the reading has taken
        (MemoryGuard), and gives back a large file's pages behind."""
        self.next_report = position + _REPORT_EVERY
        self.memory.check(position)
        if self.progress is not None:
            self.progress("loading", min(position, self.size), self.size)
        if isinstance(self.data, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
            done = position & ~(mmap.PAGESIZE - 1)
            if done - self.released >= _RELEASE_EVERY:  # never read again (a second reading reads anew)
                self.data.madvise(mmap.MADV_DONTNEED, self.released, done - self.released)
                self.released = done

    def _get(self, index: int, position: int) -> Any:
        if index < len(self.memo):
            value = self.memo[index]
            if value is CONSUMED or type(value) is TraceBuilder or type(value) is DeviceTraces:
                raise LoadWhole  # an event read, or a trace or device_traces referred to twice
            return value
        if index in self.sparse:
            return self.sparse[index]
        if index > self.size:
            raise memo_beyond_file(index, position)
        raise SnapshotError(f"not a readable pickle (memo value not found at index {index}); "
                            "is the file truncated?")

    def _put(self, index: int, value: Any, position: int) -> None:
        memo = self.memo
        if index > self.size:
            raise memo_beyond_file(index, position)
        if index == len(memo):
            memo.append(value)
            while self.sparse and len(memo) in self.sparse:
                memo.append(self.sparse.pop(len(memo)))
        elif index < len(memo):
            memo[index] = value
            self.rows.memo_changed()
        elif self.rows.streaming:
            raise LoadWhole  # sparse memo indices: never written by Python's pickler
        else:
            self.sparse[index] = value
        self.rows.memoized(value, index)

    def _line(self, position: int) -> tuple[bytes, int]:
        """The text from `position` to the end of its line, and where the next opcode begins."""
        data, window = self.data, self.window
        searched = position
        while True:
            available = self.size if window is None else window.filled
            end = data.find(b"\n", searched, available)
            if end >= 0:
                return bytes(data[position:end]), end + 1
            if window is None or available >= self.size:
                raise EOFError("pickle data was truncated")
            searched = available
            window.fill(available + 1)

    def _text(self, name: str, position: int, stack: list[Any]) -> int:
        """Runs an opcode of protocols 0 and 1 whose argument is a line of text (as pickletools
        reads it); returns where the next opcode begins."""
        line, after = self._line(position)
        at = position - 1
        if name == "INT":
            stack.append(False if line == b"00" else True if line == b"01" else checked_number(int(line), at))
        elif name == "LONG":
            stack.append(checked_number(int(line[:-1] if line.endswith(b"L") else line), at))
        elif name == "FLOAT":
            stack.append(checked_number(float(line), at))
        elif name == "STRING":  # Python 2's str: quoted, escaped ASCII
            if len(line) < 2 or line[0] != line[-1] or line[:1] not in (b"'", b'"'):
                raise ValueError("the STRING opcode argument must be quoted")
            stack.append(str(codecs.escape_decode(line[1:-1])[0], "ascii"))
        elif name == "UNICODE":
            stack.append(str(line, "raw-unicode-escape"))
        elif name == "GET":
            stack.append(self._get(int(line), at))
        else:  # PUT
            index = int(line)
            if index < 0:
                raise ValueError("negative PUT argument")
            self._put(index, stack[-1], at)
        return after


    def run(self) -> Any:
        """Runs the pickle to its STOP; returns what it built."""
        data, size, memo, window = self.data, self.size, self.memo, self.window
        rows, tuples = self.rows, self.tuples
        frozen = rows.frozen
        stack: list[Any] = []
        metastack: list[list[Any]] = []
        position = 0
        # The current frame, if any: no opcode may run past its end (see guard).
        frame_start, frame_end = -1, size
        # Where an opcode and its fixed arguments (9 bytes at most) may begin and be read, and
        # the first of that and the frame's end: one comparison an opcode sees to both.
        safe = size if window is None else -1
        limit = min(frame_end, safe, self.next_report)
        try:
            while True:
                if position >= limit:
                    if position >= self.next_report:  # whatever opcodes a file repeats
                        self.report(position)
                    if position >= safe and window is not None:
                        safe = window.safe_through(position)
                    if position >= frame_end:
                        if frame_start < 0:
                            raise EOFError("pickle data was truncated")
                        if position > frame_end:
                            raise frame_error(frame_start)
                        frame_start, frame_end = -1, size  # the frame is read: on to what follows it
                    limit = min(frame_end, safe, self.next_report)
                op = data[position]
                position += 1
                if op == 0x6A:  # LONG_BINGET
                    index = int.from_bytes(data[position:position + 4], "little")
                    position += 4
                    stack.append(self._get(index, position - 5))
                elif op == 0x68:  # BINGET
                    position += 1
                    stack.append(self._get(data[position - 1], position - 2))
                elif op == 0x94:  # MEMOIZE: to the next index, which the memo's count of slots is
                    value = stack[-1]
                    if self.sparse:
                        self._put(len(memo) + len(self.sparse), value, position - 1)
                    else:
                        memo.append(value)
                        if type(value) is EventDict or type(value) is EventList or value is QUEUED:
                            rows.memoized(value, len(memo) - 1)
                elif op == 0x4B:  # BININT1
                    stack.append(data[position])
                    position += 1
                elif op == 0x4A:  # BININT
                    stack.append(int.from_bytes(data[position:position + 4], "little", signed=True))
                    position += 4
                elif op == 0x28:  # MARK
                    metastack.append(stack)
                    stack = []
                elif op == 0x7D:  # EMPTY_DICT
                    outer = metastack[-1][-1] if metastack and metastack[-1] else None
                    if type(outer) is TraceBuilder:
                        after = rows.events(outer, position - 1, stack, frame_end)
                        if after != position - 1:
                            position = after
                            if position >= self.next_report:
                                self.report(position)
                            continue
                    if type(outer) is TraceBuilder or (stack and type(stack[-1]) is TraceBuilder):
                        stack.append(rows.new_event())
                    else:
                        stack.append({})
                elif op == 0x75 or op == 0x73:  # SETITEMS, SETITEM
                    if op == 0x75:
                        items = stack
                        stack = metastack.pop()
                    else:
                        items = stack[-2:]
                        del stack[-2:]
                        if len(items) < 2:
                            raise IndexError("unpickling stack underflow")
                        if items[0] is QUEUED or items[1] is QUEUED:
                            raise LoadWhole
                    target = stack[-1]
                    kind = type(target)
                    if (kind is TraceBuilder or kind is Stack or target is QUEUED
                            or ((kind is EventDict or kind is EventList) and target.memo_index == FROZEN)
                            or (kind is list and id(target) in frozen)):
                        raise LoadWhole
                    if len(items) % 2:
                        raise ValueError("odd number of items for SETITEMS")
                    tuples.no_tuple_keys(items[::2])
                    for i in range(0, len(items), 2):
                        target[items[i]] = items[i + 1]
                    if position >= self.next_report:
                        self.report(position)
                elif op == 0x65 or op == 0x61:  # APPENDS, APPEND
                    if op == 0x65:
                        items = stack
                        stack = metastack.pop()
                    else:
                        items = [stack.pop()]
                        if items[0] is QUEUED:
                            raise LoadWhole
                    target = stack[-1]
                    kind = type(target)
                    if not items:
                        pass  # as pickle: an APPENDS of nothing does not look at its target
                    elif kind is list:
                        if id(target) in frozen:
                            raise LoadWhole
                        target.extend(items)
                    elif kind is EventList:
                        if target.memo_index == FROZEN:
                            raise LoadWhole
                        target.extend(items)
                    elif kind is DeviceTraces:
                        target.extend(items)
                    elif kind is TraceBuilder:
                        rows.take(target, items)
                    elif kind is Stack:
                        raise LoadWhole
                    else:
                        raise TypeError(f"APPENDS to a {kind.__name__}")
                    if position >= self.next_report:
                        self.report(position)
                elif op == 0x5D:  # EMPTY_LIST
                    stack.append(rows.new_list(stack, metastack))
                elif op == 0x4D:  # BININT2
                    stack.append(data[position] | data[position + 1] << 8)
                    position += 2
                elif op in _COUNTED:  # numbers, strings and bytes whose length precedes them
                    width = _COUNTED[op]
                    signed = op in _SIGNED_COUNTS
                    count = int.from_bytes(data[position:position + width], "little", signed=signed)
                    if count < 0:
                        raise ValueError(f"{_OPCODE_NAMES[op]} pickle has negative byte count")
                    start = position + width
                    position = start + count
                    if position > size:
                        raise EOFError("pickle data was truncated")
                    if position > safe and window is not None:
                        safe = window.safe_through(position)
                        limit = min(frame_end, safe)
                    raw = data[start:position]
                    if op == 0x8A or op == 0x8B:  # LONG1, LONG4
                        value = int.from_bytes(raw, "little", signed=True)
                        if count >= 8 and not -MAX_NUMBER < value < MAX_NUMBER:
                            raise number_error(value, start - width - 1)
                        stack.append(value)
                    elif op == 0x54 or op == 0x55:  # BINSTRING, SHORT_BINSTRING: Python 2's str
                        stack.append(str(raw, "ascii"))
                    else:
                        stack.append(str(raw, "utf-8", "surrogatepass") if op in (0x8C, 0x58, 0x8D) else raw)
                elif op == 0x4E:  # NONE
                    stack.append(None)
                elif op == 0x88 or op == 0x89:  # NEWTRUE, NEWFALSE
                    stack.append(op == 0x88)
                elif op == 0x29:  # EMPTY_TUPLE
                    stack.append(())
                elif op == 0x85:  # TUPLE1
                    item = stack[-1]
                    if item is QUEUED:
                        raise LoadWhole
                    if type(item) is tuple:
                        stack[-1] = tuples.make([item])
                    else:  # one level deep: what TupleGuard.make would note of it, without a call
                        stack[-1] = (item,)
                        tuples.made = True
                elif op == 0x86 or op == 0x87:  # TUPLE2, TUPLE3
                    count = op - 0x84
                    if len(stack) < count:
                        raise IndexError("unpickling stack underflow")
                    items = stack[-count:]
                    if QUEUED in items:
                        raise LoadWhole
                    del stack[-count:]
                    stack.append(tuples.make(items))
                elif op == 0x74 or op == 0x6C or op == 0x64:  # TUPLE, LIST, DICT
                    items = stack
                    stack = metastack.pop()
                    if stack and type(stack[-1]) is TraceBuilder:
                        raise LoadWhole  # a trace's MARK closed by other than APPENDS: it may hold QUEUED
                    if op == 0x64:
                        if len(items) % 2:
                            raise ValueError("odd number of items for DICT")
                        tuples.no_tuple_keys(items[::2])
                        stack.append({items[i]: items[i + 1] for i in range(0, len(items), 2)})
                    else:
                        stack.append(tuples.make(items) if op == 0x74 else items)
                elif op == 0x47:  # BINFLOAT
                    number = BINFLOAT.unpack_from(data, position)[0]  # type: ignore[arg-type]
                    if math.isnan(number) or not -MAX_NUMBER < number < MAX_NUMBER:
                        raise number_error(number, position - 1)
                    stack.append(number)
                    position += 8
                elif op == 0x71 or op == 0x72:  # BINPUT, LONG_BINPUT
                    width = 1 if op == 0x71 else 4
                    index = int.from_bytes(data[position:position + width], "little")
                    position += width
                    self._put(index, stack[-1], position - width - 1)
                elif op == 0x95:  # FRAME: a hint for buffered readers, but one that must not lie
                    if frame_start >= 0:
                        raise nested_frame_error(position - 1, frame_start)
                    count = int.from_bytes(data[position:position + 8], "little")
                    position += 8
                    if position + count > size:
                        raise EOFError("pickle data was truncated")
                    frame_start, frame_end = position - 9, position + count
                    limit = min(frame_end, safe)
                elif op == 0x80:  # PROTO
                    if data[position] > pickle.HIGHEST_PROTOCOL:
                        raise ValueError(f"unsupported pickle protocol: {data[position]}")
                    position += 1
                elif op == 0x2E:  # STOP
                    if position >= self.next_report or self.progress is not None:
                        self.report(self.size)
                    if stack and stack[-1] is QUEUED:
                        raise LoadWhole
                    if position < size:
                        raise SnapshotError(f"{size - position:,} bytes after the pickle's end at byte {position - 1:,} "
                                            "(several files joined?): a snapshot is one pickle")
                    return stack.pop()
                elif op == 0x30:  # POP
                    if stack:
                        if stack.pop() is QUEUED:
                            raise LoadWhole
                    else:
                        stack = metastack.pop()
                elif op == 0x31:  # POP_MARK
                    if any(item is QUEUED for item in stack):
                        raise LoadWhole
                    stack = metastack.pop()
                elif op == 0x32:  # DUP
                    if stack[-1] is QUEUED or type(stack[-1]) is TraceBuilder or type(stack[-1]) is DeviceTraces:
                        raise LoadWhole
                    stack.append(stack[-1])
                else:
                    name = _OPCODE_NAMES.get(op)
                    if name is None:
                        raise ValueError(f"unknown opcode {bytes([op])!r} at byte {position - 1}")
                    if name not in _TEXT_OPCODES:
                        raise refused_opcode(name, position - 1)
                    position = self._text(name, position, stack)
        except (SnapshotError, LoadWhole):
            raise
        except (IndexError, KeyError, TypeError, ValueError, AttributeError, OverflowError, EOFError,
                MemoryError, RecursionError, struct.error) as error:
            reason = "pickle data was truncated" if position >= size else str(error) or type(error).__name__
            raise SnapshotError(f"not a readable pickle ({reason}); is the file truncated?") from None


def read_plain(data: bytes | FileWindow, progress: Progress | None = None,
               memory_per_byte: int = PLAIN_MEMORY_PER_BYTE) -> Any:
    """The snapshot the pickle holds, as plain Python data, checked; the reading's memory within
    MEMORY_FLOOR and `memory_per_byte` a byte of pickle (MemoryGuard)."""
    machine = Machine(data, progress, streaming=False, memory_per_byte=memory_per_byte)
    value = machine.run()
    check_plain(value, node_budget(machine.size))
    check_structure(value)
    return value


def read_columns(data: bytes | FileWindow, progress: Progress | None = None) -> dict[str, Any]:
    """The snapshot with its traces as TraceColumns, checked; raises LoadWhole for a pickle laid
    out unlike those torch and stowage write (Note [Streaming traces])."""
    machine = Machine(data, progress, streaming=True, memory_per_byte=COLUMNS_MEMORY_PER_BYTE)
    return machine.rows.finish(machine.run())
