"""Reading memory snapshots safely: ``reading`` (a file's bytes, SnapshotError), ``columns`` (trace
events as numpy columns), ``loading`` (the loaders and their memory budget); README: "Replaying
your own snapshots".
"""

from __future__ import annotations

from stowage.snapshot_reader.columns import (ACTION_CODES, ACTIONS, HAS_ADDR, HAS_DEVICE_FREE, HAS_FRAMES, HAS_SIZE,
                                             HAS_STREAM, TIME_BOOL, TIME_FLOAT, TIME_INT, TraceColumns, as_columns,
                                             columnar)
from stowage.snapshot_reader.loading import (load_snapshot, load_snapshot_columnar, loads_snapshot,
                                             loads_snapshot_columnar)
from stowage.snapshot_reader.reading import MAX_STREAM_BYTES, Progress, SnapshotError
