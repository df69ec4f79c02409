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
from stowage.snapshot_reader.guard import (COLUMNS_MEMORY_PER_BYTE, PLAIN_MEMORY_PER_BYTE, RESIDENT_CHECK_EVERY,
                                           columns_remedy, memory_ceiling, plain_remedy)
from stowage.snapshot_reader.reading import FileWindow

_REPORT_EVERY = RESIDENT_CHECK_EVERY  # bytes between progress reports and memory checks
_RELEASE_EVERY = _core.snapshot_limits["release_every"]  # bytes of a large file's window given back at a time


class LoadWhole(Exception):
    """The pickle is laid out unlike those torch and stowage write: read it again as plain data."""


def _read(data: bytes | FileWindow, columns: bool, progress: Progress | None, memory_per_byte: int,
          since: int = 0, remedy: str = "") -> Any:
    buffer, fill = (data.buffer, data.fill_to) if isinstance(data, FileWindow) else (data, None)
    try:
        return _core.read_snapshot(buffer, columns, memory_per_byte, memory_ceiling(), remedy, since, _REPORT_EVERY,
                                   _RELEASE_EVERY, fill, progress, TraceColumns, Stack)
    except _core.SnapshotRefused as error:
        raise SnapshotError(str(error)) from None
    except _core.SnapshotReadWhole:
        raise LoadWhole from None


def read_plain(data: bytes | FileWindow, progress: Progress | None = None,
               memory_per_byte: int = PLAIN_MEMORY_PER_BYTE, since: int = 0, remedy: str | None = None) -> Any:
    """The snapshot the pickle holds, as plain Python data, checked; the process's memory within
    MEMORY_FLOOR and `memory_per_byte` a byte of pickle (at most the ceiling, guard.memory_ceiling())
    over what it was when the reading began, or at `since` (resident bytes: a second reading's,
    counted from the first's). `remedy`: what its refusal says to do (default: read into columns)."""
    return _read(data, False, progress, memory_per_byte, since, plain_remedy() if remedy is None else remedy)


def read_columns(data: bytes | FileWindow, progress: Progress | None = None,
                 command: str | None = None) -> dict[str, Any]:
    """The snapshot with its traces as TraceColumns, checked; raises LoadWhole for a pickle laid
    out unlike those torch and stowage write (Note [Streaming traces]). `command`: the command line
    reading it, which a refusal for memory names with the ceiling to give it."""
    size = data.size if isinstance(data, FileWindow) else len(data)
    return _read(data, True, progress, COLUMNS_MEMORY_PER_BYTE, 0,  # type: ignore[no-any-return]
                 columns_remedy(size, command))
