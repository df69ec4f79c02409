"""Reading a snapshot file's pickle bytes (plain, gzip, pipes and devices), and SnapshotError,
what every part of the snapshot reader raises.

``open_snapshot(path)`` gives the pickle's bytes (gunzipped if the file is gzip), or for a large
uncompressed regular file a ``FileWindow`` (snapshot/file_window.hpp) that the stack machine
(stowage.snapshot_reader.loading) reads as it goes, giving its pages back behind it. Every failure
is a SnapshotError: a file that cannot be read, broken or concatenated gzip data, a gzip bomb, a
pipe or device that does not start as a snapshot or does not end, a file that changes while it is
read. The messages name the file, except FileWindow's, which the loaders prefix with it.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path

from stowage import _core
from stowage.validation import InputError


class SnapshotError(InputError):
    """A snapshot that cannot be loaded: unreadable, hostile, or not a snapshot. Its message (control
    characters escaped) names the file, once the loaders have prefixed it, and the reason; no other
    exception leaves the loaders."""

    def __init__(self, message: str) -> None:
        super().__init__("", "", message)


# Reports a phase's progress: (phase, bytes done, bytes in all).
Progress = Callable[[str, int, int], None]

# gzip: decompressed bytes per compressed byte. Real snapshots expand 6 to 25 times; at about 70
# bytes of objects a byte of pickle, 64 bounds what a hostile file can make the loaders build to
# about 4.5 KB a byte of gzip. A real file refused here can be gunzipped and read as a plain
# pickle, whose budgets go by its own size.
MAX_EXPANSION = 64
# What any gzip file may expand to. Unpickling costs up to about 70 bytes of objects a byte of
# pickle (an EMPTY_LIST is a list), so this bounds what a small file can make the loaders build:
# at 64 MiB, 60 KiB of gzip became 4.5 GiB of lists.
MIN_DECOMPRESSED_LIMIT = 8 << 20


_MEASURE_CHUNK = 16 << 20  # bytes of gzip output measured, then dropped, at a time


def _bomb(path: Path) -> SnapshotError:
    return SnapshotError(f"{path}: gzip data expands more than {MAX_EXPANSION} times, which no recorded "
                         "snapshot does (a gzip bomb?); if this is a real snapshot, gunzip it and pass the .pickle")


def _expanded_size(raw: bytes, path: Path, limit: int) -> None:
    """Decompresses `raw` once, keeping nothing, to refuse a gzip bomb before its expansion is
    held in memory (reading it whole first took up to 64 times the file's size to refuse it)."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    total, pending = 0, raw
    try:
        while pending:
            total += len(inflater.decompress(pending, _MEASURE_CHUNK))
            pending = inflater.unconsumed_tail
            if total > limit:
                raise _bomb(path)
    except zlib.error as error:
        raise SnapshotError(f"{path}: broken gzip data: {error}") from error


def _gunzip(raw: bytes, path: Path) -> bytes:
    limit = max(MIN_DECOMPRESSED_LIMIT, MAX_EXPANSION * len(raw))
    _expanded_size(raw, path, limit)
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        data = inflater.decompress(raw, limit + 1)
    except zlib.error as error:
        raise SnapshotError(f"{path}: broken gzip data: {error}") from error
    if len(data) > limit or inflater.unconsumed_tail:
        raise _bomb(path)
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


def read_bytes(path: Path) -> bytes:
    try:
        regular = path.is_file() or not path.exists() or path.is_dir()
        raw = path.read_bytes() if regular else _read_stream(path)
    except OSError as error:
        raise SnapshotError(f"{path}: cannot read: {error.strerror or error}") from error
    return _gunzip(raw, path) if raw[:2] == b"\x1f\x8b" else raw


_MAP_AT_LEAST = 8 << 20  # files this large are read as the stack machine goes, not at once
_FILL_AHEAD = 8 << 20  # bytes of such a file read ahead of the reader at a time


def open_snapshot(path: Path) -> bytes | _core.FileWindow:
    """The pickle's bytes: a large uncompressed regular file as a FileWindow (snapshot/file_window.hpp:
    read as the machine goes, its pages given back behind it), others read."""
    try:
        if path.is_file() and path.stat().st_size >= _MAP_AT_LEAST:
            with path.open("rb") as file:
                compressed = file.read(2) == b"\x1f\x8b"
            window = None if compressed else _core.open_file_window(str(path), _FILL_AHEAD)
            if window is not None:  # (None: no room for its mapping: read it all)
                return window
    except OSError as error:
        raise SnapshotError(f"{path}: cannot read: {error.strerror or error}") from error
    except _core.SnapshotRefused as error:
        raise SnapshotError(f"{path}: {error}") from None
    return read_bytes(path)
