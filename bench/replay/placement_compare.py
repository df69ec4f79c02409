"""Learned placement against the dynamic paged pool on recorded traces: memory and replay speed.

    python bench/replay/placement_compare.py [--repeats N] TRACE...

For every trace, replays its events under the default configuration and under
``placement:learned``, alternating the two N times in this one process (so that the machine's
noise falls on both alike), and prints a Markdown table: peak reserved under each, what learned
placement did (step layouts, departures, requests placed, the layout's packing against its live
peak) and the median replay speed of each with their ratio.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from stowage.snapshot_reader import load_snapshot_columnar
from stowage.replay import device_events

CAPACITY = 1 << 40
LEARNED = "placement:learned"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="+")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    print("| trace | events | dynamic reserved MiB | learned reserved MiB | layouts / departures | "
          "requests placed | layout arena / layout live peak | dynamic M events/s | "
          "learned M events/s | speed ratio |")
    print("| --- | ---: | ---: | ---: | --- | ---: | --- | ---: | ---: | ---: |")
    for name in args.traces:
        trace = device_events(load_snapshot_columnar(name)["device_traces"][0])
        seconds: dict[str, list[float]] = {"": [], LEARNED: []}
        last: dict[str, dict] = {}
        for _ in range(args.repeats):
            for config in ("", LEARNED):
                result = trace.replay(CAPACITY, config, False)
                seconds[config].append(result["seconds"])
                last[config] = result
        events = last[""]["events"]
        dynamic = events / statistics.median(seconds[""]) / 1e6
        learned = events / statistics.median(seconds[LEARNED]) / 1e6
        r = last[LEARNED]
        packing = (f"{r['arena_bytes'] / 2**20:,.0f} / {r['layout_live_bytes'] / 2**20:,.0f} MiB"
                   if r["arena_bytes"] else "-")
        print(f"| {Path(name).name} | {events:,} | {last['']['peak_reserved'] / 2**20:,.0f} | "
              f"{r['peak_reserved'] / 2**20:,.0f} | {r['layouts_made']} / {r['departures']} | "
              f"{r['placed_allocations']:,} | {packing} | {dynamic:.1f} | {learned:.1f} | "
              f"{learned / dynamic:.2f} |")


if __name__ == "__main__":
    main()
