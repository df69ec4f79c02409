"""Reading memory snapshots safely, by concern:

- ``reading``: a file's pickle bytes (gzip, pipes and devices, large files read as the reader
  goes), and SnapshotError;
- ``columns``: the snapshot format's trace events as numpy columns (TraceColumns);
- ``loading``: the loaders, which run the one pickle stack machine in C++ (snapshot/, Note [Reading
  snapshots] in snapshot/reader.hpp) within their memory budget.
"""

from __future__ import annotations

from stowage.snapshot_reader.columns import (ACTION_CODES, ACTIONS, HAS_ADDR, HAS_DEVICE_FREE, HAS_FRAMES, HAS_SIZE,
                                             HAS_STREAM, TIME_BOOL, TIME_FLOAT, TIME_INT, TraceColumns, as_columns,
                                             columnar)
from stowage.snapshot_reader.loading import (load_snapshot, load_snapshot_columnar, loads_snapshot,
                                             loads_snapshot_columnar)
from stowage.snapshot_reader.reading import MAX_STREAM_BYTES, Progress, SnapshotError
