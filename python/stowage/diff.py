"""``stowage diff A B``: what grew or shrank between two memory snapshots.

Both snapshots go through the safe loader. For one device it compares the totals (allocated,
reserved, largest free block, fragmentation, the trace's live peak), the live bytes by allocation
site at the end (sites as ``stowage inspect`` names them), and the segments: those only in A
(given back), only in B (new), and those in both whose size or live bytes changed, matched by
address. The comparison is one C++ call (snapshot/snapshot_diff.hpp, which says how), its text's cells
another (snapshot/diff_report.hpp); this module reads the snapshots and lays the report out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from stowage import _core
from stowage.inspection.command import load_with_progress
from stowage.inspection.findings import as_data, device_segments, device_trace, devices_with_data
from stowage.inspection.text import rows_table
from stowage.snapshot_reader import SnapshotError
from stowage.terminal import console, literal


def add_parser(commands: Any, name: str) -> None:
    parser = commands.add_parser(
        name,
        help="what grew or shrank between two snapshots",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("before", metavar="A", help="the earlier snapshot")
    parser.add_argument("after", metavar="B", help="the later snapshot")
    parser.add_argument("--device", type=int, default=None, help="the device to compare (default: the first with data in both)")
    parser.add_argument("--top", type=int, default=10, help="sites and segments to list each way (default 10)")
    parser.add_argument("--json", action="store_true", help="print the comparison as one JSON object")


TOTALS = ("allocated", "reserved", "segments", "largest_free_block", "fragmentation", "trace_peak")


def compare(before: dict[str, Any], after: dict[str, Any], device: int, top: int) -> _core.SnapshotsDiff:
    """The comparison (snapshot/snapshot_diff.hpp, one call)."""
    return _core.diff(device_trace(before, device), device_segments(before, device), device_trace(after, device),
                      device_segments(after, device), top)


def as_report(found: _core.SnapshotsDiff, device: int) -> dict[str, Any]:
    """The comparison as `stowage diff --json` prints it."""
    totals = {}
    for key in TOTALS:
        a, b = getattr(found.before, key), getattr(found.after, key)
        totals[key] = {"before": a, "after": b, "change": None if a is None or b is None else b - a}
    seg = found.segments
    segments = {"only_before": {"count": seg.only_before, "bytes": seg.only_before_bytes},
                "only_after": {"count": seg.only_after, "bytes": seg.only_after_bytes},
                "changed": as_data(seg.changed), "changed_count": seg.changed_count}
    return {"device": device, "totals": totals, "sites_grew": as_data(found.sites_grew),
            "sites_shrank": as_data(found.sites_shrank), "segments": segments}


def print_report(a: Path, b: Path, device: int, found: _core.SnapshotsDiff, console: Console) -> None:
    """The comparison as the terminal shows it (snapshot/diff_report.hpp makes the cells)."""
    console.print(Text.assemble((literal(a.name), "bold"), " -> ", (literal(b.name), "bold"), f", device {device}"))
    totals, sites, segments, changed = _core.diff_report(found)
    for title, header, left, rows in [totals, *sites]:
        console.print(rows_table(title, header, rows, left=set(left)))
    console.print(segments)
    if changed is not None:
        title, header, left, rows = changed
        console.print(rows_table(title, header, rows, left=set(left)))


def run(args: argparse.Namespace) -> int:
    err = console(stderr=True, soft_wrap=True)
    if args.top < 1:
        err.print("stowage diff: --top must be at least 1")
        return 2
    snapshots = []
    for name in (args.before, args.after):
        try:
            snapshots.append(load_with_progress(Path(name), err, getattr(args, "command_line", None)))
        except SnapshotError as error:
            err.print(f"stowage diff: {literal(str(error))}")
            return 2
    common = sorted(set(devices_with_data(snapshots[0])) & set(devices_with_data(snapshots[1])))
    if args.device is not None:
        if args.device not in common:
            err.print(f"stowage diff: device {args.device} does not have data in both snapshots "
                      f"(devices with data in both: {', '.join(map(str, common)) or 'none'})")
            return 2
        common = [args.device]
    if not common:
        err.print("stowage diff: no device has data in both snapshots")
        return 2
    try:
        found = compare(snapshots[0], snapshots[1], common[0], args.top)
    except (KeyError, TypeError, ValueError) as error:
        err.print(f"stowage diff: malformed snapshot ({type(error).__name__}: {literal(str(error))})")
        return 2
    if args.json:
        print(json.dumps(as_report(found, common[0])))
    else:
        out = console()
        print_report(Path(args.before), Path(args.after), common[0], found,
                     out if out.is_terminal else console(width=160))
    return 0
