"""Replay speed: events per second of stowage's replay, per trace, median of repeated replays.

    python bench/replay/replay_throughput.py [--repeat N] [--config CONFIG] [--against SO] TRACE...

For each trace: the time to load it safely (stowage.snapshot_reader, as ``stowage replay``
does), and the replay of its alloc and free events through the CachingAllocator on a simulated
device (C++, no latency probes), as the median of N replays. "events" are the replayed alloc and
free events; the trace's other entries (segment events, free_requested) are also given, as
"entries". With ``--against`` another build's compiled core (a ``_core*.so``, from an earlier
commit say) replays the same events in the same run: each round replays every trace once in a
fresh process of each build, the builds taking turns, and the table gives both speeds and their
ratio (two builds of one extension cannot share a process).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import numpy as np


def load_core(path: str) -> ModuleType:
    """A build's stowage._core, imported from its file."""
    spec = importlib.util.spec_from_file_location("_core", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{path}: not a compiled module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def worker(core_path: str, arrays_path: str, config: str) -> None:
    """Replays every trace saved in `arrays_path` once; prints the seconds, as JSON."""
    core = load_core(core_path)
    saved = np.load(arrays_path)
    seconds = []
    for index in range(len(saved.files) // 4):
        trace = core.Trace(*(saved[f"{index}_{part}"] for part in range(4)))
        seconds.append(trace.replay(1 << 40, config, measure_latency=False)["seconds"])
    print(json.dumps(seconds))


def rounds(core_path: str, arrays_path: str, config: str) -> list[float]:
    command = [sys.executable, __file__, "--worker", core_path, arrays_path, "--config", config]
    return json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="+")
    parser.add_argument("--repeat", type=int, default=11)
    parser.add_argument("--config", default="", help="allocator configuration (default: defaults)")
    parser.add_argument("--against", help="another build's _core*.so to compare with, in turns")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.traces[0], args.traces[1], args.config)
        return
    from stowage import _core
    from stowage.snapshot_reader import load_snapshot_columnar
    from stowage.replay import device_event_arrays

    rows = []  # (name, entries, events, load seconds)
    saved: dict[str, np.ndarray] = {}
    for name in args.traces:
        start = time.perf_counter()
        snapshot = load_snapshot_columnar(name)
        load = time.perf_counter() - start
        for trace in snapshot["device_traces"]:
            arrays = device_event_arrays(trace)
            for part, array in enumerate(arrays):
                saved[f"{len(rows)}_{part}"] = array
            rows.append((Path(name).name, len(trace), len(arrays[0]), load))
    with tempfile.TemporaryDirectory() as folder:
        arrays_path = str(Path(folder) / "events.npz")
        np.savez(arrays_path, **saved)
        builds = [str(_core.__file__)] + ([args.against] if args.against else [])
        times: list[list[list[float]]] = [[] for _ in builds]
        for _ in range(args.repeat):
            for build, path in enumerate(builds):
                times[build].append(rounds(path, arrays_path, args.config))
    print(f"{'trace':44} {'entries':>8} {'events':>8} {'load s':>7} {'replay ms':>10} "
          f"{'M events/s':>10} {'M entries/s':>11}" + (f" {'against':>10} {'ratio':>6}" if args.against else ""))
    for index, (name, entries, events, load) in enumerate(rows):
        seconds = statistics.median(run[index] for run in times[0])
        line = (f"{name:44} {entries:8,} {events:8,} {load:7.2f} {seconds * 1e3:10.2f} "
                f"{events / seconds / 1e6:10.1f} {entries / seconds / 1e6:11.1f}")
        if args.against:
            against = statistics.median(run[index] for run in times[1])
            line += f" {events / against / 1e6:10.1f} {against / seconds:6.3f}"
        print(line)


if __name__ == "__main__":
    main()
