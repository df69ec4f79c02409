"""``stowage replay``: how much memory a recorded training step needs under stowage.

Each device trace of each snapshot (read as inspect reads it) is replayed through stowage's
CachingAllocator on a simulated device, in C++ over whole columns (snapshot/device_events.hpp: no
Python object per event): its ``alloc`` and ``free_completed`` events and the ends of steps at its
stowage.mark_step() marks. ``--min-capacity`` searches the smallest device, in 2 MiB steps, on
which the replay completes, then verifies it there and 2 MiB below. The figures after ``--warmup``
steps are costed by the simulated device's model (device/host/host_call_costs.hpp); the native
figures (snapshot/native_figures.hpp) are what the allocator that recorded the trace did. README:
"Replaying your own snapshots" lists the figures.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from stowage import _core
from stowage.snapshot_reader import SnapshotError, TraceColumns, as_columns, load_snapshot_columnar
from stowage.terminal import console, literal

STEP = _core.capacity_search_step  # capacities are searched in 2 MiB steps
MAX_CAPACITY = _core.capacity_search_max  # 16 TiB: the simulated device reserves twice its size in address space


def add_parser(commands: Any, name: str) -> None:
    parser = commands.add_parser(
        name,
        help="replay memory snapshots through stowage on a simulated device",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("traces", nargs="+", metavar="TRACE", help="snapshot pickles (.pickle, .pickle.gz)")
    parser.add_argument("--capacity", default="1TiB", help="simulated device size (default 1TiB)")
    parser.add_argument("--min-capacity", action="store_true", help="search the smallest device that fits")
    parser.add_argument("--config", default="", help="allocator configuration, key:value,key:value")
    parser.add_argument("--json", action="store_true", help="one JSON object per trace and device")
    parser.add_argument("--warmup", type=int, default=None,
                        help="steps before the steady state is judged (default: 2, or two cycles)")


TraceLike = TraceColumns | Sequence[dict[str, Any]]


def device_events(trace: TraceLike) -> _core.ReplayEvents:
    """The alloc and free_completed events of one device, and the ends of steps that
    stowage.mark_step() recorded, in order, as ReplayEvents."""
    return _core.ReplayEvents(*device_event_arrays(trace))


def device_event_arrays(trace: TraceLike) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """device_events' arrays (uint8 kinds; uint64 addresses, sizes, streams): ReplayEvents' arguments."""
    return _core.device_event_arrays(as_columns(trace))  # type: ignore[no-any-return]


def native_figures(snapshot: dict[str, Any], device: int) -> _core.NativeFigures:
    """What the allocator that recorded the device's trace did (snapshot/native_figures.hpp)."""
    traces = snapshot.get("device_traces", [])
    return _core.native_figures(as_columns(traces[device] if device < len(traces) else []),
                                snapshot.get("segments", []), device)


# step_period(kinds, sizes): the number of steps after which the trace's steps repeat (1: every
# step alike; 4: a cycle of four shapes), judged by the sizes each step allocates in order, leaving
# out the first step (it makes the optimizer's state); None when they never repeat.
step_period = _core.step_period


def min_capacity(events: _core.ReplayEvents, peak_requested: int, config: str, known_fit: int | None,
                 progress: Progress | None = None) -> dict[str, Any]:
    """The smallest capacity, in 2 MiB steps, on which the replay completes, searched then
    verified (allocator/capacity_search.hpp); known_fit is a capacity already seen to fit, if any."""
    if progress is None:
        return events.min_capacity(peak_requested, config, known_fit, lambda done, total: None)
    task = progress.add_task("min capacity", total=None)
    try:
        return events.min_capacity(peak_requested, config, known_fit,
                                   lambda done, total: progress.update(task, completed=done, total=total))
    finally:
        progress.remove_task(task)


def replay_snapshot(path: Path, snapshot: dict[str, Any], capacity: int, config: str,
                    search: bool, progress: Progress | None = None,
                    warmup: int | None = None) -> list[dict[str, Any]]:
    """One result per device trace of the snapshot."""
    results = []
    for device, trace in enumerate(snapshot.get("device_traces", [])):
        arrays = device_event_arrays(trace)
        events = _core.ReplayEvents(*arrays)
        if len(events) == 0:
            continue
        result: dict[str, Any] = {"trace": str(path), "device": device, "trace_entries": len(trace)}
        replayed = events.replay(capacity, config)
        throughput = events.replay(capacity, config, measure_latency=False)
        period = step_period(arrays[0], arrays[2])
        warm = _core.after_warmup(replayed["steps"], 2 * (period or 1) if warmup is None else warmup)
        result.update(replayed, capacity=capacity, config=config, step_period=period, after_warmup=warm)
        result["events_per_second"] = len(events) / throughput["seconds"] if throughput["seconds"] else None
        result.update(native_figures(snapshot, device).replay_fields(replayed["peak_requested"]), min_capacity=None)
        if search:
            known_fit = replayed["peak_reserved"] if not replayed["oom"] else None
            result.update(min_capacity(events, replayed["peak_requested"], config, known_fit, progress))
        results.append(result)
    return results


def print_table(results: list[dict[str, Any]], console: Console) -> None:
    """The results as stowage replay's table (allocator/replay_table.hpp makes the cells) and its notes."""
    columns, rows, notes = _core.replay_table(results)
    table = Table(title="stowage replay (MiB; ratios to the peak of requested bytes)")
    for column in columns:
        table.add_column(column, justify="left" if column == "trace" else "right")
    for row in rows:
        table.add_row(*map(literal, row))
    console.print(table)
    for line in notes:
        console.print(literal(line))


def run(args: argparse.Namespace) -> int:
    err = console(stderr=True)
    try:
        config = _core.normalize_allocator_config(args.config)
        capacity = _core.parse_byte_size(args.capacity)
    except ValueError as error:
        err.print(f"stowage replay: {literal(str(error))}")
        return 2
    if not 0 < capacity <= MAX_CAPACITY:
        err.print(f"stowage replay: --capacity must be between 1 byte and {_core.format_bytes(MAX_CAPACITY)}")
        return 2
    results: list[dict[str, Any]] = []
    status = 0
    with Progress(console=err, transient=True, disable=not err.is_terminal) as progress:
        loading = progress.add_task("traces", total=len(args.traces))
        for name in args.traces:
            path = Path(name)
            progress.update(loading, description=f"replaying {literal(path.name)}")
            try:
                snapshot = load_snapshot_columnar(path, command=getattr(args, "command_line", None))
            except SnapshotError as error:
                err.print(f"stowage replay: {literal(str(error))}")
                status = 2
                progress.advance(loading)
                continue
            try:
                found = replay_snapshot(path, snapshot, capacity, config, args.min_capacity, progress,
                                        args.warmup)
            except (ValueError, RuntimeError, MemoryError) as error:
                err.print(f"stowage replay: {literal(str(path))}: {literal(str(error))}")
                status = 2
                progress.advance(loading)
                continue
            if not found:
                err.print(f"stowage replay: {literal(str(path))}: no alloc or free events to replay")
            if args.json:
                for result in found:
                    print(json.dumps(result), flush=True)
            results.extend(found)
            progress.advance(loading)
    if not args.json and results:
        out = console()
        print_table(results, out if out.is_terminal else console(width=200))
    return status
