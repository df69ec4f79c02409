"""The snapshot reader's safety policy, by the numbers. The policy is enforced in C++, by the one
pickle machine both loaders run (snapshot/, Note [Reading snapshots] in snapshot/reader.hpp): no
snapshot is given to ``pickle.load``; the machine builds plain data itself and refuses, as it
meets them:

- every opcode but those that build plain data (no global, reduce, build, extension, persistent
  id, set or buffer), so a payload that would call ``os.system`` fails before anything runs;
- memo indices beyond the file (a memo store may not make a list of the file's size times the
  memo's);
- numbers of MAX_NUMBER or more in magnitude, and NaN (large ones could collide in hash tables on
  purpose);
- an opcode that runs past the end of its FRAME, or a FRAME that begins before the last one ends
  (pickle's own rules; the C unpickler does not check them and would read other opcodes than
  those a check saw);
- tuples nested more than MAX_DEPTH deep (hashing one recurses in C without limit) and dict keys
  that are tuples other than () (tuples of numbers can collide on purpose: snapshots key their
  dicts by strings).

Once built, the result is walked once without recursion, with a budget on the size of the tree it
stands for (NODES_PER_BYTE values a byte of pickle, at least MIN_NODE_BUDGET) and on depth
(MAX_DEPTH): a memo bomb, whose few bytes expand into a huge tree, and deep nesting are refused
from the graph, without expanding it. A trace read into columns is walked as the event dicts it
was.

While it builds, the machine keeps the process's memory within a budget sized by the pickle:
memory grows with what a pickle makes, up to about 90 bytes a byte of pickle for a file of one
repeated opcode (an EMPTY_LIST is a list). Every RESIDENT_CHECK_EVERY bytes read, the machine
measures the process's resident memory, and a reading that grew it by more than MEMORY_FLOOR and
COLUMNS_MEMORY_PER_BYTE (read into columns) or PLAIN_MEMORY_PER_BYTE (plain data) bytes a byte of
pickle, or by more than the ceiling whatever the file's size (MEMORY_CEILING; the environment's
STOWAGE_SNAPSHOT_MEMORY, a size such as "2GiB", sets another: memory_ceiling()), is refused there,
its message saying what to do instead.

What a file may expand to before the machine sees it (gzip, pipes) is bounded by
stowage.snapshot_reader.reading; the snapshot's own fields by stowage.snapshot_reader.schema.
"""

from __future__ import annotations

import os

from stowage import _core
from stowage.byte_counts import in_range
from stowage.snapshot_reader.errors import SnapshotError

_LIMITS = _core.snapshot_limits

MAX_DEPTH: int = _LIMITS["max_depth"]
MAX_NUMBER: int = _LIMITS["max_number"]
NODES_PER_BYTE: int = _LIMITS["nodes_per_byte"]
MIN_NODE_BUDGET: int = _LIMITS["min_node_budget"]
# Traces read into columns (inspect, diff, replay) take 0.35-0.42 bytes a byte of real snapshots
# (frame lists shared between events, as torch writes a training loop's), 2.4 for the densest
# events a pickle can hold, and up to 11.5 for a trace whose every event has frames of its own (a
# dict a frame, the densest torch writes): 12 a byte reads those, up to the ceiling (768 MiB: a
# file of 56 MB of them; 1.9 GB of real snapshots), and keeps a hostile file of any size within it
# and the interpreter, under 1 GB. Read as plain Python data (load_snapshot) a snapshot shaped as
# torch writes it takes about 3.4 times its size (a dict per event): within 3 a byte and the floor
# up to the 100 MB the issue names; denser ones are refused, naming load_snapshot_columnar.
MEMORY_FLOOR: int = _LIMITS["memory_floor"]
COLUMNS_MEMORY_PER_BYTE: int = _LIMITS["columns_memory_per_byte"]
PLAIN_MEMORY_PER_BYTE: int = _LIMITS["plain_memory_per_byte"]
MEMORY_CEILING: int = _LIMITS["memory_ceiling"]
RESIDENT_CHECK_EVERY: int = _LIMITS["report_every"]  # bytes of pickle between measurements
CEILING_VARIABLE = "STOWAGE_SNAPSHOT_MEMORY"
_MiB = 1 << 20


def memory_ceiling() -> int:
    """The most a reading may grow the process's memory: the environment's STOWAGE_SNAPSHOT_MEMORY
    (a size such as "2GiB", from 16 MiB to 1 TiB) where it is set, else MEMORY_CEILING;
    SnapshotError naming the variable for one that is not such a size."""
    text = os.environ.get(CEILING_VARIABLE, "")
    if not text:
        return MEMORY_CEILING
    try:
        return in_range(text, CEILING_VARIABLE, 16 * _MiB, 1 << 40, "a size from 16MiB to 1TiB")
    except (TypeError, ValueError) as error:
        raise SnapshotError(str(error)) from None


def plain_remedy() -> str:
    """What a refusal of a plain-data reading says to do."""
    return ("read as plain data (a dict per trace event) a large snapshot takes several times its size, where "
            "load_snapshot_columnar, which stowage inspect, diff and replay read with, takes a fraction of it "
            "(a file of one repeated opcode grows memory this fast too)")


def columns_remedy(size: int, command: str | None) -> str:
    """What a refusal of a reading into columns says to do, for a file of `size` bytes read by
    `command` (the command line that read it; None: a program's call)."""
    needed = MEMORY_FLOOR + COLUMNS_MEMORY_PER_BYTE * size
    suggested = f"{max(2, -(-needed // (1 << 30)))}GiB"
    where = f"{CEILING_VARIABLE}={suggested} {command}" if command else \
        f"{CEILING_VARIABLE}={suggested} in the environment of the program that reads it"
    return (f"a trace whose events carry stack frames of their own takes up to {COLUMNS_MEMORY_PER_BYTE} bytes a "
            f"byte read into columns, and no snapshot more (a file of one repeated opcode does); to read a larger "
            f"one, raise the ceiling: {where}; or record fewer frames "
            "(torch.cuda.memory._record_memory_history(stacks=\"python\"), or a smaller max_entries)")


def resident_bytes() -> int:
    """The process's resident memory now, in bytes (0 where it cannot be read)."""
    return _core.resident_bytes()  # type: ignore[no-any-return]
