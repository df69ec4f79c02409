"""Loading memory snapshots safely.

A snapshot is a pickle (optionally gzipped) of the dict that ``torch.cuda.memory._snapshot()``
returns, written by ``torch.cuda.memory._dump_snapshot`` or by stowage. Pickles can run code,
so neither loader here uses ``pickle.load`` as is.

``load_snapshot`` returns the snapshot as plain Python data:

1. before unpickling, every opcode is checked: only those that build plain data are allowed
   (no global, reduce, build, extension, persistent id, set or buffer: a payload that would call
   ``os.system`` fails before anything runs), memo indices must be within the file, and
   numbers must be plausible (below 2**60: larger ones could collide in hash tables on
   purpose); no opcode may run past the end of its FRAME (the unpickler would then read other
   opcodes than those checked); tuples may nest at most 64 deep and may not be dict keys
   (hashing a deep one crashes the interpreter, and tuples of numbers can collide on purpose):
   the stack of a pickle that makes tuples is followed to see that before it is unpickled; gzip
   data may expand at most 256 times (to 8 MiB for small files), so a gzip bomb is refused
   too; the unpickler itself also refuses every global. The check is one regular-expression pass over
   the opcodes that need no decoding, with ``pickletools`` for the few that do;
2. the result is walked once, without recursion, with a budget on the size of the tree it
   stands for (64 values per byte of pickle, at least a million; real snapshots need under 3)
   and on depth (64), so a memo bomb, whose few bytes expand into a huge tree, or deep nesting
   is refused at once; only dicts, lists, tuples, str, bytes, int, float, bool and None are
   accepted;
3. a structural check names the first field that is wrong (``device_traces[0][12].size:
   expected int, got str``). Optional fields (time_us, frames, allocator_settings, ...) may be
   missing.

``load_snapshot_columnar`` returns the same dict with each device's trace as ``TraceColumns``
(numpy arrays of action, address, size, stream and time, and an index into the distinct stacks),
which is what ``stowage inspect`` and ``diff`` read. It reads the pickle in one pass and never
holds a dict per trace event: see Note [Streaming traces] at ``_StreamReader``. It loads what
``load_snapshot`` loads and refuses what it refuses, but also refuses frames that are not lists
of dicts (the columns keep them as stacks), which ``load_snapshot`` does not look at; a file of
8 MiB or more is read as the reader goes (``_FileWindow``).

Every failure raises ``SnapshotError`` with the file name and the reason.
"""

from __future__ import annotations

import array
import io
import math
import mmap
import os
import pickle
import pickletools
import re
import struct
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

MAX_DEPTH = 64
# gzip: decompressed bytes per compressed byte. Real snapshots expand 6 to 25 times; at about 70
# bytes of objects a byte of pickle, 64 bounds what a hostile file can make the loaders build to
# about 4.5 KB a byte of gzip. A real file refused here can be gunzipped and read as a plain
# pickle, whose budgets go by its own size.
MAX_EXPANSION = 64
# What any gzip file may expand to. Unpickling costs up to about 70 bytes of objects a byte of
# pickle (an EMPTY_LIST is a list), so this bounds what a small file can make the loaders build:
# at 64 MiB, 60 KiB of gzip became 4.5 GiB of lists.
MIN_DECOMPRESSED_LIMIT = 8 << 20
MAX_NUMBER = 2**60
MAX_SIZE = 2**50  # bytes: far beyond any device
MAX_DEVICES = 1 << 16  # device indexes a snapshot may name
PLAIN_OPCODES = frozenset(
    """PROTO FRAME STOP MARK POP POP_MARK DUP NONE NEWTRUE NEWFALSE INT BININT BININT1 BININT2
    LONG LONG1 LONG4 FLOAT BINFLOAT STRING BINSTRING SHORT_BINSTRING UNICODE BINUNICODE
    SHORT_BINUNICODE BINUNICODE8 BINBYTES SHORT_BINBYTES BINBYTES8 EMPTY_LIST APPEND APPENDS LIST
    EMPTY_TUPLE TUPLE TUPLE1 TUPLE2 TUPLE3 EMPTY_DICT DICT SETITEM SETITEMS GET BINGET
    LONG_BINGET PUT BINPUT LONG_BINPUT MEMOIZE""".split()
)
MEMO_OPCODES = frozenset("GET BINGET LONG_BINGET PUT BINPUT LONG_BINPUT".split())
NUMBER_OPCODES = frozenset("INT BININT BININT1 BININT2 LONG LONG1 LONG4 FLOAT BINFLOAT".split())
TUPLE_OPCODES = frozenset("TUPLE TUPLE1 TUPLE2 TUPLE3".split())
MIN_NODE_BUDGET = 1_000_000
NODES_PER_BYTE = 64
ALLOWED_TYPES = (dict, list, tuple, str, bytes, int, float, bool, type(None))

# Trace actions in the order of their codes in TraceColumns.action.
ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "snapshot", "oom")
TRACE_ACTIONS = set(ACTIONS)
ACTION_CODES = {action: code for code, action in enumerate(ACTIONS)}


class SnapshotError(ValueError):
    """A snapshot file that cannot be loaded: unreadable, hostile, or not a snapshot."""


class _RefusingUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise SnapshotError(
            f"the pickle refers to {module}.{name}; snapshots hold only plain data, "
            "so it was refused"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise SnapshotError("the pickle uses persistent ids; snapshots hold only plain data")


def _gunzip(raw: bytes, path: Path) -> bytes:
    limit = max(MIN_DECOMPRESSED_LIMIT, MAX_EXPANSION * len(raw))
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        data = inflater.decompress(raw, limit + 1)
    except zlib.error as error:
        raise SnapshotError(f"{path}: broken gzip data: {error}") from error
    if len(data) > limit or inflater.unconsumed_tail:
        raise SnapshotError(f"{path}: gzip data expands more than {MAX_EXPANSION} times, which no "
                            "recorded snapshot does (a gzip bomb?); if this is a real snapshot, "
                            "gunzip it and pass the .pickle")
    if not inflater.eof:
        raise SnapshotError(f"{path}: broken gzip data: truncated")
    if inflater.unused_data.strip(b"\x00"):
        # Concatenated gzip members (cat a.gz b.gz): reading only the first would silently drop
        # the rest.
        raise SnapshotError(f"{path}: data after the end of the gzip stream (several files "
                            "joined?): a snapshot is one gzip stream")
    return data


# A pipe or a device (`stowage inspect /dev/stdin < snapshot`) has no size to bound the read by:
# it is read up to this much, and must start as a gzip file or a pickle does (/dev/zero does not).
MAX_STREAM_BYTES = 2 << 30
_STREAM_CHUNK = 8 << 20
_SNAPSHOT_STARTS = (b"\x1f\x8b", b"\x80", b"}", b"(")  # gzip; PROTO; EMPTY_DICT, MARK (protocol 0/1)


def _read_stream(path: Path) -> bytes:
    chunks: list[bytes] = []
    total = 0
    with path.open("rb", buffering=0) as stream:
        while chunk := stream.read(_STREAM_CHUNK):
            if not chunks and not chunk.startswith(_SNAPSHOT_STARTS):
                raise SnapshotError(f"{path}: does not start as a gzip file or a pickle does: "
                                    "not a snapshot")
            total += len(chunk)
            if total > MAX_STREAM_BYTES:
                raise SnapshotError(f"{path}: more than {MAX_STREAM_BYTES >> 20:,} MiB from a "
                                    "pipe or a device; save the snapshot to a file and pass that")
            chunks.append(chunk)
    return b"".join(chunks)


def _read_bytes(path: Path) -> bytes:
    try:
        regular = path.is_file() or not path.exists() or path.is_dir()
        raw = path.read_bytes() if regular else _read_stream(path)
    except OSError as error:
        raise SnapshotError(f"{path}: cannot read: {error.strerror or error}") from error
    return _gunzip(raw, path) if raw[:2] == b"\x1f\x8b" else raw


_MAP_AT_LEAST = 8 << 20  # files this large are read as the streaming reader goes, not at once
_FILL_AHEAD = 8 << 20  # bytes of such a file read ahead of the reader at a time
_OPCODE_READ_AHEAD = 16  # an opcode and its fixed arguments take at most 9 bytes
# An anonymous mapping whose pages, once given back (MADV_DONTNEED), are freed: private, and
# not counted against the machine's memory until written.
_WINDOW_FLAGS = (getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
                 | getattr(mmap, "MAP_NORESERVE", 0))


class _FileWindow:
    """A large uncompressed file read as the streaming reader goes: an anonymous mapping of the
    file's size, filled _FILL_AHEAD bytes ahead of the reader and given back behind it, so that
    its pages cost memory only while they are read.

    The file itself used to be mapped, which costs the same, but a page read after the file had
    shrunk below it ended the process (SIGBUS), as when a snapshot is rewritten in place
    (torch.cuda.memory._dump_snapshot truncates, then writes) while inspect reads it. Here such a
    read comes up short, and a file whose size or time changed is refused: a SnapshotError."""

    def __init__(self, file: BinaryIO, size: int) -> None:
        self.file, self.size = file, size
        self.buffer = mmap.mmap(-1, size, flags=_WINDOW_FLAGS)
        self.filled = 0  # bytes read into the buffer, from the start
        self.stat = self._stat()

    def _stat(self) -> tuple[int, int, int]:
        stat = os.fstat(self.file.fileno())
        return stat.st_size, stat.st_mtime_ns, stat.st_ino

    def _unchanged(self) -> None:
        if self._stat() != self.stat:
            raise SnapshotError("the file changed while it was read")

    def fill(self, upto: int) -> None:
        """Reads the file into the buffer up to `upto` at least, _FILL_AHEAD beyond what is read."""
        end = min(self.size, max(upto, self.filled + _FILL_AHEAD))
        try:
            with memoryview(self.buffer) as view:
                while self.filled < end:
                    count = self.file.readinto(view[self.filled:end])
                    if not count:  # the file shrank
                        raise SnapshotError("the file changed while it was read")
                    self.filled += count
            self._unchanged()
        except OSError as error:
            raise SnapshotError(f"cannot read: {error.strerror or error}") from error

    def safe_through(self, position: int) -> int:
        """Fills the buffer past `position`; returns where an opcode and its fixed arguments may
        begin and still be read from the buffer (the file's end once it is all read)."""
        self.fill(position + _OPCODE_READ_AHEAD)
        return self.filled - _OPCODE_READ_AHEAD if self.filled < self.size else self.size

    def whole(self) -> bytes:
        """The file's bytes, read again (the buffer gave back what was read)."""
        self.file.seek(0)
        data = self.file.read()
        if len(data) != self.size:
            raise SnapshotError("the file changed while it was read")
        self._unchanged()
        return data

    def close(self) -> None:
        self.buffer.close()
        self.file.close()


def _map_bytes(path: Path) -> bytes | _FileWindow:
    """The pickle's bytes: a large uncompressed regular file as a _FileWindow, others read."""
    try:
        if path.is_file() and path.stat().st_size >= _MAP_AT_LEAST and _WINDOW_FLAGS:
            file = path.open("rb", buffering=0)
            try:
                if file.read(2) != b"\x1f\x8b":
                    file.seek(0)
                    try:
                        return _FileWindow(file, os.fstat(file.fileno()).st_size)  # type: ignore[arg-type]
                    except OSError:  # no room for the anonymous mapping: read it all
                        pass
            except BaseException:
                file.close()
                raise
            file.close()
    except OSError as error:
        raise SnapshotError(f"{path}: cannot read: {error.strerror or error}") from error
    return _read_bytes(path)


# Reports a phase's progress: (phase, bytes done, bytes in all).
Progress = Callable[[str, int, int], None]
_REPORT_EVERY = 1 << 20  # bytes between progress reports


class _ReportingReader(io.BytesIO):
    """The pickle's bytes, reporting how far the unpickler has read."""

    def __init__(self, data: bytes, progress: Progress) -> None:
        super().__init__(data)
        self._progress = progress
        self._total = len(data)
        self._reported = 0

    def _report(self) -> None:
        position = self.tell()
        if position - self._reported >= _REPORT_EVERY or position == self._total:
            self._reported = position
            self._progress("loading", position, self._total)

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        self._report()
        return chunk

    def readinto(self, buffer: Any) -> int:
        count = super().readinto(buffer)
        self._report()
        return count


# --- the opcode check ---


def _at_most(limit: int, width: int) -> bytes:
    """A pattern for `width` little-endian bytes whose unsigned value is at most `limit`."""
    if limit >= 1 << (8 * width):
        return b".{%d}" % width
    digits = limit.to_bytes(width, "big")
    alternatives = []
    for k, digit in enumerate(digits):  # the most significant byte that differs from `limit`
        if digit:
            equal = b"".join(re.escape(bytes([d])) for d in reversed(digits[:k]))
            alternatives.append(b".{%d}[\\x00-%s]%s" % (width - 1 - k, re.escape(bytes([digit - 1])), equal))
    alternatives.append(b"".join(re.escape(bytes([d])) for d in reversed(digits)))
    return b"(?:" + b"|".join(alternatives) + b")"


def _plain_run(size: int) -> re.Pattern[bytes]:
    """A run of opcodes that build plain data and need no decoding to be checked, commonest
    first: references and stores within a pickle of `size` bytes, small integers (LONG1 up to 7
    bytes stays below 2**56), containers and constants. Strings, floats, larger numbers, frames,
    tuples and everything else end the run and are checked one by one."""
    one, four = _at_most(size, 1), _at_most(size, 4)
    long1 = b"|".join(b"\\x8a\\x%02x.{%d}" % (n, n) if n else b"\\x8a\\x00" for n in range(8))
    ops = [b"j" + four, b"h" + one, rb"\x94", rb"\(", rb"\}", rb"u", rb"e", rb"\]", b"K.", b"J....",
           b"M..", long1, b"q" + one, b"r" + four, b"a", b"s", b"N", rb"\x88", rb"\x89", rb"\)",
           b"l", b"d", b"0", b"1", b"2"]
    return re.compile(b"(?:" + b"|".join(ops) + b")*+", re.DOTALL)


def _check_op(opcode: pickletools.OpcodeInfo, argument: Any, position: int, size: int) -> None:
    name = opcode.name
    if name not in PLAIN_OPCODES:
        raise SnapshotError(f"opcode {name} at byte {position} would build objects beyond plain data; refused")
    if name in MEMO_OPCODES and argument is not None and argument > size:
        raise SnapshotError(f"memo index {argument} at byte {position} is beyond the file")
    if name in NUMBER_OPCODES and isinstance(argument, (int, float)) and not (
        -MAX_NUMBER < argument < MAX_NUMBER and not (isinstance(argument, float) and math.isnan(argument))
    ):
        raise SnapshotError(f"number {argument!r} at byte {position} is out of any snapshot's range")


def _frame_error(frame_start: int) -> SnapshotError:
    return SnapshotError(f"an opcode runs past the end of its frame (the frame at byte {frame_start}); "
                         "refused, as the unpickler would read other opcodes than those checked")


def _check_opcodes(data: bytes, progress: Progress | None = None) -> None:
    """Refuses, before anything is built, what a snapshot pickle never holds.

    Opcodes are checked in the order the bytes hold them, so they must be the opcodes the
    unpickler runs: an opcode may not run past the end of its FRAME, nor a FRAME begin before
    the last one ends (the rules of pickle's own Python unpickler). The C unpickler does not
    check them: it reads an opcode that crosses its frame's end from after the frame, dropping
    the frame's last bytes, so a pickle could hide opcodes from this check in what the check
    reads as a string.

    A pickle that makes tuples (torch's segment_pool_id, in each segment of a GPU snapshot) then
    has its stack followed by _check_tuples."""
    size = len(data)
    run = _plain_run(size).match
    stream = io.BytesIO(data)
    position = reported = 0
    frame_start, frame_end = -1, size  # the current frame, if any: runs stop at its end
    tuples = False  # whether the pickle makes a tuple other than ()
    try:
        while True:
            # Runs end at least every _REPORT_EVERY bytes, so that progress is heard.
            position = run(data, position, min(frame_end, position + _REPORT_EVERY)).end()
            if progress is not None and position - reported >= _REPORT_EVERY:
                progress("checking", position, size)
                reported = position
            if position == frame_end and frame_start >= 0:
                frame_start, frame_end = -1, size  # the frame is read: on to what follows it
            if position >= size:
                raise EOFError("pickle exhausted before seeing STOP")
            stream.seek(position)
            opcode, argument, at = next(pickletools.genops(stream))
            _check_op(opcode, argument, at, size)
            if opcode.name == "STOP":
                if tuples:
                    _check_tuples(data)
                return
            tuples = tuples or opcode.name in TUPLE_OPCODES
            position = stream.tell()
            if position > frame_end and frame_start >= 0:
                raise _frame_error(frame_start)
            if opcode.name == "FRAME":
                if frame_start >= 0:
                    raise SnapshotError(f"a frame begins at byte {at} before the frame at byte {frame_start} ends")
                if position + argument > size:
                    raise EOFError("pickle data was truncated")
                frame_start, frame_end = at, position + argument
    except (ValueError, EOFError, StopIteration) as error:
        if isinstance(error, SnapshotError):
            raise
        raise SnapshotError(f"not a readable pickle ({error}); is the file truncated?") from None


_ARGUMENTS = {op.code.encode("latin-1")[0]: op.arg for op in pickletools.opcodes}
_PUSHES = frozenset(op.code.encode("latin-1")[0] for op in pickletools.opcodes if op.name in (
    "NONE NEWTRUE NEWFALSE INT BININT BININT1 BININT2 LONG LONG1 LONG4 FLOAT BINFLOAT STRING BINSTRING "
    "SHORT_BINSTRING UNICODE BINUNICODE SHORT_BINUNICODE BINUNICODE8 BINBYTES SHORT_BINBYTES BINBYTES8 "
    "EMPTY_LIST EMPTY_DICT").split())
_GETS = frozenset(b"ghj")
_PUTS = frozenset(b"pqr")


# A list of memo references as the C pickler writes a frames list: EMPTY_LIST MEMOIZE MARK
# BINGET... APPENDS, to _check_tuples one new list stored in the memo.
_REFERENCES_LIST = re.compile(rb"\]\x94\((?:h.|j....)*+e", re.DOTALL)


def _underflow() -> SnapshotError:
    return SnapshotError("not a readable pickle (unpickling stack underflow); is the file truncated?")


def _check_tuples(data: bytes) -> None:
    """Follows the pickle's stack as the C unpickler will, knowing of each item only whether it
    is a tuple and how deeply tuples nest in it, and refuses, before the unpickler builds them,
    a tuple nested deeper than MAX_DEPTH (hashing one, as a dict key, recurses in C without
    limit: a few hundred kilobytes of TUPLE1 crash the interpreter) and a dict key that is a
    tuple other than () (tuples of numbers hash as the pickle's author likes, so that thousands
    of them collide in one dict: quadratic time). Snapshots key their dicts by strings.

    Run by _check_opcodes on a pickle it has checked that makes tuples, a few seconds for 100 MB;
    the C unpickler refuses the same stack underflows, so raising on one refuses nothing the
    unpickler would load. (Counting tuples would not do: a few thousand colliding tuples,
    memoized, can be the keys of dict after dict.)"""
    # An item: 0 not a tuple, -1 the empty tuple, d >= 1 a tuple d levels deep.
    stack: list[int] = []
    marks: list[int] = []
    tuples_at: dict[int, int] = {}  # memo index -> depth of the tuple stored there
    dense, sparse = 0, set()  # memo indices set: all below `dense`, and `sparse`
    stream = io.BytesIO(data)
    references_list = _REFERENCES_LIST.match
    position = 0
    while True:
        op = data[position]
        position += 1
        # The commonest opcodes first, as the general code below does them, without its argument
        # readers (the pickle has passed _check_opcodes: every argument is there).
        if op == 0x5D and not sparse:  # a frames list, most often
            found = references_list(data, position - 1)
            if found is not None:
                stack.append(0)
                dense += 1
                position = found.end()
                continue
        if op == 0x68:  # BINGET
            stack.append(tuples_at.get(data[position], 0))
            position += 1
            continue
        if op == 0x6A:  # LONG_BINGET
            stack.append(tuples_at.get(int.from_bytes(data[position:position + 4], "little"), 0)
                         if tuples_at else 0)
            position += 4
            continue
        if op == 0x94 and not sparse:  # MEMOIZE, to a new index
            if len(stack) <= (marks[-1] if marks else 0):
                raise _underflow()
            if stack[-1]:
                tuples_at[dense] = stack[-1]
            dense += 1
            continue
        if op == 0x28:  # MARK
            marks.append(len(stack))
            continue
        if op == 0x75 or op == 0x65:  # SETITEMS, APPENDS
            if not marks:
                raise SnapshotError("not a readable pickle (could not find MARK); is the file truncated?")
            start = marks.pop()
            if start <= (marks[-1] if marks else 0):
                raise _underflow()
            if op == 0x75 and max(stack[start::2], default=0) > 0:
                raise SnapshotError(_TUPLE_KEY)
            del stack[start:]
            continue
        if op == 0x7D or op == 0x5D or op == 0x4E:  # EMPTY_DICT, EMPTY_LIST, NONE
            stack.append(0)
            continue
        if op == 0x4B or op == 0x4A or op == 0x4D or op == 0x47:  # BININT1, BININT, BININT2, BINFLOAT
            stack.append(0)
            position += 1 if op == 0x4B else 4 if op == 0x4A else 2 if op == 0x4D else 8
            continue
        if op == 0x8A or op == 0x8C or op == 0x43:  # LONG1, SHORT_BINUNICODE, SHORT_BINBYTES
            stack.append(0)
            position += 1 + data[position]
            continue
        argument = _ARGUMENTS.get(op)
        if argument is not None:
            if argument.n > 0:  # fixed width
                value = data[position:position + argument.n]
                position += argument.n
            else:
                stream.seek(position)
                value = argument.reader(stream)
                position = stream.tell()
        fence = marks[-1] if marks else 0
        if op in _PUSHES:
            stack.append(0)
        elif op in _GETS:
            index = int(value) if op == 0x67 else int.from_bytes(value, "little")
            stack.append(tuples_at.get(index, 0))
        elif op in _PUTS or op == 0x94:  # PUT, BINPUT, LONG_BINPUT, MEMOIZE
            if len(stack) <= fence:
                raise _underflow()
            if op == 0x94:
                index = dense + len(sparse)
            else:
                index = int(value) if op == 0x70 else int.from_bytes(value, "little")
            if index == dense:
                dense += 1
                while dense in sparse:
                    sparse.discard(dense)
                    dense += 1
            elif index > dense:
                sparse.add(index)
            if stack[-1]:
                tuples_at[index] = stack[-1]
            else:
                tuples_at.pop(index, None)
        elif op == 0x28:  # MARK
            marks.append(len(stack))
        elif op in b"ue1ltd":  # SETITEMS, APPENDS, POP_MARK, LIST, TUPLE, DICT: to the mark
            if not marks:
                raise SnapshotError("not a readable pickle (could not find MARK); is the file truncated?")
            start = marks.pop()
            items = stack[start:]
            del stack[start:]
            if op in b"ue" and start <= (marks[-1] if marks else 0):
                raise _underflow()
            if op in b"ud" and max(items[::2], default=0) > 0:
                raise SnapshotError(_TUPLE_KEY)
            if op == 0x74:  # TUPLE
                depth = 1 + max((1 if item < 0 else item for item in items), default=0)
                if depth > MAX_DEPTH:
                    raise SnapshotError(f"tuples nested deeper than {MAX_DEPTH} levels: not a snapshot")
                stack.append(depth if items else -1)
            elif op in b"ld":
                stack.append(0)
        elif op in b"\x85\x86\x87":  # TUPLE1, TUPLE2, TUPLE3
            count = op - 0x84
            if len(stack) - count < fence:
                raise _underflow()
            depth = 1 + max(1 if item < 0 else item for item in stack[-count:])
            if depth > MAX_DEPTH:
                raise SnapshotError(f"tuples nested deeper than {MAX_DEPTH} levels: not a snapshot")
            del stack[-count:]
            stack.append(depth)
        elif op == 0x29:  # EMPTY_TUPLE
            stack.append(-1)
        elif op == 0x61:  # APPEND
            if len(stack) - 1 <= fence:
                raise _underflow()
            stack.pop()
        elif op == 0x73:  # SETITEM
            if len(stack) - 2 <= fence:
                raise _underflow()
            if stack[-2] > 0:
                raise SnapshotError(_TUPLE_KEY)
            del stack[-2:]
        elif op == 0x30:  # POP: an item, or the mark when the stack is empty above it
            if marks and marks[-1] == len(stack):
                marks.pop()
            elif len(stack) <= fence:
                raise _underflow()
            else:
                stack.pop()
        elif op == 0x32:  # DUP
            if len(stack) <= fence:
                raise _underflow()
            stack.append(stack[-1])
        elif op == 0x2E:  # STOP
            return
        # PROTO and FRAME change nothing; _check_opcodes let no other opcode through.


# --- the plain-data and structural checks ---


class _TraceShape:
    """What _check_plain measures of a trace read into TraceColumns, whose events it never sees:
    `nodes` values (each event, its keys and the values that are not containers), then each of
    `children` (frames lists and user_metadata) `weights` times, one level below the events."""

    __slots__ = ("nodes", "events", "children", "weights")

    def __init__(self, nodes: int, events: int, children: list[Any], weights: list[int]) -> None:
        self.nodes, self.events, self.children, self.weights = nodes, events, children, weights


_TUPLE_KEY = "a dict key is a tuple: snapshots key dicts by strings (tuples can be built to collide in hash tables)"


def _check_plain(value: Any, budget: int) -> None:
    """Checks the unpickled graph without recursion, in time linear in its distinct objects.

    Shared objects (the memo) are visited once; for each container the size and depth of the
    tree it stands for are computed from its children's, so a memo bomb, whose tree is
    exponentially larger than its graph, is measured without being expanded, and refused. A
    _TraceShape stands for a trace read into columns, measured as the list of event dicts it was.
    """
    tree_size: dict[int, int] = {}
    depth_of: dict[int, int] = {}
    in_progress: set[int] = set()
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        item, children_done = stack.pop()
        shape = item if type(item) is _TraceShape else None
        if shape is not None:
            children = shape.children
        elif not isinstance(item, ALLOWED_TYPES):
            raise SnapshotError(f"holds a {type(item).__name__}; snapshots hold only plain data")
        elif not isinstance(item, (dict, list, tuple)):
            continue
        else:
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
        key = id(item)
        if children_done:
            size, depth = 1, 0
            if shape is None:
                for child in children:
                    size += tree_size.get(id(child), 1)
                    depth = max(depth, depth_of.get(id(child), 0))
            else:  # the trace, its events, then their frames lists and metadata
                size += shape.nodes
                for child, weight in zip(children, shape.weights):
                    size += weight * tree_size.get(id(child), 1)
                    depth = max(depth, depth_of.get(id(child), 0))
                depth = depth + 1 if shape.events else 0
            tree_size[key] = size
            depth_of[key] = depth + 1
            in_progress.discard(key)
            if size > budget:
                raise SnapshotError(
                    f"expands to more than {budget:,} values: not a snapshot (a memo bomb "
                    "expands a few bytes into a huge graph)"
                )
            if depth + 1 > MAX_DEPTH:
                raise SnapshotError(f"nested deeper than {MAX_DEPTH} levels: not a snapshot")
            continue
        if key in tree_size:
            continue
        if key in in_progress:
            raise SnapshotError("contains itself: not a snapshot")
        in_progress.add(key)
        if len(in_progress) > MAX_DEPTH:
            raise SnapshotError(f"nested deeper than {MAX_DEPTH} levels: not a snapshot")
        stack.append((item, True))
        for child in children:
            if isinstance(child, (dict, list, tuple)) or type(child) is _TraceShape:
                if id(child) in in_progress:
                    raise SnapshotError("contains itself: not a snapshot")
                if id(child) not in tree_size:
                    stack.append((child, False))
            elif not isinstance(child, ALLOWED_TYPES):
                raise SnapshotError(f"holds a {type(child).__name__}; snapshots hold only plain data")


def _expect(value: Any, kinds: type | tuple[type, ...], where: str) -> None:
    if isinstance(value, bool) and kinds is int:
        raise SnapshotError(f"{where}: expected int, got bool")
    if not isinstance(value, kinds):
        expected = kinds.__name__ if isinstance(kinds, type) else " or ".join(k.__name__ for k in kinds)
        raise SnapshotError(f"{where}: expected {expected}, got {type(value).__name__}")


# TraceColumns.flags: which optional fields an event had, and the type of its time.
HAS_ADDR, HAS_SIZE, HAS_STREAM, HAS_DEVICE_FREE = 1, 2, 4, 8
TIME_INT, TIME_FLOAT, TIME_BOOL = 16, 32, 64
HAS_FRAMES = 128  # a frames field (a list: stack -1 when it is empty; None: stack -2)
_TIME_KINDS = TIME_INT | TIME_FLOAT | TIME_BOOL
_RANGES = (("addr", 2**64, HAS_ADDR), ("size", MAX_SIZE, HAS_SIZE), ("stream", 2**64, HAS_STREAM),
           ("device_free", 2**64, HAS_DEVICE_FREE))
_FLOAT_BITS = struct.Struct("<d")
_INT_BITS = struct.Struct("<q")
_MISSING = object()  # a field an event does not have
# A row: (action code, flags, addr, size, stream, time bits, stack, device_free or None,
# user_metadata or _MISSING).
_Row = tuple[int, int, int, int, int, int, int, "int | None", Any]


def _where(device: int, index: int) -> str:
    return f"device_traces[{device}][{index}]"


def _event_row(entry: Any, device: int, index: int, stacks: _StackTable | None) -> _Row:
    """Checks one trace event as check_structure does (the same messages, in the same order)
    and returns it as a row; with `stacks`, its frames must be a list of dicts, stored once."""
    if type(entry) is not dict:
        _expect(entry, dict, _where(device, index))
    action = entry.get("action")
    if action is None:
        raise SnapshotError(f"{_where(device, index)}: missing 'action'")
    code = ACTION_CODES.get(action) if type(action) is str else None
    if code is None:
        _expect(action, str, f"{_where(device, index)}.action")
        raise SnapshotError(f"{_where(device, index)}.action: unknown action {action!r}")
    # torch's oom entries carry device_free (the device's free bytes) where others carry
    # addr; stowage's older ones carry addr.
    if action == "oom":
        if "size" not in entry:
            raise SnapshotError(f"{_where(device, index)}: missing 'size'")
        if "addr" not in entry and "device_free" not in entry:
            raise SnapshotError(f"{_where(device, index)}: missing 'device_free'")
    elif action != "snapshot":
        for field in ("addr", "size"):
            if field not in entry:
                raise SnapshotError(f"{_where(device, index)}: missing '{field}'")
    flags = 0
    values = [0, 0, 0, None]
    for slot, (field, upper, flag) in enumerate(_RANGES):
        if field in entry:
            value = entry[field]
            if type(value) is not int:
                _expect(value, int, f"{_where(device, index)}.{field}")
            if not 0 <= value < upper:
                raise SnapshotError(f"{_where(device, index)}.{field}: {value} is out of range [0, {upper})")
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
            time_bits = _INT_BITS.unpack(_FLOAT_BITS.pack(time))[0]
        elif kind is bool:
            flags |= TIME_BOOL
            time_bits = int(time)
        else:
            _expect(time, (int, float), f"{_where(device, index)}.time_us")
    stack = -1
    if stacks is not None and "frames" in entry:
        flags |= HAS_FRAMES
        frames = entry["frames"]
        if frames is None:
            stack = -2
        else:
            if not isinstance(frames, list):
                _expect(frames, list, f"{_where(device, index)}.frames")
            stack = stacks.index_of(frames, device, index)
    metadata = entry.get("user_metadata", _MISSING)  # stowage.mark_step's marks, among others
    return (code, flags, values[0], values[1], values[2], time_bits, stack, values[3], metadata)


def check_structure(snapshot: Any) -> None:
    """Raises SnapshotError naming the first field that does not fit the snapshot format.
    A trace already read into TraceColumns was checked as it was read."""
    _expect(snapshot, dict, "snapshot")
    if "segments" not in snapshot and "device_traces" not in snapshot:
        raise SnapshotError("snapshot: has neither 'segments' nor 'device_traces'")
    segments = snapshot.get("segments", [])
    _expect(segments, list, "segments")
    for i, segment in enumerate(segments):
        where = f"segments[{i}]"
        _expect(segment, dict, where)
        for field in ("address", "total_size"):
            if field not in segment:
                raise SnapshotError(f"{where}: missing '{field}'")
            _expect(segment[field], int, f"{where}.{field}")
        if "device" in segment:
            _expect(segment["device"], int, f"{where}.device")
            if not 0 <= segment["device"] < MAX_DEVICES:
                raise SnapshotError(f"{where}.device: {segment['device']} is out of range [0, {MAX_DEVICES})")
        blocks = segment.get("blocks", [])
        _expect(blocks, list, f"{where}.blocks")
        for j, block in enumerate(blocks):
            _expect(block, dict, f"{where}.blocks[{j}]")
            for field in ("address", "size"):
                if field in block:
                    _expect(block[field], int, f"{where}.blocks[{j}].{field}")
    traces = snapshot.get("device_traces", [])
    _expect(traces, list, "device_traces")
    for d, trace in enumerate(traces):
        if isinstance(trace, TraceColumns):
            if trace.error is not None:
                raise SnapshotError(trace.error)
            continue
        _expect(trace, list, f"device_traces[{d}]")
        for k, entry in enumerate(trace):
            _event_row(entry, d, k, None)


# --- trace columns ---


class _Stack(list):  # type: ignore[type-arg]
    """A stack stored once for every trace event that has it (a list of frame dicts), and its
    index in the table (-1: the empty stack)."""

    __slots__ = ("stack_id",)

    def __init__(self, frames: list[Any] = [], stack_id: int = -1) -> None:  # noqa: B006 (copied)
        super().__init__(frames)
        self.stack_id = stack_id


class _StackTable:
    """The distinct stacks of a snapshot's trace events: a frames list is stored once, however
    many events carry an equal one (equal: the same frame objects, as the pickle's memo shares
    them)."""

    def __init__(self) -> None:
        self.stacks: list[_Stack] = []
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
                _expect(frame, dict, f"{_where(device, index)}.frames[{j}]")
        key = tuple(map(id, frames))
        found = self._by_frames.get(key)
        if found is None:
            found = len(self.stacks)
            stored = _Stack(frames, found)
            self.stacks.append(stored)
            self._by_frames[key] = found
            self._by_id[id(stored)] = found
        return found


class TraceColumns(Sequence[dict[str, Any]]):
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
                 stream: np.ndarray, time_us: np.ndarray, stack: np.ndarray, stacks: list[_Stack],
                 device_free: dict[int, int], user_metadata: dict[int, Any],
                 error: str | None = None) -> None:
        self.action, self.flags, self.addr, self.size = action, flags, addr, size
        self.stream, self.time_us, self.stack, self.stacks = stream, time_us, stack, stacks
        self.device_free, self.user_metadata = device_free, user_metadata
        self.error = error  # the first malformed event, when the trace has one

    @classmethod
    def from_events(cls, events: Sequence[Any], device: int = 0,
                    stacks: _StackTable | None = None) -> TraceColumns:
        """Columns from a list of event dicts; raises SnapshotError at the first malformed one."""
        builder = _ColumnsBuilder(device)
        table = stacks if stacks is not None else _StackTable()
        rows = [_event_row(entry, device, k, table) for k, entry in enumerate(events)]
        builder.add(rows)
        return builder.finish(table.stacks)

    def __len__(self) -> int:
        return len(self.action)

    def time_at(self, index: int) -> int | float | bool | None:
        """The event's time_us as the snapshot wrote it, None when it had none."""
        return _time_of(int(self.flags[index]), int(self.time_us[index]))

    def first_time(self) -> int | float | bool | None:
        timed = np.flatnonzero(self.flags & _TIME_KINDS)
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
                if flags & _TIME_KINDS:
                    entry["time_us"] = _time_of(flags, time)
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


def _time_of(flags: int, bits: int) -> int | float | bool | None:
    kind = flags & _TIME_KINDS
    if kind == TIME_INT:
        return bits
    if kind == TIME_FLOAT:
        return float(_FLOAT_BITS.unpack(_INT_BITS.pack(bits))[0])
    return bool(bits) if kind == TIME_BOOL else None


class _ColumnsBuilder:
    """Rows gathered into growing arrays, then TraceColumns."""

    def __init__(self, device: int) -> None:
        self.device = device
        self.count = 0  # events seen, including any after an error
        self.error: tuple[int, str] | None = None  # (event index, message) of the first bad event
        self.columns = (array.array("B"), array.array("B"), array.array("Q"), array.array("Q"),
                        array.array("Q"), array.array("q"), array.array("i"))
        self.free_at: dict[int, int] = {}
        self.metadata_at: dict[int, Any] = {}

    def add(self, rows: list[_Row]) -> None:
        if self.error is None and rows:
            for column, values in zip(self.columns, zip(*rows)):
                column.extend(values)
            for k, row in enumerate(rows):
                if row[7] is not None:
                    self.free_at[self.count + k] = row[7]
                if row[8] is not _MISSING:
                    self.metadata_at[self.count + k] = row[8]
        self.count += len(rows)

    def fail(self, index: int, message: str) -> None:
        if self.error is None or index < self.error[0]:
            self.error = (index, message)

    def finish(self, stacks: list[_Stack]) -> TraceColumns:
        dtypes = (np.uint8, np.uint8, np.uint64, np.uint64, np.uint64, np.int64, np.int32)
        arrays = [np.frombuffer(column, dtype=dtype) if len(column) else np.zeros(0, dtype)
                  for column, dtype in zip(self.columns, dtypes)]
        return TraceColumns(*arrays, stacks=stacks, device_free=self.free_at, user_metadata=self.metadata_at,
                            error=None if self.error is None else self.error[1])


# --- the streaming reader ---
#
# Note [Streaming traces]
# A stock-PyTorch snapshot of 1 GB holds millions of trace events; unpickled, each is a dict
# with its own frames list and integers, about four times the file, and the memo keeps them
# all. _StreamReader is a pickle machine for plain data (the opcodes the check allows) that
# builds everything as pickle does except the events of device_traces[d]: those become rows of
# TraceColumns as they are read, their frames a stored stack, and their memo slots are cleared
# (an event is never referred to again in the pickles torch and stowage write). Events written
# as the C pickler writes them with protocol 4 or 5 (EMPTY_DICT MEMOIZE MARK, memo-referenced
# keys, integers, a frames list of memo references, SETITEMS) are matched whole by one regular
# expression (_EVENT), so most events cost one match; any other event goes through the general
# path and becomes a row at the APPENDS that takes it. Opcodes are checked as they are met, with
# the messages of _check_opcodes. A row is a copy of its event made when the event is read, so
# the reader must see that nothing changes the event after: an event or frames list a row was
# made of is frozen (_FROZEN, _StreamReader.frozen), and a matched event's place on the stack
# (_QUEUED) may only be taken by its trace's APPENDS. The plain-data walk must refuse what it
# refuses in load_snapshot (a memo bomb, a cycle, nesting deeper than 64, anywhere in an event
# too), so each trace counts what its events stood for (_TraceBuilder.nodes) and is walked as a
# _TraceShape: those counts, then its stored stacks and user_metadata as often as events refer to
# them. Anything the reader does not follow (text opcodes of protocols 0 and 1, an event
# referred to twice or changed after it was read, a matched event dropped, repeated or stored, a
# stored stack or frozen list appended to, an event holding a container the columns do not keep,
# a trace or device_traces referred to twice, rows left outside a trace)
# raises _LoadWhole, and the snapshot is loaded whole by load_snapshot instead.


class _LoadWhole(Exception):
    """The pickle is laid out unlike those torch and stowage write: load it whole instead."""


class _EventDict(dict):  # type: ignore[type-arg]
    """A trace event on the general path; its memo slot is cleared once it is a row, and it is
    frozen (memo_index _FROZEN): changing it after would leave the row stale."""

    __slots__ = ("memo_index",)


class _EventList(list):  # type: ignore[type-arg]
    """A list made inside a trace event (its frames); its memo slot becomes the stored stack, a
    copy, so once copied it is frozen as its event is."""

    __slots__ = ("memo_index",)


_FROZEN = -2  # the memo_index of an _EventDict or _EventList that a row was made of


class _DeviceTraces(list):  # type: ignore[type-arg]
    """The snapshot's device_traces: the lists made in it are traces."""

    __slots__ = ()


class _TraceBuilder(_ColumnsBuilder):
    """A trace being read: rows matched whole wait in `pending`, in order, for the APPENDS that
    takes them (their places on the pickle's stack hold _QUEUED)."""

    def __init__(self, device: int) -> None:
        super().__init__(device)
        self.pending: deque[_Row | None] = deque()
        # What _check_plain would count of the events but their frames lists and user_metadata
        # containers, which the columns keep (_TraceShape).
        self.nodes = 0


_SCALARS = frozenset((str, int, float, bool, type(None), bytes))


def _event_nodes(entry: dict[Any, Any]) -> int:
    """The values an event dict stands for in _check_plain's tree but for its frames list and its
    user_metadata container, measured with the stacks and the metadata the columns keep. An event
    holding any other container (which the columns would drop unmeasured) is loaded whole."""
    nodes = 1 + 2 * len(entry)
    for key, value in entry.items():
        if type(key) not in _SCALARS:
            raise _LoadWhole
        if type(value) not in _SCALARS:
            if not ((key == "frames" and isinstance(value, list)) or key == "user_metadata"):
                raise _LoadWhole
            nodes -= 1
    return nodes


# On the stack: the next pending row of the trace being filled. It stands for an event the
# trace's APPENDS has not taken yet, so it may not be dropped, repeated, stored or changed (the
# event would then be lost, repeated or changed): any opcode that would raises _LoadWhole.
_QUEUED = object()
_CONSUMED = object()  # in the memo: an event that became a row
_GET = rb"j....|h."
_VALUE = (_GET + rb"|\]\x94(?:\((?:j....|h.)++e|(?:j....|h.)a)?|\x8a(?:\x06.{6}|\x07.{7}|\x05.{5}|"
          rb"\x08.{8}|\x04.{4}|\x03.{3}|\x02.{2}|\x01.|\x00)|K.|J....|M..|N|\x88|\x89|G.{8}")
_FAST_FIELDS = 10
_PAIR = b"(" + _GET + b")(" + _VALUE + b")"
_EVENT = re.compile(rb"\}\x94\(" + _PAIR + (b"(?:" + _PAIR + b")?") * (_FAST_FIELDS - 1) + b"u", re.DOTALL)
_BINFLOAT = struct.Struct(">d")
_RELEASE_EVERY = 8 << 20  # bytes of a large file's window (or of a mapped file) given back at a time
_OPCODE_NAMES = {op.code.encode("latin-1")[0]: op.name for op in pickletools.opcodes}
_FIELDS = {name: slot for slot, name in enumerate(("action", "addr", "size", "stream", "time_us", "frames",
                                                   "device_free", "user_metadata"))}
_FRAMES_SLOT, _METADATA_SLOT = _FIELDS["frames"], _FIELDS["user_metadata"]
_PLAIN_ACTIONS = {action: ACTION_CODES[action] for action in ACTIONS if action not in ("oom", "snapshot")}


def _plain_row(values: list[Any]) -> _Row | None:
    """The row of an event as torch writes most (an action other than oom and snapshot, addr and
    size in range, an integer stream, an integer or float time, frames stored), from its values
    in _FIELDS order; None for any other, which _event_row then checks."""
    action, addr, size, stream, time, frames, device_free, metadata = values
    code = _PLAIN_ACTIONS.get(action) if type(action) is str else None
    if (code is None or type(addr) is not int or type(size) is not int or not 0 <= addr < 2**64
            or not 0 <= size < MAX_SIZE or device_free is not _MISSING or metadata is not _MISSING):
        return None
    flags = HAS_ADDR | HAS_SIZE
    if stream is not _MISSING:
        if type(stream) is not int or not 0 <= stream < 2**64:
            return None
        flags |= HAS_STREAM
    else:
        stream = 0
    if type(time) is int:
        flags |= TIME_INT
    elif type(time) is float:
        flags |= TIME_FLOAT
        time = _INT_BITS.unpack(_FLOAT_BITS.pack(time))[0]
    elif time is _MISSING:
        time = 0
    else:
        return None
    stack = -1
    if frames is not _MISSING:
        if type(frames) is not _Stack:
            return None
        flags |= HAS_FRAMES
        if frames:
            stack = frames.stack_id
    return (code, flags, addr, size, stream, time, stack, None, _MISSING)


def _number_error(value: int | float, position: int) -> SnapshotError:
    if isinstance(value, int) and value.bit_length() >= 4000:  # too long to print
        shown = f"of {value.bit_length():,} bits"
    else:
        shown = repr(value)
    return SnapshotError(f"number {shown} at byte {position} is out of any snapshot's range")


class _StreamReader:
    """Reads a snapshot pickle into plain data with TraceColumns for its traces: Note
    [Streaming traces]. One use: run(), then finish()."""

    def __init__(self, data: bytes | mmap.mmap | _FileWindow, progress: Progress | None) -> None:
        self.window = data if isinstance(data, _FileWindow) else None  # read as the reader goes
        self.data = data.buffer if isinstance(data, _FileWindow) else data
        self.size = len(self.data)
        self.progress = progress
        self.memo: list[Any] = []
        self.table = _StackTable()
        self.empty = _Stack()  # the memo's stand-in for every empty frames list
        self.builders: list[_TraceBuilder] = []
        self.fields: dict[bytes, int] = {}  # memo reference of a key -> its _FIELDS slot (_field)
        self.other_keys: dict[str, int] = {}  # keys of events inspect does not read -> their slot
        self.by_refs: dict[bytes, _Stack] = {}  # a frames list's memo references -> its stack
        self.next_report = 0
        self.released = 0
        # Plain lists copied into stored stacks (frames shared with a segment, say), by id: they
        # may not change after (the stack would be stale); kept, so that ids stay theirs.
        self.frozen: dict[int, list[Any]] = {}
        # Tuples nested two or more deep, by id (and kept, so that ids stay theirs) -> depth; and
        # whether any tuple but () was made, after which dict keys are looked at (_check_tuples).
        self.tuple_depths: dict[int, tuple[int, tuple[Any, ...]]] = {}
        self.tuples_made = False

    def _tuple(self, items: list[Any]) -> tuple[Any, ...]:
        """A tuple of `items`, refused as _check_tuples refuses it when nested too deep."""
        made = tuple(items)
        depth = 1
        for item in made:
            if type(item) is tuple:
                depth = max(depth, 1 + self.tuple_depths.get(id(item), (1,))[0])
        if depth > MAX_DEPTH:
            raise SnapshotError(f"tuples nested deeper than {MAX_DEPTH} levels: not a snapshot")
        if depth > 1:
            self.tuple_depths[id(made)] = (depth, made)
        if made:
            self.tuples_made = True
        return made

    def _no_tuple_keys(self, keys: list[Any]) -> None:
        """Refuses tuple keys as _check_tuples does, before anything hashes them."""
        if self.tuples_made and any(type(key) is tuple and key for key in keys):
            raise SnapshotError(_TUPLE_KEY)

    def _report(self, position: int) -> None:
        self.next_report = position + _REPORT_EVERY
        if self.progress is not None:
            self.progress("loading", min(position, self.size), self.size)
        if isinstance(self.data, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
            done = position & ~(mmap.PAGESIZE - 1)
            if done - self.released >= _RELEASE_EVERY:  # never read again (a fallback reads anew)
                self.data.madvise(mmap.MADV_DONTNEED, self.released, done - self.released)
                self.released = done

    def _memo_at(self, reference: bytes) -> Any:
        index = reference[1] if reference[0] == 0x68 else int.from_bytes(reference[1:5], "little")
        return self.memo[index] if index < len(self.memo) else _MISSING

    def _get(self, index: int, position: int) -> Any:
        if index < len(self.memo):
            value = self.memo[index]
            if value is _CONSUMED or type(value) is _TraceBuilder or type(value) is _DeviceTraces:
                raise _LoadWhole  # an event read, or a trace or device_traces referred to twice
            return value
        if index > self.size:
            raise SnapshotError(f"memo index {index} at byte {position} is beyond the file")
        raise SnapshotError(f"not a readable pickle (memo value not found at index {index}); "
                            "is the file truncated?")

    def _memoized(self, value: Any, index: int) -> None:
        """Notes the memo slot of an event or frames list; one stored twice (never written by
        Python's pickler) could be reached after its row was made through the slot not cleared."""
        if value is _QUEUED:
            raise _LoadWhole
        if type(value) is _EventDict or type(value) is _EventList:
            if value.memo_index != -1:
                raise _LoadWhole
            value.memo_index = index

    def _freeze_frames(self, frames: Any) -> None:
        """A frames list a row was made of (copied into a stored stack) may not change after."""
        kind = type(frames)
        if kind is _EventList:
            frames.memo_index = _FROZEN
        elif kind is list:
            self.frozen[id(frames)] = frames

    def _put(self, index: int, value: Any, position: int) -> None:
        memo = self.memo
        if index > self.size:
            raise SnapshotError(f"memo index {index} at byte {position} is beyond the file")
        if index == len(memo):
            memo.append(value)
        elif index < len(memo):
            memo[index] = value
            self.fields.clear()
            self.by_refs.clear()
        else:
            raise _LoadWhole  # sparse memo indices: never written by Python's pickler
        self._memoized(value, index)

    def _take(self, builder: _TraceBuilder, items: list[Any]) -> None:
        """The APPENDS of `items` to a trace: each a pending row or an event to make one of."""
        rows: list[_Row | None] = []
        memo = self.memo
        index = builder.count
        for item in items:
            if item is _QUEUED:
                if not builder.pending:
                    raise _LoadWhole
                rows.append(builder.pending.popleft())
            else:
                if type(item) is dict:
                    raise _LoadWhole  # an event made elsewhere (a memo reference): referred to twice
                if type(item) is _EventDict:
                    builder.nodes += _event_nodes(item)
                row = None
                try:
                    row = _event_row(item, builder.device, index, self.table)
                except SnapshotError as error:
                    builder.fail(index, str(error))
                rows.append(row)
                if type(item) is _EventDict:
                    slot = item.memo_index
                    if 0 <= slot < len(memo) and memo[slot] is item:
                        memo[slot] = _CONSUMED
                    item.memo_index = _FROZEN
                    frames = item.get("frames")
                    if type(frames) is _EventList and row is not None:
                        slot = frames.memo_index
                        if 0 <= slot < len(memo) and memo[slot] is frames:
                            memo[slot] = self.table.stacks[row[6]] if row[6] >= 0 else self.empty
                    self._freeze_frames(frames)
            index += 1
        builder.add(rows)  # type: ignore[arg-type]  (rows are None only after an error)

    def _fast_stack(self, raw: bytes) -> _Stack | None:
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

    def _fast_event(self, found: re.Match[bytes], builder: _TraceBuilder, index: int) -> bool:
        """One event matched by _EVENT, as a pending row; False (nothing done) when it needs the
        general path."""
        groups = iter(found.groups())
        fields, memo = self.fields, self.memo
        values: list[Any] = [_MISSING] * len(_FIELDS)
        lists: list[_Stack] = []
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
                if values[slot] is not _MISSING:
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
                    raise _number_error(value, found.start(2 * i + 2))
            elif op == 0x68 or op == 0x6A:  # BINGET, LONG_BINGET
                at = raw[1] if op == 0x68 else int.from_bytes(raw[1:], "little")
                if at >= len(memo):
                    return False
                value = memo[at]
                if value is _CONSUMED:
                    return False
                if type(value) not in _SCALARS and slot != _FRAMES_SLOT and slot != _METADATA_SLOT:
                    return False  # a container where _event_nodes, on the general path, loads whole
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
                value = _BINFLOAT.unpack(raw[1:])[0]
                if math.isnan(value) or not -MAX_NUMBER < value < MAX_NUMBER:
                    raise _number_error(value, found.start(2 * i + 2))
            else:  # NONE, NEWTRUE, NEWFALSE
                value = None if op == 0x4E else op == 0x88
            if slot >= 0:
                values[slot] = value
        frames, metadata = values[_FRAMES_SLOT], values[_METADATA_SLOT]
        builder.nodes += (1 + 2 * pairs - isinstance(frames, list)
                          - (metadata is not _MISSING and type(metadata) not in _SCALARS))
        row = _plain_row(values)
        if row is None:  # anything unusual: the general check, which names what is wrong
            entry = {name: value for name, value in zip(_FIELDS, values) if value is not _MISSING}
            try:
                row = _event_row(entry, builder.device, index, self.table)
            except SnapshotError as error:
                builder.fail(index, str(error))
            self._freeze_frames(frames)  # a memo reference to a list made before
        memo.append(_CONSUMED)  # the event's slot, then its lists'
        memo.extend(lists)
        builder.pending.append(row)
        return True

    def _events(self, builder: _TraceBuilder, position: int, stack: list[Any], end: int) -> int:
        """Events matched whole from `position` on, in a batch of `builder`'s APPENDS, up to `end`
        (the end of the current frame, or of the pickle); returns where the general path goes
        on."""
        match = _EVENT.match
        data = self.data
        while True:
            found = match(data, position, end)  # type: ignore[call-overload]
            if found is None or not self._fast_event(found, builder, builder.count + len(stack)):
                break
            stack.append(_QUEUED)
            position = found.end()
            if position >= end or data[position] != 0x7D:
                break
        if position >= self.next_report:
            self._report(position)
        return position

    def _is_device_traces(self, stack: list[Any], metastack: list[list[Any]]) -> bool:
        """Whether a list made now is the value of the snapshot's 'device_traces'."""
        if metastack:
            return (len(metastack) == 1 and len(metastack[0]) == 1 and type(metastack[0][0]) is dict
                    and len(stack) % 2 == 1 and stack[-1] == "device_traces")
        return len(stack) == 2 and type(stack[0]) is dict and stack[1] == "device_traces"

    def run(self) -> Any:
        """Runs the pickle to its STOP; returns what it built."""
        data, size, memo, frozen, window = self.data, self.size, self.memo, self.frozen, self.window
        stack: list[Any] = []
        metastack: list[list[Any]] = []
        position = 0
        # The current frame, if any: no opcode may run past its end (see _check_opcodes).
        frame_start, frame_end = -1, size
        # Where an opcode and its fixed arguments (9 bytes at most) may begin and be read, and
        # the first of that and the frame's end: one comparison an opcode sees to both.
        safe = size if window is None else -1
        limit = min(frame_end, safe)
        try:
            while True:
                if position >= limit:
                    if position >= safe and window is not None:
                        safe = window.safe_through(position)
                    if position >= frame_end:
                        if frame_start < 0:
                            raise EOFError("pickle data was truncated")
                        if position > frame_end:
                            raise _frame_error(frame_start)
                        frame_start, frame_end = -1, size  # the frame is read: on to what follows it
                    limit = min(frame_end, safe)
                op = data[position]
                position += 1
                if op == 0x6A:  # LONG_BINGET
                    index = int.from_bytes(data[position:position + 4], "little")
                    position += 4
                    stack.append(self._get(index, position - 5))
                elif op == 0x68:  # BINGET
                    position += 1
                    stack.append(self._get(data[position - 1], position - 2))
                elif op == 0x94:  # MEMOIZE
                    value = stack[-1]
                    memo.append(value)
                    if type(value) is _EventDict or type(value) is _EventList or value is _QUEUED:
                        self._memoized(value, len(memo) - 1)
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
                    if type(outer) is _TraceBuilder:
                        after = self._events(outer, position - 1, stack, frame_end)
                        if after != position - 1:
                            position = after
                            continue
                    if type(outer) is _TraceBuilder or (stack and type(stack[-1]) is _TraceBuilder):
                        event = _EventDict()
                        event.memo_index = -1
                        stack.append(event)
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
                        if items[0] is _QUEUED or items[1] is _QUEUED:
                            raise _LoadWhole
                    target = stack[-1]
                    kind = type(target)
                    if (kind is _TraceBuilder or kind is _Stack or target is _QUEUED
                            or ((kind is _EventDict or kind is _EventList) and target.memo_index == _FROZEN)
                            or (kind is list and id(target) in frozen)):
                        raise _LoadWhole
                    if len(items) % 2:
                        raise ValueError("odd number of items for SETITEMS")
                    self._no_tuple_keys(items[::2])
                    for i in range(0, len(items), 2):
                        target[items[i]] = items[i + 1]
                    if position >= self.next_report:
                        self._report(position)
                elif op == 0x65 or op == 0x61:  # APPENDS, APPEND
                    if op == 0x65:
                        items = stack
                        stack = metastack.pop()
                    else:
                        items = [stack.pop()]
                        if items[0] is _QUEUED:
                            raise _LoadWhole
                    target = stack[-1]
                    kind = type(target)
                    if not items:
                        pass  # as pickle: an APPENDS of nothing does not look at its target
                    elif kind is list:
                        if id(target) in frozen:
                            raise _LoadWhole
                        target.extend(items)
                    elif kind is _EventList:
                        if target.memo_index == _FROZEN:
                            raise _LoadWhole
                        target.extend(items)
                    elif kind is _DeviceTraces:
                        target.extend(items)
                    elif kind is _TraceBuilder:
                        self._take(target, items)
                    elif kind is _Stack:
                        raise _LoadWhole
                    else:
                        raise TypeError(f"APPENDS to a {kind.__name__}")
                    if position >= self.next_report:
                        self._report(position)
                elif op == 0x5D:  # EMPTY_LIST
                    outer = metastack[-1][-1] if metastack and metastack[-1] else None
                    top = stack[-1] if stack else None
                    made: list[Any]
                    if type(outer) is _DeviceTraces or type(top) is _DeviceTraces:
                        device = len(outer) + len(stack) if type(outer) is _DeviceTraces else len(top)
                        self.builders.append(_TraceBuilder(device))
                        stack.append(self.builders[-1])
                        continue
                    if ((type(outer) is _EventDict and len(stack) % 2 == 1 and stack[-1] == "frames")
                            or (len(stack) >= 2 and type(stack[-2]) is _EventDict and stack[-1] == "frames")):
                        made = _EventList()
                        made.memo_index = -1  # type: ignore[attr-defined]
                    elif self._is_device_traces(stack, metastack):
                        made = _DeviceTraces()
                    else:
                        made = []
                    stack.append(made)
                elif op == 0x8A or op == 0x8B:  # LONG1, LONG4
                    width = 1 if op == 0x8A else 4
                    count = int.from_bytes(data[position:position + width], "little", signed=op == 0x8B)
                    if count < 0:
                        raise ValueError("LONG pickle has negative byte count")
                    start = position + width
                    position = start + count
                    if position > size:
                        raise EOFError("pickle data was truncated")
                    if position > safe and window is not None:
                        safe = window.safe_through(position)
                        limit = min(frame_end, safe)
                    value = int.from_bytes(data[start:position], "little", signed=True)
                    if count >= 8 and not -MAX_NUMBER < value < MAX_NUMBER:
                        raise _number_error(value, start - width - 1)
                    stack.append(value)
                elif op == 0x4D:  # BININT2
                    stack.append(data[position] | data[position + 1] << 8)
                    position += 2
                elif op in (0x8C, 0x58, 0x8D, 0x43, 0x42, 0x8E):  # strings and bytes
                    width = 1 if op in (0x8C, 0x43) else 4 if op in (0x58, 0x42) else 8
                    count = int.from_bytes(data[position:position + width], "little")
                    start = position + width
                    position = start + count
                    if position > size:
                        raise EOFError("pickle data was truncated")
                    if position > safe and window is not None:
                        safe = window.safe_through(position)
                        limit = min(frame_end, safe)
                    raw = data[start:position]
                    stack.append(str(raw, "utf-8", "surrogatepass") if op in (0x8C, 0x58, 0x8D) else raw)
                elif op == 0x4E:  # NONE
                    stack.append(None)
                elif op == 0x88 or op == 0x89:  # NEWTRUE, NEWFALSE
                    stack.append(op == 0x88)
                elif op == 0x29:  # EMPTY_TUPLE
                    stack.append(())
                elif op == 0x85:  # TUPLE1
                    if stack[-1] is _QUEUED:
                        raise _LoadWhole
                    stack[-1] = self._tuple([stack[-1]])
                elif op == 0x86 or op == 0x87:  # TUPLE2, TUPLE3
                    count = op - 0x84
                    if len(stack) < count:
                        raise IndexError("unpickling stack underflow")
                    items = stack[-count:]
                    if _QUEUED in items:
                        raise _LoadWhole
                    del stack[-count:]
                    stack.append(self._tuple(items))
                elif op == 0x74 or op == 0x6C or op == 0x64:  # TUPLE, LIST, DICT
                    items = stack
                    stack = metastack.pop()
                    if stack and type(stack[-1]) is _TraceBuilder:
                        raise _LoadWhole  # a trace's MARK closed by other than APPENDS: it may hold _QUEUED
                    if op == 0x64:
                        if len(items) % 2:
                            raise ValueError("odd number of items for DICT")
                        self._no_tuple_keys(items[::2])
                        stack.append({items[i]: items[i + 1] for i in range(0, len(items), 2)})
                    else:
                        stack.append(self._tuple(items) if op == 0x74 else items)
                elif op == 0x47:  # BINFLOAT
                    number = _BINFLOAT.unpack_from(data, position)[0]  # type: ignore[arg-type]
                    if math.isnan(number) or not -MAX_NUMBER < number < MAX_NUMBER:
                        raise _number_error(number, position - 1)
                    stack.append(number)
                    position += 8
                elif op == 0x71 or op == 0x72:  # BINPUT, LONG_BINPUT
                    width = 1 if op == 0x71 else 4
                    index = int.from_bytes(data[position:position + width], "little")
                    position += width
                    self._put(index, stack[-1], position - width - 1)
                elif op == 0x95:  # FRAME: a hint for buffered readers, but one that must not lie
                    if frame_start >= 0:
                        raise SnapshotError(f"a frame begins at byte {position - 1} before the frame at "
                                            f"byte {frame_start} ends")
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
                        self._report(self.size)
                    if stack and stack[-1] is _QUEUED:
                        raise _LoadWhole
                    return stack.pop()
                elif op == 0x30:  # POP
                    if stack:
                        if stack.pop() is _QUEUED:
                            raise _LoadWhole
                    else:
                        stack = metastack.pop()
                elif op == 0x31:  # POP_MARK
                    if any(item is _QUEUED for item in stack):
                        raise _LoadWhole
                    stack = metastack.pop()
                elif op == 0x32:  # DUP
                    if stack[-1] is _QUEUED or type(stack[-1]) is _TraceBuilder or type(stack[-1]) is _DeviceTraces:
                        raise _LoadWhole
                    stack.append(stack[-1])
                else:
                    name = _OPCODE_NAMES.get(op)
                    if name is None:
                        raise ValueError(f"unknown opcode {bytes([op])!r} at byte {position - 1}")
                    if name in PLAIN_OPCODES:
                        raise _LoadWhole  # the text opcodes of protocols 0 and 1
                    raise SnapshotError(f"opcode {name} at byte {position - 1} would build objects "
                                        "beyond plain data; refused")
        except (SnapshotError, _LoadWhole):
            raise
        except (IndexError, KeyError, TypeError, ValueError, AttributeError, OverflowError, EOFError,
                MemoryError, RecursionError, struct.error) as error:
            reason = "pickle data was truncated" if position >= size else str(error) or type(error).__name__
            raise SnapshotError(f"not a readable pickle ({reason}); is the file truncated?") from None

    def finish(self, root: Any) -> dict[str, Any]:
        """The snapshot with its traces as TraceColumns, checked as load_snapshot checks it."""
        traces = root.get("device_traces") if type(root) is dict else None
        done: set[int] = set()
        budget = max(MIN_NODE_BUDGET, NODES_PER_BYTE * self.size)
        if isinstance(traces, list):
            traces = list(traces)
            shaped = list(traces)  # what _check_plain walks: each trace read into columns as its shape
            for d, trace in enumerate(traces):
                if type(trace) is _TraceBuilder:
                    if trace.pending or trace.device != d:
                        raise _LoadWhole
                    traces[d] = trace.finish(self.table.stacks)
                    shaped[d] = self._shape(trace, traces[d])
                    done.add(id(trace))
            if any(id(builder) not in done for builder in self.builders):
                raise _LoadWhole  # a trace list somewhere else than device_traces
            root["device_traces"] = shaped  # in place, so that the walk sees a cycle through root
            _check_plain(root, budget)
            root["device_traces"] = traces
        else:
            if self.builders:
                raise _LoadWhole  # a trace list somewhere else than device_traces
            _check_plain(root, budget)
        check_structure(root)
        return columnar(root)

    @staticmethod
    def _shape(builder: _TraceBuilder, trace: TraceColumns) -> _TraceShape:
        """The trace as _check_plain would measure its list of event dicts (_TraceShape)."""
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
            if type(value) not in _SCALARS:
                containers.setdefault(id(value), [value, 0])[1] += 1
        for value, references in containers.values():
            children.append(value)
            weights.append(references)
        return _TraceShape(builder.nodes, builder.count, children, weights)


def read_columnar(data: bytes | mmap.mmap | _FileWindow, progress: Progress | None = None) -> dict[str, Any]:
    reader = _StreamReader(data, progress)
    return reader.finish(reader.run())

# --- loading ---


def loads_snapshot(data: bytes, name: str = "<bytes>", progress: Progress | None = None) -> dict[str, Any]:
    """Loads a snapshot from pickle bytes (not gzipped); see the module's description. `progress`,
    if given, hears how far the checking and the loading have come."""
    try:
        _check_opcodes(data, progress)
        if progress is not None:
            progress("checking", len(data), len(data))
        reader = io.BytesIO(data) if progress is None else _ReportingReader(data, progress)
        value = _RefusingUnpickler(reader).load()
    except SnapshotError as error:
        raise SnapshotError(f"{name}: {error}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError,
            KeyError, AttributeError, MemoryError, RecursionError, OverflowError) as error:
        reason = str(error) or type(error).__name__
        raise SnapshotError(f"{name}: not a readable pickle ({reason}); is the file truncated?") from None
    try:
        _check_plain(value, max(MIN_NODE_BUDGET, NODES_PER_BYTE * len(data)))
        check_structure(value)
    except SnapshotError as error:
        raise SnapshotError(f"{name}: {error}") from None
    return value


def load_snapshot(path: str | Path, progress: Progress | None = None) -> dict[str, Any]:
    """Loads a snapshot file (plain or gzipped pickle) safely; raises SnapshotError."""
    path = Path(path)
    return loads_snapshot(_read_bytes(path), str(path), progress)


def columnar(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The snapshot with each device's trace (a list of event dicts, already checked) as
    TraceColumns; raises SnapshotError for frames that are not lists of dicts."""
    traces = snapshot.get("device_traces", [])
    stacks = _StackTable()
    converted = [trace if isinstance(trace, TraceColumns) else TraceColumns.from_events(trace, d, stacks)
                 for d, trace in enumerate(traces)]
    return {**snapshot, "device_traces": converted} if "device_traces" in snapshot else snapshot


def loads_snapshot_columnar(data: bytes | mmap.mmap | _FileWindow, name: str = "<bytes>",
                            progress: Progress | None = None) -> dict[str, Any]:
    """Loads a snapshot with its traces as TraceColumns, in one pass that never holds a dict
    per trace event (Note [Streaming traces]); as safe as loads_snapshot and refusing the same
    inputs. A pickle laid out unlike those torch and stowage write is loaded whole instead."""
    try:
        return read_columnar(data, progress)
    except SnapshotError as error:
        raise SnapshotError(f"{name}: {error}") from None
    except _LoadWhole:
        pass
    try:
        whole = data.whole() if isinstance(data, _FileWindow) else bytes(data)
    except SnapshotError as error:
        raise SnapshotError(f"{name}: {error}") from None
    except OSError as error:
        raise SnapshotError(f"{name}: cannot read: {error.strerror or error}") from error
    snapshot = loads_snapshot(whole, name, progress)
    try:
        return columnar(snapshot)
    except SnapshotError as error:
        raise SnapshotError(f"{name}: {error}") from None


def load_snapshot_columnar(path: str | Path, progress: Progress | None = None) -> dict[str, Any]:
    """load_snapshot with its traces as TraceColumns: memory a fraction of the file's size."""
    path = Path(path)
    data = _map_bytes(path)
    try:
        return loads_snapshot_columnar(data, str(path), progress)
    finally:
        if isinstance(data, _FileWindow):
            data.close()
