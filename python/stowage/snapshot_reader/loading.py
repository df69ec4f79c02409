"""Loading memory snapshots safely: every loader runs the one stack machine
(stowage.snapshot_reader.machine, in C++) over the bytes stowage.snapshot_reader.reading gives.

A snapshot is a pickle (optionally gzipped) of the dict that ``torch.cuda.memory._snapshot()``
returns, written by ``torch.cuda.memory._dump_snapshot`` or by stowage. ``load_snapshot`` returns
it as plain Python data. ``load_snapshot_columnar`` returns the same dict with each device's
trace as TraceColumns (stowage.snapshot_reader.columns), which is what ``stowage inspect``, ``diff`` and
``replay`` read: it never holds a dict per trace event (Note [Streaming traces], in
snapshot/trace_stream.hpp), so its memory is a fraction of the file's size. It loads what
``load_snapshot`` loads and refuses what it refuses, and also refuses frames that are not lists
of dicts (the columns keep them as stacks), which ``load_snapshot`` does not look at.

Every failure raises SnapshotError naming the file (or ``name``) and the reason. A reading's
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

from stowage.snapshot_reader.columns import columnar
from stowage.snapshot_reader.errors import Progress, SnapshotError
from stowage.snapshot_reader.guard import (COLUMNS_MEMORY_PER_BYTE, PLAIN_MEMORY_PER_BYTE, columns_remedy,
                                           resident_bytes)
from stowage.snapshot_reader.machine import LoadWhole, read_columns, read_plain
from stowage.snapshot_reader.reading import FileWindow, open_snapshot, read_again


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
        return read_plain(data, progress, memory_per_byte, since, remedy)  # type: ignore[no-any-return]


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
    try:
        with _named(name):
            return read_columns(data, progress, command)
    except LoadWhole:
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
