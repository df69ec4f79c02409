"""Replay speed: events per second of stowage's replay, per trace, median of repeated replays.

    python bench/replay/replay_throughput.py [--repeat N] [--config CONFIG] TRACE...

For each trace: the time to load it safely (stowage.snapshot_reader, as replay does), and the replay of its
alloc and free events through the CachingAllocator on a simulated device (C++, no latency
probes), as the median of N replays. "events" are the replayed alloc and free events; the
trace's other entries (segment events, free_requested) are also given, as "entries".
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from stowage.snapshot_reader import load_snapshot_columnar
from stowage.trace import device_events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("traces", nargs="+")
    parser.add_argument("--repeat", type=int, default=11)
    parser.add_argument("--config", default="", help="allocator configuration (default: defaults)")
    args = parser.parse_args()
    print(f"{'trace':44} {'entries':>8} {'events':>8} {'load s':>7} {'replay ms':>10} "
          f"{'M events/s':>10} {'M entries/s':>11}")
    for name in args.traces:
        start = time.perf_counter()
        snapshot = load_snapshot_columnar(name)
        load = time.perf_counter() - start
        for device, trace in enumerate(snapshot["device_traces"]):
            events = device_events(trace)
            seconds = statistics.median(
                events.replay(1 << 40, args.config, measure_latency=False)["seconds"] for _ in range(args.repeat))
            print(f"{Path(name).name:44} {len(trace):8,} {len(events):8,} {load:7.2f} "
                  f"{seconds * 1e3:10.2f} {len(events) / seconds / 1e6:10.1f} "
                  f"{len(trace) / seconds / 1e6:11.1f}")


if __name__ == "__main__":
    main()
