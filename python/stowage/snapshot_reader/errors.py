"""What every part of the snapshot reader raises, and how it reports progress.

A snapshot that cannot be loaded (unreadable, hostile, or not a snapshot) raises SnapshotError,
whose message the loaders (stowage.snapshot_reader.loading) prefix with the file's name; no other
exception leaves them.
"""

from __future__ import annotations

from collections.abc import Callable

from stowage.validation.errors import InputError


class SnapshotError(InputError):
    """A snapshot file that cannot be loaded: unreadable, hostile, or not a snapshot. One of
    stowage.validation's InputErrors: its message (control characters escaped) names the file,
    once the loaders have prefixed it, and the reason."""

    def __init__(self, message: str) -> None:
        super().__init__("", "", message)


# Reports a phase's progress: (phase, bytes done, bytes in all).
Progress = Callable[[str, int, int], None]
