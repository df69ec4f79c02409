"""Loading memory snapshots safely: every loader runs the one pickle stack machine, in C++
(snapshot/machine.hpp and Note [Reading snapshots] in snapshot/reader.hpp, through stowage._core),
over the bytes stowage.snapshot_reader.reading gives (a large file's window read as it goes).
Reading into columns, the events of device_traces become rows of TraceColumns as they are met
(Note [Streaming traces] in snapshot/trace_stream.hpp); a pickle laid out unlike those torch and
stowage write is read again as plain data. Either way the result is walked (memo bombs, depth,
cycles) and checked against the format (stowage.snapshot_reader.schema) before it is returned.

A snapshot is a pickle (optionally gzipped) of the dict that ``torch.cuda.memory._snapshot()``
returns, written by ``torch.cuda.memory._dump_snapshot`` or by stowage. ``load_snapshot`` returns
it as plain Python data. ``load_snapshot_columnar`` returns the same dict with each device's
trace as TraceColumns (stowage.snapshot_reader.columns), which is what ``stowage inspect``, ``diff`` and
``replay`` read: it never holds a dict per trace event (Note [Streaming traces], in
snapshot/trace_stream.hpp), so its memory is a fraction of the file's size. It loads what
``load_snapshot`` loads and refuses what it refuses, and also refuses frames that are not lists
of dicts (the columns keep them as stacks), which ``load_snapshot`` does not look at.

Every failure raises SnapshotError naming the file (or ``name``) and the reason: a refused opcode
or value, or, for anything the bytes do not make sense as, "not a readable pickle (...); is the
file truncated?". A reading's
memory is bounded by the pickle's size and a ceiling (stowage.snapshot_reader.guard): within 96
MiB and 3 bytes a byte of pickle read as plain data, 12 read into columns, and at most 768 MiB
whatever the file (STOWAGE_SNAPSHOT_MEMORY sets another ceiling), for any layout. A snapshot
shaped as torch writes it takes about 3.4 times its size as plain data (a dict per event), so
load_snapshot reads those up to about 100 MB (in about a second a 25 MB); denser ones it refuses
by that budget, at once, naming load_snapshot_columnar, which reads them in a fraction of their
size: 0.4 for a training loop's trace, whose events share their frame lists (up to about 1.8 GB
within the ceiling), up to 11.5 for one whose every event has frames of its own (up to 56 MB; a
larger one is refused naming the ceiling to set).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stowage import _core
from stowage.snapshot_reader.columns import Stack, TraceColumns, columnar
from stowage.snapshot_reader.errors import Progress, SnapshotError
from stowage.snapshot_reader.guard import (COLUMNS_MEMORY_PER_BYTE, PLAIN_MEMORY_PER_BYTE, RESIDENT_CHECK_EVERY,
                                           columns_remedy, memory_ceiling, plain_remedy, resident_bytes)
from stowage.snapshot_reader.reading import FileWindow, open_snapshot, read_again

_REPORT_EVERY = RESIDENT_CHECK_EVERY  # bytes between progress reports and memory checks
_RELEASE_EVERY = _core.snapshot_limits["release_every"]  # bytes of a large file's window given back at a time


class _LoadWhole(Exception):
    """The pickle is laid out unlike those torch and stowage write: read it again as plain data."""


def _read(data: bytes | FileWindow, columns: bool, progress: Progress | None, memory_per_byte: int, since: int,
          remedy: str) -> Any:
    """The machine's reading of `data`, plain or into columns, its memory growth from `since`
    (resident bytes; 0: now) within MEMORY_FLOOR and `memory_per_byte` a byte of pickle, at most
    the ceiling (guard.memory_ceiling()); `remedy` ends a refusal for memory."""
    buffer, fill = (data.buffer, data.fill_to) if isinstance(data, FileWindow) else (data, None)
    try:
        return _core.read_snapshot(buffer, columns, memory_per_byte, memory_ceiling(), remedy, since,
                                   _REPORT_EVERY, _RELEASE_EVERY, fill, progress, TraceColumns, Stack)
    except _core.SnapshotRefused as error:
        raise SnapshotError(str(error)) from None
    except _core.SnapshotReadWhole:
        raise _LoadWhole from None


@contextmanager
def _named(name: str) -> Iterator[None]:
    """SnapshotErrors raised within, with `name` before their reason."""
    try:
        yield
    except SnapshotError as error:
        raise SnapshotError(f"{name}: {error}") from None


@contextmanager
def _opened(path: Path) -> Iterator[bytes | FileWindow]:
    data = open_snapshot(path)
    try:
        yield data
    finally:
        if isinstance(data, FileWindow):
            data.close()


def loads_snapshot(data: bytes | FileWindow, name: str = "<bytes>", progress: Progress | None = None,
                   memory_per_byte: int = PLAIN_MEMORY_PER_BYTE, since: int = 0,
                   remedy: str | None = None) -> dict[str, Any]:
    """Loads a snapshot from pickle bytes (not gzipped) as plain Python data. `progress`, if
    given, hears how far the loading has come; the reading may grow the process's memory by
    MEMORY_FLOOR and `memory_per_byte` a byte of pickle, at most the ceiling
    (stowage.snapshot_reader.guard), over what it was at the start, or at `since` (resident bytes)
    for a second reading; `remedy`: what a refusal for memory says to do (default: read into
    columns)."""
    with _named(name):
        return _read(data, False, progress, memory_per_byte, since,  # type: ignore[no-any-return]
                     plain_remedy() if remedy is None else remedy)


def load_snapshot(path: str | Path, progress: Progress | None = None) -> dict[str, Any]:
    """Loads a snapshot file (plain or gzipped pickle) as plain Python data; raises SnapshotError."""
    path = Path(path)
    with _opened(path) as data:
        return loads_snapshot(data, str(path), progress)


def loads_snapshot_columnar(data: bytes | FileWindow, name: str = "<bytes>", progress: Progress | None = None,
                            command: str | None = None) -> dict[str, Any]:
    """Loads a snapshot with its traces as TraceColumns, in one pass that never holds a dict per
    trace event; a pickle laid out unlike those torch and stowage write is read again as plain
    data, whose traces then become columns. `command`: the command line reading it (stowage
    inspect's, diff's, replay's), which a refusal for memory names."""
    start = resident_bytes()
    size = data.size if isinstance(data, FileWindow) else len(data)
    try:
        with _named(name):
            return _read(data, True, progress, COLUMNS_MEMORY_PER_BYTE, 0,  # type: ignore[no-any-return]
                         columns_remedy(size, command))
    except _LoadWhole:
        pass
    with _named(name):
        again = read_again(data)
    # Read whole within the commands' memory budget, not load_snapshot's, and counted from where
    # the first reading began (what it left in the process counts): torch and stowage never
    # write such a pickle, and a hostile one must not buy a larger budget by its layout.
    size = again.size if isinstance(again, FileWindow) else len(again)
    snapshot = loads_snapshot(again, name, progress, COLUMNS_MEMORY_PER_BYTE, start, columns_remedy(size, command))
    with _named(name):
        return columnar(snapshot)


def load_snapshot_columnar(path: str | Path, progress: Progress | None = None,
                           command: str | None = None) -> dict[str, Any]:
    """load_snapshot with its traces as TraceColumns: memory a fraction of the file's size.
    `command`: the command line reading it, which a refusal for memory names."""
    path = Path(path)
    with _opened(path) as data:
        return loads_snapshot_columnar(data, str(path), progress, command)
