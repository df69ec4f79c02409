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
pickle is refused there.

What a file may expand to before the machine sees it (gzip, pipes) is bounded by
stowage.snapshot_reader.reading; the snapshot's own fields by stowage.snapshot_reader.schema.
"""

from __future__ import annotations

from stowage import _core

_LIMITS = _core.snapshot_limits

MAX_DEPTH: int = _LIMITS["max_depth"]
MAX_NUMBER: int = _LIMITS["max_number"]
NODES_PER_BYTE: int = _LIMITS["nodes_per_byte"]
MIN_NODE_BUDGET: int = _LIMITS["min_node_budget"]
# Traces read into columns (inspect, diff, replay) take 0.35-0.42 bytes a byte of real snapshots
# and 2.4 for the densest events a pickle can hold: 3 a byte, with the pickle's own bytes held
# while read, keeps a reading within 4 times the file beyond the interpreter. Read as plain Python
# data (load_snapshot) a snapshot shaped as torch writes it takes about 3.4 times its size (a dict
# per event): within the same budget up to the 100 MB the issue names; denser events are refused
# by it, naming load_snapshot_columnar.
MEMORY_FLOOR: int = _LIMITS["memory_floor"]
COLUMNS_MEMORY_PER_BYTE: int = _LIMITS["columns_memory_per_byte"]
PLAIN_MEMORY_PER_BYTE: int = _LIMITS["plain_memory_per_byte"]
RESIDENT_CHECK_EVERY: int = _LIMITS["report_every"]  # bytes of pickle between measurements


def resident_bytes() -> int:
    """The process's resident memory now, in bytes (0 where it cannot be read)."""
    return _core.resident_bytes()  # type: ignore[no-any-return]
