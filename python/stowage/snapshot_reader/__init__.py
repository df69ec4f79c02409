"""Reading memory snapshots safely, by concern:

- ``reading``: a file's pickle bytes (gzip, pipes and devices, large files read as the reader goes);
- ``guard``: the safety policy's numbers (opcodes, memo, numbers, frames, tuples, the plain-data
  walk, memory);
- ``schema``: the snapshot format (structural checks naming the first bad field, action codes);
- ``columns``: trace events as numpy columns (TraceColumns);
- ``loading``: the loaders, which run the one pickle stack machine, enforcing the guard and
  reading trace events into columns as they are met: in C++ (snapshot/, Note [Reading snapshots]
  in snapshot/reader.hpp), through stowage._core.

The names below are the package's interface.
"""

from __future__ import annotations

from stowage.snapshot_reader.columns import TraceColumns, as_columns, columnar
from stowage.snapshot_reader.errors import Progress, SnapshotError
from stowage.snapshot_reader.guard import MAX_DEPTH, MAX_NUMBER
from stowage.snapshot_reader.loading import (load_snapshot, load_snapshot_columnar, loads_snapshot,
                                             loads_snapshot_columnar)
from stowage.snapshot_reader.reading import MAX_EXPANSION, MAX_STREAM_BYTES, MIN_DECOMPRESSED_LIMIT
from stowage.snapshot_reader.schema import (ACTION_CODES, ACTIONS, HAS_ADDR, HAS_DEVICE_FREE, HAS_FRAMES,
                                            HAS_SIZE, HAS_STREAM, MAX_DEVICES, MAX_SIZE, TIME_BOOL,
                                            TIME_FLOAT, TIME_INT, TRACE_ACTIONS, check_structure)

__all__ = [
    "ACTIONS", "ACTION_CODES", "HAS_ADDR", "HAS_DEVICE_FREE", "HAS_FRAMES", "HAS_SIZE", "HAS_STREAM",
    "MAX_DEPTH", "MAX_DEVICES", "MAX_EXPANSION", "MAX_NUMBER", "MAX_SIZE", "MAX_STREAM_BYTES",
    "MIN_DECOMPRESSED_LIMIT", "TIME_BOOL", "TIME_FLOAT", "TIME_INT", "TRACE_ACTIONS", "Progress",
    "SnapshotError", "TraceColumns", "as_columns", "check_structure", "columnar", "load_snapshot",
    "load_snapshot_columnar", "loads_snapshot", "loads_snapshot_columnar",
]
