"""The one safety policy of the snapshot reader, which its stack machine
(stowage.snapshot_reader.machine) enforces for both loaders. Pickles can run code, so no snapshot is
given to ``pickle.load``; the machine builds plain data itself and refuses, as it meets them:

- every opcode but those that build plain data (PLAIN_OPCODES: no global, reduce, build,
  extension, persistent id, set or buffer), so a payload that would call ``os.system`` fails
  before anything runs;
- memo indices beyond the file (a memo store may not make a list of the file's size times the
  memo's);
- numbers of 2**60 or more in magnitude, and NaN (large ones could collide in hash tables on
  purpose);
- an opcode that runs past the end of its FRAME, or a FRAME that begins before the last one
  ends (pickle's own rules; the C unpickler does not check them and would read other opcodes
  than those a check saw);
- tuples nested more than MAX_DEPTH deep (hashing one recurses in C without limit) and dict keys
  that are tuples other than () (tuples of numbers can collide on purpose: snapshots key their
  dicts by strings): TupleGuard.

Once built, the result is walked once without recursion (check_plain), with a budget on the size
of the tree it stands for (NODES_PER_BYTE values per byte of pickle, at least MIN_NODE_BUDGET)
and on depth (MAX_DEPTH), so that a memo bomb, whose few bytes expand into a huge tree, and deep
nesting are refused at once; only dicts, lists, tuples, str, bytes, int, float, bool and None are
accepted. A trace read into columns is walked as the event dicts it was (TraceShape).

While it builds, the machine keeps the process's memory within a budget sized by the pickle
(MemoryGuard): memory grows with what a pickle makes, up to 70 bytes a byte of pickle for a file
of one repeated opcode (an EMPTY_LIST is a list), which the walk afterwards would refuse only
once it was built. Every RESIDENT_CHECK_EVERY bytes read, the machine measures the process's
resident memory, and a reading that grew it by more than the budget is refused there.

What a file may expand to before the machine sees it (gzip, pipes) is bounded by
stowage.snapshot_reader.reading; the snapshot's own fields by stowage.snapshot_reader.schema.
"""

from __future__ import annotations

import os
from typing import Any

from stowage.snapshot_reader.errors import SnapshotError

MAX_DEPTH = 64
MAX_NUMBER = 2**60
PLAIN_OPCODES = frozenset(
    """PROTO FRAME STOP MARK POP POP_MARK DUP NONE NEWTRUE NEWFALSE INT BININT BININT1 BININT2
    LONG LONG1 LONG4 FLOAT BINFLOAT STRING BINSTRING SHORT_BINSTRING UNICODE BINUNICODE
    SHORT_BINUNICODE BINUNICODE8 BINBYTES SHORT_BINBYTES BINBYTES8 EMPTY_LIST APPEND APPENDS LIST
    EMPTY_TUPLE TUPLE TUPLE1 TUPLE2 TUPLE3 EMPTY_DICT DICT SETITEM SETITEMS GET BINGET
    LONG_BINGET PUT BINPUT LONG_BINPUT MEMOIZE""".split()
)
MIN_NODE_BUDGET = 1_000_000
NODES_PER_BYTE = 64
ALLOWED_TYPES = (dict, list, tuple, str, bytes, int, float, bool, type(None))
SCALARS = frozenset((str, int, float, bool, type(None), bytes))
TUPLE_KEY = "a dict key is a tuple: snapshots key dicts by strings (tuples can be built to collide in hash tables)"


# The memory a reading may add to the process: a floor, and bytes per byte of pickle. Traces read
# into columns (inspect, diff, replay) take 0.35-0.42 bytes a byte of real snapshots and 2.9 for
# the densest events a pickle can hold: 3 a byte, with the pickle's own bytes held while read,
# keeps a reading within 4 times the file beyond the interpreter. Read as plain Python data
# (load_snapshot) a real snapshot takes 5.6 to 7 times its size (a dict per event), so beyond the
# floor (files of about 30 MB) only the columnar loader reads one: the bound holds for both.
MEMORY_FLOOR = 96 << 20
COLUMNS_MEMORY_PER_BYTE = 3
PLAIN_MEMORY_PER_BYTE = 3
RESIDENT_CHECK_EVERY = 256 << 10  # bytes of pickle between measurements: at most 18 MiB built unseen
_STATM = "/proc/self/statm"
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int | None:
    """The process's resident memory now (Linux), or None where it cannot be read."""
    try:
        with open(_STATM, "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


class MemoryGuard:
    """The budget of one reading: how far the process's resident memory may grow while the machine
    builds, MEMORY_FLOOR plus `per_byte` bytes a byte of pickle. check() raises SnapshotError
    once the growth passes it. Where resident memory cannot be read (not Linux) it checks
    nothing, and check_plain's node budget still bounds what is returned."""

    def __init__(self, size: int, per_byte: int) -> None:
        self.start = resident_bytes()
        self.per_byte = per_byte
        self.budget = MEMORY_FLOOR + per_byte * size

    def check(self, position: int) -> None:
        if self.start is None:
            return
        now = resident_bytes()
        if now is not None and now - self.start > self.budget:
            raise SnapshotError(
                f"reading it grew memory by more than {self.budget >> 20:,} MiB by byte {position:,} "
                f"({MEMORY_FLOOR >> 20} MiB and {self.per_byte} bytes a byte of pickle): refused, as no "
                "snapshot read into columns builds that much (a file of one repeated opcode does; read as "
                "plain data, a large snapshot does too: read it with load_snapshot_columnar)")


def node_budget(size: int) -> int:
    """The values a pickle of `size` bytes may stand for, as a tree."""
    return max(MIN_NODE_BUDGET, NODES_PER_BYTE * size)


def refused_opcode(name: str, position: int) -> SnapshotError:
    return SnapshotError(f"opcode {name} at byte {position} would build objects beyond plain data; refused")


def memo_beyond_file(index: int, position: int) -> SnapshotError:
    return SnapshotError(f"memo index {index} at byte {position} is beyond the file")


def number_error(value: int | float, position: int) -> SnapshotError:
    if isinstance(value, int) and value.bit_length() >= 4000:  # too long to print
        shown = f"of {value.bit_length():,} bits"
    else:
        shown = repr(value)
    return SnapshotError(f"number {shown} at byte {position} is out of any snapshot's range")


def checked_number(value: int | float, position: int) -> int | float:
    """`value`, refused when out of any snapshot's range (or NaN)."""
    if not -MAX_NUMBER < value < MAX_NUMBER:  # NaN compares false too
        raise number_error(value, position)
    return value


def frame_error(frame_start: int) -> SnapshotError:
    return SnapshotError(f"an opcode runs past the end of its frame (the frame at byte {frame_start}); "
                         "refused, as the unpickler would read other opcodes than those checked")


def nested_frame_error(position: int, frame_start: int) -> SnapshotError:
    return SnapshotError(f"a frame begins at byte {position} before the frame at byte {frame_start} ends")


class TupleGuard:
    """Tuples made as the machine goes, refused when nested deeper than MAX_DEPTH; and dict keys,
    refused when they are tuples other than (), before anything hashes them."""

    def __init__(self) -> None:
        # Tuples nested two or more deep, by id (and kept, so that ids stay theirs) -> depth.
        self.depths: dict[int, tuple[int, tuple[Any, ...]]] = {}
        self.made = False  # whether any tuple but () was made: only then are keys looked at

    def make(self, items: list[Any]) -> tuple[Any, ...]:
        made = tuple(items)
        depth = 1
        for item in made:
            if type(item) is tuple:
                depth = max(depth, 1 + self.depths.get(id(item), (1,))[0])
        if depth > MAX_DEPTH:
            raise SnapshotError(f"tuples nested deeper than {MAX_DEPTH} levels: not a snapshot")
        if depth > 1:
            self.depths[id(made)] = (depth, made)
        if made:
            self.made = True
        return made

    def no_tuple_keys(self, keys: list[Any]) -> None:
        if self.made and any(type(key) is tuple and key for key in keys):
            raise SnapshotError(TUPLE_KEY)


class TraceShape:
    """What check_plain measures of a trace read into TraceColumns, whose events it never sees:
    `nodes` values (each event, its keys and the values that are not containers), then each of
    `children` (frames lists and user_metadata) `weights` times, one level below the events."""

    __slots__ = ("nodes", "events", "children", "weights")

    def __init__(self, nodes: int, events: int, children: list[Any], weights: list[int]) -> None:
        self.nodes, self.events, self.children, self.weights = nodes, events, children, weights


def check_plain(value: Any, budget: int) -> None:
    """Checks the unpickled graph without recursion, in time linear in its distinct objects.

    Shared objects (the memo) are visited once; for each container the size and depth of the
    tree it stands for are computed from its children's, so a memo bomb, whose tree is
    exponentially larger than its graph, is measured without being expanded, and refused. A
    TraceShape stands for a trace read into columns, measured as the list of event dicts it was.
    """
    tree_size: dict[int, int] = {}
    depth_of: dict[int, int] = {}
    in_progress: set[int] = set()
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        item, children_done = stack.pop()
        shape = item if type(item) is TraceShape else None
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
            if isinstance(child, (dict, list, tuple)) or type(child) is TraceShape:
                if id(child) in in_progress:
                    raise SnapshotError("contains itself: not a snapshot")
                if id(child) not in tree_size:
                    stack.append((child, False))
            elif not isinstance(child, ALLOWED_TYPES):
                raise SnapshotError(f"holds a {type(child).__name__}; snapshots hold only plain data")

