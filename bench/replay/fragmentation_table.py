"""Memory of each trace under each allocator configuration, as a Markdown table.

    python bench/replay/fragmentation_table.py [--config NAME=CONFIG ...] TRACE...

Runs `stowage replay --min-capacity` (in process) on every trace for every configuration
(default: the default configuration and the segment path, virtual_memory:off) and prints, per
trace and configuration, the peak of requested bytes, the peak reserved on a device with room to
spare and the smallest device the trace fits (both with their ratio to the requested peak),
PyTorch's own reserve where the trace records it, the pages mapped and unmapped, and the replay
speed. Ratios above the targets (1.03 reserved, 1.02 smallest device) are marked.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from stowage.replay import replay_snapshot
from stowage.snapshot_reader import load_snapshot_columnar

RESERVED_TARGET = 1.03
CAPACITY_TARGET = 1.02


def _ratio(value: int | None, base: int, target: float | None = None) -> str:
    if value is None:
        return "-"
    ratio = value / base
    mark = " **over**" if target is not None and ratio > target else ""
    return f"{value / 2**20:,.0f} ({ratio:.3f}){mark}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="+")
    parser.add_argument("--config", action="append", default=[],
                        help="NAME=CONFIG, e.g. paged=virtual_memory:on (repeatable)")
    args = parser.parse_args()
    configs = [tuple(item.split("=", 1)) for item in args.config] or [
        ("default", ""), ("segments", "virtual_memory:off")]
    print("| trace | configuration | peak requested MiB | reserved MiB (ratio) | smallest device MiB "
          "(ratio) | PyTorch reserved MiB (ratio) | maps / unmaps | M events/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.traces:
        snapshot = load_snapshot_columnar(name)
        for label, config in configs:
            results: list[dict[str, Any]] = replay_snapshot(Path(name), snapshot, 1 << 40, config,
                                                           search=True)
            for r in results:
                base = r["peak_requested"]
                native = r["native_peak_reserved"] if r["native_comparable"] else None
                speed = r["events_per_second"]
                print(f"| {Path(name).name} | {label} | {base / 2**20:,.0f} | "
                      f"{_ratio(r['peak_reserved'], base, RESERVED_TARGET)} | "
                      f"{_ratio(r['min_capacity'], base, CAPACITY_TARGET)} | {_ratio(native, base)} | "
                      f"{r['maps']:,} / {r['unmaps']:,} | "
                      f"{'-' if speed is None else f'{speed / 1e6:.1f}'} |")


if __name__ == "__main__":
    main()
