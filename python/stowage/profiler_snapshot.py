"""A memory snapshot of a PyTorch workload on the CPU, from torch.profiler.

``profiled_snapshot(step, steps)`` runs ``step`` under torch.profiler with memory profiling on, collects
every allocation and free of the CPU allocator (address, size, time), puts them in order, and
returns a snapshot-format dict whose ``device_traces[0]`` holds ``alloc``, ``free_requested``
and ``free_completed`` events, as torch.cuda.memory._snapshot() would for a GPU, and after each
step the mark that stowage.mark_step() writes (a "snapshot" event whose user_metadata is
"stowage.mark_step"), so replays know where steps end. No segments are listed: the CPU
allocator has none. The profiler reports allocations as a tree of events;
events with equal timestamps are put in the one order consistent with the running total of
allocated bytes that the profiler records beside each event.
"""

from __future__ import annotations

import gzip
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch._C._profiler import _EventType
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from stowage import _core

MARK_STEP = "stowage.mark_step"  # the profiler range that ends a step, and the mark's metadata


def profiled_snapshot(step: Callable[[int], None], steps: int) -> dict[str, Any]:
    """Runs step(0), ..., step(steps - 1) under the profiler; returns the snapshot dict."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        for index in range(steps):
            step(index)
            with record_function(MARK_STEP):
                pass
    columns: tuple[list[int], ...] = ([], [], [], [])  # time_ns, address, signed size, total after
    marks: list[int] = []
    stack = list(profiler.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation:
            fields = node.extra_fields
            if str(fields.device) == "cpu" and fields.alloc_size != 0:
                for column, value in zip(columns, (node.start_time_ns, fields.ptr, fields.alloc_size,
                                                   fields.total_allocated)):
                    column.append(value)
        elif node.name == MARK_STEP:
            marks.append(node.start_time_ns)
        stack.extend(node.children)
    return {
        "segments": [],
        "device_traces": [_core.profiled_trace(*columns, marks, MARK_STEP)],  # (snapshot/profiler_order.hpp)
        "allocator_settings": {"recorded_by": "stowage.profiler_snapshot (torch.profiler, CPU)"},
    }


def save_snapshot(snapshot: dict[str, Any], path: str | Path) -> None:
    """Writes a snapshot as pickle protocol 4 (what memory_viz reads), gzipped for .gz names."""
    path = Path(path)
    data = pickle.dumps(snapshot, protocol=4)
    if path.suffix == ".gz":
        data = gzip.compress(data, mtime=0)
    path.write_bytes(data)
