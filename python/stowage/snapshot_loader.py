"""The snapshot reader's former module, kept so that code importing it keeps working: the reader
is now the package stowage.snapshot_reader (one module per concern: reading, guard, schema, columns,
machine, events, loading), whose interface this re-exports unchanged: the same objects, so each
name has one meaning."""

from __future__ import annotations

from stowage.snapshot_reader import (ACTION_CODES, ACTIONS, HAS_ADDR, HAS_DEVICE_FREE, HAS_FRAMES, HAS_SIZE,
                                     HAS_STREAM, MAX_DEPTH, MAX_DEVICES, MAX_EXPANSION, MAX_NUMBER, MAX_SIZE,
                                     MAX_STREAM_BYTES, MIN_DECOMPRESSED_LIMIT, TIME_BOOL, TIME_FLOAT,
                                     TIME_INT, TRACE_ACTIONS, Progress, SnapshotError, TraceColumns, __all__,
                                     check_structure, columnar, load_snapshot, load_snapshot_columnar,
                                     loads_snapshot, loads_snapshot_columnar)

__all__ = list(__all__)  # noqa: PLE0605 (the package's list)
