"""The snapshot reader's one pickle stack machine, which both loaders run: in C++
(snapshot/machine.hpp and Note [Reading snapshots] in snapshot/reader.hpp, through
stowage._core), so that a 100 MB file of the densest events a pickle holds reads in a second or
two where a Python machine took half a minute.

``read_plain`` reads a pickle's bytes (or a large file's window, stowage.snapshot_reader.reading)
as plain Python data: what ``load_snapshot`` returns. ``read_columns`` reads them with the events
of device_traces made rows of TraceColumns as they are met (Note [Streaming traces] in
snapshot/trace_stream.hpp): what ``load_snapshot_columnar`` returns; a pickle laid out unlike
those torch and stowage write raises LoadWhole, after which the loader reads it again with
``read_plain``. Either way the result is walked (memo bombs, depth, cycles) and checked against
the format (stowage.snapshot_reader.schema) before it is returned.

Every failure raises SnapshotError (without the file's name, which the loaders add): a refused
opcode or value, or, for anything the bytes do not make sense as, "not a readable pickle (...);
is the file truncated?".
"""

from __future__ import annotations

from typing import Any

from stowage import _core
from stowage.snapshot_reader.columns import Stack, TraceColumns
from stowage.snapshot_reader.errors import Progress, SnapshotError
from stowage.snapshot_reader.guard import COLUMNS_MEMORY_PER_BYTE, PLAIN_MEMORY_PER_BYTE, RESIDENT_CHECK_EVERY
from stowage.snapshot_reader.reading import FileWindow

_REPORT_EVERY = RESIDENT_CHECK_EVERY  # bytes between progress reports and memory checks
_RELEASE_EVERY = _core.snapshot_limits["release_every"]  # bytes of a large file's window given back at a time


class LoadWhole(Exception):
    """The pickle is laid out unlike those torch and stowage write: read it again as plain data."""


def _read(data: bytes | FileWindow, columns: bool, progress: Progress | None, memory_per_byte: int,
          since: int = 0) -> Any:
    buffer, fill = (data.buffer, data.fill_to) if isinstance(data, FileWindow) else (data, None)
    try:
        return _core.read_snapshot(buffer, columns, memory_per_byte, since, _REPORT_EVERY, _RELEASE_EVERY, fill,
                                   progress, TraceColumns, Stack)
    except _core.SnapshotRefused as error:
        raise SnapshotError(str(error)) from None
    except _core.SnapshotReadWhole:
        raise LoadWhole from None


def read_plain(data: bytes | FileWindow, progress: Progress | None = None,
               memory_per_byte: int = PLAIN_MEMORY_PER_BYTE, since: int = 0) -> Any:
    """The snapshot the pickle holds, as plain Python data, checked; the process's memory within
    MEMORY_FLOOR and `memory_per_byte` a byte of pickle over what it was when the reading began,
    or at `since` (resident bytes: a second reading's, counted from the first's)."""
    return _read(data, False, progress, memory_per_byte, since)


def read_columns(data: bytes | FileWindow, progress: Progress | None = None) -> dict[str, Any]:
    """The snapshot with its traces as TraceColumns, checked; raises LoadWhole for a pickle laid
    out unlike those torch and stowage write (Note [Streaming traces])."""
    return _read(data, True, progress, COLUMNS_MEMORY_PER_BYTE)  # type: ignore[no-any-return]
