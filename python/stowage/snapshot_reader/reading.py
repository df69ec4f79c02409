"""Reading a snapshot file's pickle bytes (plain, gzip, pipes and devices), and SnapshotError,
what every part of the snapshot reader raises.

``open_snapshot(path)`` gives the pickle's bytes (gunzipped if the file is gzip), or for a large
uncompressed regular file a ``FileWindow`` that the stack machine (stowage.snapshot_reader.loading)
reads as it goes, filling it through ``fill_to`` and giving its pages back behind it. Every failure
is a SnapshotError: a file that cannot be read, broken or concatenated gzip data, a gzip bomb, a
pipe or device that does not start as a snapshot or does not end, a file that changes while it is
read. The messages name the file, except FileWindow's, which the loaders prefix with it.
"""

from __future__ import annotations

import mmap
import os
import zlib
from pathlib import Path
from collections.abc import Callable
from typing import BinaryIO

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
# An anonymous mapping whose pages, once given back (MADV_DONTNEED), are freed: private, and
# not counted against the machine's memory until written.
_WINDOW_FLAGS = (getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
                 | getattr(mmap, "MAP_NORESERVE", 0))


class FileWindow:
    """A large uncompressed file read as the stack machine goes: an anonymous mapping of the
    file's size, filled _FILL_AHEAD bytes ahead of the reader and given back behind it, so that
    its pages cost memory only while they are read.

    The file itself used to be mapped, which costs the same, but a page read after the file had
    shrunk below it ended the process (SIGBUS), as when a snapshot is rewritten in place
    (torch.cuda.memory._dump_snapshot truncates, then writes) while inspect reads it. Here such a
    read comes up short, and a file whose size or time changed is refused: a SnapshotError."""

    def __init__(self, file: BinaryIO, size: int) -> None:
        self.file, self.size = file, size
        self.buffer = mmap.mmap(-1, size, flags=_WINDOW_FLAGS)
        self.filled = 0  # bytes read into the buffer, from the start
        self.stat = self._stat()

    def _stat(self) -> tuple[int, int, int]:
        stat = os.fstat(self.file.fileno())
        return stat.st_size, stat.st_mtime_ns, stat.st_ino

    def _unchanged(self) -> None:
        if self._stat() != self.stat:
            raise SnapshotError("the file changed while it was read")

    def fill(self, upto: int) -> None:
        """Reads the file into the buffer up to `upto` at least, _FILL_AHEAD beyond what is read."""
        end = min(self.size, max(upto, self.filled + _FILL_AHEAD))
        try:
            with memoryview(self.buffer) as view:
                while self.filled < end:
                    count = self.file.readinto(view[self.filled:end])
                    if not count:  # the file shrank
                        raise SnapshotError("the file changed while it was read")
                    self.filled += count
            self._unchanged()
        except OSError as error:
            raise SnapshotError(f"cannot read: {error.strerror or error}") from error

    def fill_to(self, upto: int) -> int:
        """Fills the buffer up to `upto` at least; returns how far it is filled (the machine reads
        no further)."""
        self.fill(upto)
        return self.filled

    def rewind(self) -> FileWindow:
        """The window, to be read again from the start (its pages behind were given back)."""
        self._unchanged()
        self.file.seek(0)
        self.filled = 0
        return self

    def close(self) -> None:
        self.buffer.close()
        self.file.close()


def open_snapshot(path: Path) -> bytes | FileWindow:
    """The pickle's bytes: a large uncompressed regular file as a FileWindow, others read."""
    try:
        if path.is_file() and path.stat().st_size >= _MAP_AT_LEAST and _WINDOW_FLAGS:
            file = path.open("rb", buffering=0)
            try:
                if file.read(2) != b"\x1f\x8b":
                    file.seek(0)
                    try:
                        return FileWindow(file, os.fstat(file.fileno()).st_size)  # type: ignore[arg-type]
                    except OSError:  # no room for the anonymous mapping: read it all
                        pass
            except BaseException:
                file.close()
                raise
            file.close()
    except OSError as error:
        raise SnapshotError(f"{path}: cannot read: {error.strerror or error}") from error
    return read_bytes(path)


def read_again(data: bytes | FileWindow) -> bytes | FileWindow:
    """The pickle's bytes for a second reading: a FileWindow's file is read again as the machine
    goes (the window gave back what was read), so that a second reading takes no more memory
    than the first."""
    if not isinstance(data, FileWindow):
        return data
    try:
        return data.rewind()
    except OSError as error:
        raise SnapshotError(f"cannot read: {error.strerror or error}") from error
