"""Loading memory snapshots safely.

A snapshot is a pickle (optionally gzipped) of the dict that ``torch.cuda.memory._snapshot()``
returns, written by ``torch.cuda.memory._dump_snapshot`` or by stowage. Pickles can run code,
so ``load_snapshot`` never uses ``pickle.load`` as is:

1. before unpickling, every opcode is checked: only those that build plain data are allowed
   (no global, reduce, build, extension, persistent id, set or buffer: a payload that would call
   ``os.system`` fails before anything runs), memo indices must be within the file, and
   numbers must be plausible (below 2**60: larger ones could collide in hash tables on
   purpose); gzip data may expand at most 256 times, so a gzip bomb is refused too; the
   unpickler itself also refuses every global;
2. the result is walked once, without recursion, with a budget on the size of the tree it
   stands for (64 values per byte of pickle, at least a million; real snapshots need under 3)
   and on depth (64), so a memo bomb, whose few bytes expand into a huge tree, or deep nesting
   is refused at once; only dicts, lists, tuples, str, bytes, int, float, bool and None are
   accepted;
3. a structural check names the first field that is wrong (``device_traces[0][12].size:
   expected int, got str``). Optional fields (time_us, frames, allocator_settings, ...) may be
   missing.

Every failure raises ``SnapshotError`` with the file name and the reason.
"""

from __future__ import annotations

import io
import math
import pickle
import pickletools
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

MAX_DEPTH = 64
MAX_EXPANSION = 256  # gzip: decompressed bytes per compressed byte
MIN_DECOMPRESSED_LIMIT = 64 << 20
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
MIN_NODE_BUDGET = 1_000_000
NODES_PER_BYTE = 64
ALLOWED_TYPES = (dict, list, tuple, str, bytes, int, float, bool, type(None))

TRACE_ACTIONS = {
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "snapshot",
    "oom",
}


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
        raise SnapshotError(f"{path}: gzip data expands more than {MAX_EXPANSION} times: "
                            "not a snapshot (a gzip bomb)")
    if not inflater.eof:
        raise SnapshotError(f"{path}: broken gzip data: truncated")
    return data


def _read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise SnapshotError(f"{path}: cannot read: {error.strerror or error}") from error
    return _gunzip(raw, path) if raw[:2] == b"\x1f\x8b" else raw


# Reports a phase's progress: (phase, bytes done, bytes in all).
Progress = Callable[[str, int, int], None]
_REPORT_EVERY = 1 << 16  # opcodes between progress reports


class _ReportingReader(io.BytesIO):
    """The pickle's bytes, reporting how far the unpickler has read."""

    def __init__(self, data: bytes, progress: Progress) -> None:
        super().__init__(data)
        self._progress = progress
        self._total = len(data)
        self._reported = 0

    def _report(self) -> None:
        position = self.tell()
        if position - self._reported >= 1 << 20 or position == self._total:
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


def _check_opcodes(data: bytes, progress: Progress | None = None) -> None:
    """Refuses, before anything is built, what a snapshot pickle never holds."""
    try:
        for count, (opcode, argument, position) in enumerate(pickletools.genops(data)):
            if progress is not None and count % _REPORT_EVERY == 0:
                progress("checking", position, len(data))
            name = opcode.name
            if name not in PLAIN_OPCODES:
                raise SnapshotError(
                    f"opcode {name} at byte {position} would build objects beyond plain data; refused"
                )
            if name in MEMO_OPCODES and argument is not None and argument > len(data):
                raise SnapshotError(f"memo index {argument} at byte {position} is beyond the file")
            if name in NUMBER_OPCODES and isinstance(argument, (int, float)) and not (
                -MAX_NUMBER < argument < MAX_NUMBER and not (isinstance(argument, float) and math.isnan(argument))
            ):
                raise SnapshotError(f"number {argument!r} at byte {position} is out of any snapshot's range")
    except (ValueError, EOFError) as error:
        raise SnapshotError(f"not a readable pickle ({error}); is the file truncated?") from None


def _check_plain(value: Any, budget: int) -> None:
    """Checks the unpickled graph without recursion, in time linear in its distinct objects.

    Shared objects (the memo) are visited once; for each container the size and depth of the
    tree it stands for are computed from its children's, so a memo bomb, whose tree is
    exponentially larger than its graph, is measured without being expanded, and refused.
    """
    tree_size: dict[int, int] = {}
    depth_of: dict[int, int] = {}
    in_progress: set[int] = set()
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        item, children_done = stack.pop()
        if not isinstance(item, ALLOWED_TYPES):
            raise SnapshotError(f"holds a {type(item).__name__}; snapshots hold only plain data")
        if not isinstance(item, (dict, list, tuple)):
            continue
        key = id(item)
        children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
        if children_done:
            size, depth = 1, 0
            for child in children:
                size += tree_size.get(id(child), 1)
                depth = max(depth, depth_of.get(id(child), 0))
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
            if isinstance(child, (dict, list, tuple)):
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


def check_structure(snapshot: Any) -> None:
    """Raises SnapshotError naming the first field that does not fit the snapshot format."""
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
        _expect(trace, list, f"device_traces[{d}]")
        for k, entry in enumerate(trace):
            where = f"device_traces[{d}][{k}]"
            _expect(entry, dict, where)
            action = entry.get("action")
            if action is None:
                raise SnapshotError(f"{where}: missing 'action'")
            _expect(action, str, f"{where}.action")
            if action not in TRACE_ACTIONS:
                raise SnapshotError(f"{where}.action: unknown action {action!r}")
            # torch's oom entries carry device_free (the device's free bytes) where others carry
            # addr; stowage's older ones carry addr.
            needed = ("size",) if action == "oom" else ("addr", "size")
            for field in needed:
                if field not in entry and action != "snapshot":
                    raise SnapshotError(f"{where}: missing '{field}'")
            if action == "oom" and "addr" not in entry and "device_free" not in entry:
                raise SnapshotError(f"{where}: missing 'device_free'")
            for field, upper in (("addr", 2**64), ("size", MAX_SIZE), ("stream", 2**64),
                                 ("device_free", 2**64)):
                if field in entry:
                    _expect(entry[field], int, f"{where}.{field}")
                    if not 0 <= entry[field] < upper:
                        raise SnapshotError(f"{where}.{field}: {entry[field]} is out of range [0, {upper})")
            if "time_us" in entry:
                _expect(entry["time_us"], (int, float), f"{where}.time_us")


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
