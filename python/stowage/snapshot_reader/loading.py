"""Loading memory snapshots safely: every loader runs the one pickle stack machine, in C++
(snapshot/machine.hpp, Note [Reading snapshots] in snapshot/reader.hpp), over the bytes
stowage.snapshot_reader.reading gives; no snapshot is given to ``pickle.load``. ``load_snapshot``
returns plain Python data; ``load_snapshot_columnar`` the same dict with each device's trace as
TraceColumns, its events made rows as they are met (Note [Streaming traces] in
snapshot/trace_stream.hpp; a pickle laid out unlike those torch and stowage write is read again as
plain data). Every failure raises SnapshotError naming the file (or ``name``) and the reason.

Memory: every _REPORT_EVERY bytes read the machine measures the process's resident memory, and
refuses a reading that grew it by more than MEMORY_FLOOR plus COLUMNS_MEMORY_PER_BYTE (into columns:
real snapshots take 0.35-0.42 bytes a byte, one whose every event has frames of its own up to 11.5)
or PLAIN_MEMORY_PER_BYTE (plain data: about 3.4 as torch writes them, so load_snapshot reads those
up to about 100 MB and refuses denser ones naming load_snapshot_columnar) bytes a byte of pickle,
or by more than the ceiling (memory_ceiling()), its message saying what to do instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stowage import _core
from stowage.byte_counts import in_range
from stowage.snapshot_reader.columns import Stack, TraceColumns, columnar
from stowage.snapshot_reader.reading import Progress, SnapshotError, open_snapshot

Pickle = bytes | _core.FileWindow  # a large file's window is read as the machine goes

_LIMITS = _core.snapshot_limits
MEMORY_FLOOR: int = _LIMITS["memory_floor"]
COLUMNS_MEMORY_PER_BYTE: int = _LIMITS["columns_memory_per_byte"]
PLAIN_MEMORY_PER_BYTE: int = _LIMITS["plain_memory_per_byte"]
MEMORY_CEILING: int = _LIMITS["memory_ceiling"]
_REPORT_EVERY: int = _LIMITS["report_every"]  # bytes of pickle between memory measurements and progress reports
_RELEASE_EVERY = _LIMITS["release_every"]  # bytes of a large file's window given back at a time
CEILING_VARIABLE: str = _LIMITS["ceiling_variable"]  # STOWAGE_SNAPSHOT_MEMORY


def memory_ceiling() -> int:
    """The most a reading may grow the process's memory: the environment's STOWAGE_SNAPSHOT_MEMORY
    (a size such as "2GiB", from 16 MiB to 1 TiB) where it is set, else MEMORY_CEILING;
    SnapshotError naming the variable for one that is not such a size."""
    text = os.environ.get(CEILING_VARIABLE, "")
    if not text:
        return MEMORY_CEILING
    try:
        return in_range(text, CEILING_VARIABLE, 16 << 20, 1 << 40, "a size from 16MiB to 1TiB")
    except (TypeError, ValueError) as error:
        raise SnapshotError(str(error)) from None


PLAIN_REMEDY = ("read as plain data (a dict per trace event) a large snapshot takes several times its size, where "
                "load_snapshot_columnar, which stowage inspect, diff and replay read with, takes a fraction of it "
                "(a file of one repeated opcode grows memory this fast too)")


class _LoadWhole(Exception):
    """The pickle is laid out unlike those torch and stowage write: read it again as plain data."""


def _read(data: Pickle, columns: bool, progress: Progress | None, memory_per_byte: int, since: int,
          remedy: str) -> Any:
    """The machine's reading of `data`, plain or into columns, its memory growth from `since`
    (resident bytes; 0: now) within MEMORY_FLOOR and `memory_per_byte` a byte of pickle, at most
    the ceiling (memory_ceiling()); `remedy` ends a refusal for memory."""
    try:
        return _core.read_snapshot(data, columns, memory_per_byte, memory_ceiling(), remedy, since,
                                   _REPORT_EVERY, _RELEASE_EVERY, progress, TraceColumns, Stack)
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
def _opened(path: Path) -> Iterator[Pickle]:
    data = open_snapshot(path)
    try:
        yield data
    finally:
        if isinstance(data, _core.FileWindow):
            data.close()


def loads_snapshot(data: Pickle, name: str = "<bytes>", progress: Progress | None = None,
                   memory_per_byte: int = PLAIN_MEMORY_PER_BYTE, since: int = 0,
                   remedy: str | None = None) -> dict[str, Any]:
    """Loads a snapshot from pickle bytes (not gzipped) as plain Python data, as _read reads it (`since`:
    a second reading's start); `progress` hears how far it has come; `remedy` defaults to reading into columns."""
    with _named(name):
        return _read(data, False, progress, memory_per_byte, since,  # type: ignore[no-any-return]
                     PLAIN_REMEDY if remedy is None else remedy)


def load_snapshot(path: str | Path, progress: Progress | None = None) -> dict[str, Any]:
    """Loads a snapshot file (plain or gzipped pickle) as plain Python data; raises SnapshotError."""
    path = Path(path)
    with _opened(path) as data:
        return loads_snapshot(data, str(path), progress)


def loads_snapshot_columnar(data: Pickle, name: str = "<bytes>", progress: Progress | None = None,
                            command: str | None = None) -> dict[str, Any]:
    """Loads a snapshot with its traces as TraceColumns, as the module docstring says; `command`: the
    command line reading it (stowage inspect's, diff's, replay's), which a refusal for memory names."""
    start = _core.resident_bytes()
    try:
        with _named(name):
            return _read(data, True, progress, COLUMNS_MEMORY_PER_BYTE, 0,  # type: ignore[no-any-return]
                         _core.columns_remedy(len(data), command))
    except _LoadWhole:
        pass
    if isinstance(data, _core.FileWindow):  # read again as the machine goes: no more memory than the first time
        try:
            data.rewind()
        except _core.SnapshotRefused as error:
            raise SnapshotError(f"{name}: {error}") from None
    # Read whole within the commands' memory budget, not load_snapshot's, and counted from where
    # the first reading began (what it left in the process counts): torch and stowage never
    # write such a pickle, and a hostile one must not buy a larger budget by its layout.
    snapshot = loads_snapshot(data, name, progress, COLUMNS_MEMORY_PER_BYTE, start,
                              _core.columns_remedy(len(data), command))
    with _named(name):
        return columnar(snapshot)


def load_snapshot_columnar(path: str | Path, progress: Progress | None = None,
                           command: str | None = None) -> dict[str, Any]:
    """load_snapshot with its traces as TraceColumns: memory a fraction of the file's size.
    `command`: the command line reading it, which a refusal for memory names."""
    path = Path(path)
    with _opened(path) as data:
        return loads_snapshot_columnar(data, str(path), progress, command)
