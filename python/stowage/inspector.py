"""``stowage inspect``: what held the memory, from a PyTorch memory snapshot.

Reads a snapshot written by ``torch.cuda.memory._dump_snapshot`` or by stowage (through the safe
loader, which runs no code) and explains one device's memory in the terminal, or as JSON:

- totals: allocated, active, reserved, reserved but unallocated, the largest free block, and
  fragmentation = 1 - largest free block / reserved-but-unallocated bytes (0 when nothing is
  free): the share of free cached memory that a single request could not use;
- segments: how many, their sizes, how full, and those held by one small live block (a segment
  that cannot go back to the device for the sake of a few bytes);
- allocation sites by live bytes at the end and at the peak of the trace: stacks grouped by
  their innermost frames in user code (frames of torch and of Python's own library left out);
  without frames, by size class;
- the live-bytes timeline of the trace (alloc adds, free_completed subtracts): its peak, when
  (time_us, or the event index when the trace has no times), and what was live then;
- ``--html OUT``: the same as one self-contained HTML file with a stacked live-memory timeline by
  site and a segment map (stowage/html_report.py);
- for an ``oom`` event: what was asked, what the device had free, what was live and where from,
  and what would have helped: the same trace replayed through stowage, and the sites that
  offloading or recomputing could remove.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from stowage import _core
from stowage.snapshot_loader import SnapshotError, load_snapshot
from stowage.trace import device_events, native_figures

_LIBRARY_PARTS = ("site-packages/", "dist-packages/", "/lib/python3", "<frozen ", "/torch/")
_SMALL_SEGMENT = 0.25  # a segment whose one live block fills less than this share of it


def add_parser(commands: Any, name: str) -> None:
    parser = commands.add_parser(
        name,
        help="explain what held the memory in a snapshot",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("snapshot", metavar="SNAPSHOT", help="a snapshot pickle (.pickle, .pickle.gz)")
    parser.add_argument("--device", type=int, default=None, help="the device to explain (default: the first with data)")
    parser.add_argument("--top", type=int, default=10, help="allocation sites to list (default 10)")
    parser.add_argument("--json", action="store_true", help="print the findings as one JSON object")
    parser.add_argument("--html", metavar="OUT", help="also write a self-contained HTML report (plots and tables)")


# --- sites ---


def _is_user_frame(frame: dict[str, Any]) -> bool:
    filename = str(frame.get("filename", ""))
    if not filename.endswith(".py"):
        return False  # C++ frames and frames without a file
    return not any(part in filename for part in _LIBRARY_PARTS)


def site_of(frames: list[dict[str, Any]] | None, size: int) -> str:
    """Where an allocation came from: its innermost user frame (file:line in function), else its
    innermost Python frame, else its size class."""
    if frames:
        for frame in frames:
            if _is_user_frame(frame):
                return f"{frame['filename']}:{frame.get('line', 0)} in {frame.get('name', '?')}"
        for frame in frames:
            if str(frame.get("filename", "")).endswith(".py"):
                return f"{frame['filename']}:{frame.get('line', 0)} in {frame.get('name', '?')}"
    return size_class(size)


def size_class(size: int) -> str:
    """Requests by powers of four: 'size 64 KiB-256 KiB' and so on."""
    if size <= 512:
        return "size <= 512 B"
    low = 512
    while low * 4 < size:
        low *= 4
    return f"size {_core.format_bytes(low)}-{_core.format_bytes(low * 4)}"


# --- findings ---


@dataclass
class Totals:
    allocated: int = 0
    active: int = 0
    requested: int = 0
    reserved: int = 0
    reserved_unallocated: int = 0
    largest_free_block: int = 0
    fragmentation: float = 0.0
    segments: int = 0


@dataclass
class SegmentSummary:
    count: int = 0
    by_size: list[dict[str, Any]] = field(default_factory=list)  # size bucket, count, bytes
    fill_quartiles: list[float] = field(default_factory=list)  # allocated / total: 25%, 50%, 75%
    held_by_one_small_block: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Peak:
    live_bytes: int = 0
    event_index: int = -1
    time_us: int | None = None
    baseline: int = 0  # bytes live before the trace's first event, as far as the end tells
    sites: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class OomExplanation:
    event_index: int
    requested: int
    device_free: int
    live_bytes: int
    sites: list[dict[str, Any]]
    stowage_peak_reserved: int | None = None
    stowage_peak_requested: int | None = None
    native_peak_reserved: int | None = None


def totals_of(segments: list[dict[str, Any]]) -> Totals:
    totals = Totals(segments=len(segments))
    for segment in segments:
        totals.reserved += int(segment["total_size"])
        for block in segment.get("blocks", []):
            size = int(block["size"])
            state = block.get("state", "")
            if state == "active_allocated":
                totals.allocated += size
                totals.requested += int(block.get("requested_size", size))
            if state.startswith("active"):
                totals.active += size
            elif state == "inactive":
                totals.largest_free_block = max(totals.largest_free_block, size)
    totals.reserved_unallocated = totals.reserved - totals.allocated
    free = totals.reserved - totals.active
    totals.fragmentation = 1 - totals.largest_free_block / free if free > 0 else 0.0
    return totals


_SIZE_BUCKETS = ((2 << 20, "<= 2 MiB"), (20 << 20, "<= 20 MiB"), (128 << 20, "<= 128 MiB"),
                 (1 << 30, "<= 1 GiB"), (None, "> 1 GiB"))


def segments_of(segments: list[dict[str, Any]], top: int) -> SegmentSummary:
    summary = SegmentSummary(count=len(segments))
    buckets = {label: [0, 0] for _, label in _SIZE_BUCKETS}
    fills = []
    held = []
    for segment in segments:
        total = int(segment["total_size"])
        for limit, label in _SIZE_BUCKETS:
            if limit is None or total <= limit:
                buckets[label][0] += 1
                buckets[label][1] += total
                break
        live = [b for b in segment.get("blocks", []) if str(b.get("state", "")).startswith("active")]
        live_bytes = sum(int(b["size"]) for b in live)
        fills.append(live_bytes / total if total else 0.0)
        if len(live) == 1 and live_bytes < _SMALL_SEGMENT * total:
            block = live[0]
            held.append({"address": int(segment["address"]), "segment_bytes": total,
                         "live_bytes": live_bytes, "held_back": total - live_bytes,
                         "site": site_of(block.get("frames"), live_bytes)})
    summary.by_size = [{"size": label, "count": count, "bytes": size}
                       for label, (count, size) in buckets.items() if count]
    if fills:
        fills.sort()
        summary.fill_quartiles = [fills[min(len(fills) - 1, int(q * len(fills)))] for q in (0.25, 0.5, 0.75)]
    held.sort(key=lambda entry: entry["held_back"], reverse=True)
    summary.held_by_one_small_block = held[:top]
    return summary


def _ranked(by_site: dict[str, list[int]], top: int) -> list[dict[str, Any]]:
    ranked = sorted(by_site.items(), key=lambda item: item[1][0], reverse=True)[:top]
    return [{"site": site, "bytes": total, "allocations": count} for site, (total, count) in ranked]


def sites_at_end(segments: list[dict[str, Any]], top: int) -> list[dict[str, Any]]:
    by_site: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for segment in segments:
        for block in segment.get("blocks", []):
            if block.get("state") == "active_allocated":
                size = int(block["size"])
                entry = by_site[site_of(block.get("frames"), size)]
                entry[0] += size
                entry[1] += 1
    return _ranked(by_site, top)


def _live_during(trace: list[dict[str, Any]], stop: int) -> dict[int, dict[str, Any]]:
    """The allocations live just after event `stop`, by address (alloc adds, free_completed
    removes)."""
    live: dict[int, dict[str, Any]] = {}
    for entry in trace[: stop + 1]:
        action = entry.get("action")
        if action == "alloc":
            live[int(entry["addr"])] = entry
        elif action == "free_completed":
            live.pop(int(entry["addr"]), None)
    return live


def _sites_of_live(live: dict[int, dict[str, Any]], top: int) -> list[dict[str, Any]]:
    by_site: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for entry in live.values():
        size = int(entry["size"])
        record = by_site[site_of(entry.get("frames"), size)]
        record[0] += size
        record[1] += 1
    return _ranked(by_site, top)


def peak_of(trace: list[dict[str, Any]], allocated_at_end: int | None, top: int) -> Peak:
    """The trace's live-bytes peak. Bytes live before the trace began are estimated from the
    snapshot's end (allocated at the end minus what the trace added) when segments are known."""
    live = 0
    peak = Peak()
    for index, entry in enumerate(trace):
        action = entry.get("action")
        if action == "alloc":
            live += int(entry["size"])
        elif action == "free_completed":
            live -= int(entry["size"])
        else:
            continue
        if live > peak.live_bytes or peak.event_index < 0:
            peak.live_bytes, peak.event_index = live, index
            peak.time_us = entry.get("time_us")
    if allocated_at_end is not None:
        peak.baseline = max(0, allocated_at_end - live)
    peak.live_bytes += peak.baseline
    if peak.event_index >= 0:
        live_then = _live_during(trace, peak.event_index)
        peak.sites = _with_baseline(_sites_of_live(live_then, top), peak.baseline, top)
    return peak


def _with_baseline(sites: list[dict[str, Any]], baseline: int, top: int) -> list[dict[str, Any]]:
    """Adds the bytes live before the trace began (whose sites the trace cannot name) as a row."""
    if baseline <= 0:
        return sites
    rows = sites + [{"site": "(live before the trace began)", "bytes": baseline, "allocations": 0}]
    return sorted(rows, key=lambda row: row["bytes"], reverse=True)[:top]


def ooms_of(trace: list[dict[str, Any]], baseline: int, top: int) -> list[OomExplanation]:
    found = []
    live = baseline
    for index, entry in enumerate(trace):
        action = entry.get("action")
        if action == "alloc":
            live += int(entry["size"])
        elif action == "free_completed":
            live -= int(entry["size"])
        elif action == "oom":
            found.append(OomExplanation(
                event_index=index, requested=int(entry.get("size", 0)),
                device_free=int(entry.get("addr", 0)), live_bytes=live,
                sites=_with_baseline(_sites_of_live(_live_during(trace, index), top), baseline, top)))
    return found


def inspect_device(snapshot: dict[str, Any], device: int, top: int) -> dict[str, Any]:
    segments = [s for s in snapshot.get("segments", []) if int(s.get("device", 0)) == device]
    traces = snapshot.get("device_traces", [])
    trace = traces[device] if device < len(traces) else []
    totals = totals_of(segments)
    # Without segments the snapshot tells nothing about the end state; the trace's own balance
    # is then taken as the whole story.
    peak = peak_of(trace, totals.allocated if segments else None, top)
    ooms = ooms_of(trace, peak.baseline, top)
    if ooms:
        events = device_events(trace)
        if len(events) > 0:
            replayed = events.replay(1 << 40, "", measure_latency=False)
            native = native_figures(snapshot, device)
            for oom in ooms:
                oom.stowage_peak_reserved = int(replayed["peak_reserved"])
                oom.stowage_peak_requested = int(replayed["peak_requested"])
                if native.comparable(int(replayed["peak_requested"])):
                    oom.native_peak_reserved = native.peak_reserved
    return {
        "device": device,
        "totals": asdict(totals),
        "segments": asdict(segments_of(segments, top)),
        "sites_at_end": sites_at_end(segments, top),
        "trace_events": len(trace),
        "peak": asdict(peak),
        "ooms": [asdict(oom) for oom in ooms],
    }


def devices_with_data(snapshot: dict[str, Any]) -> list[int]:
    devices = {int(s.get("device", 0)) for s in snapshot.get("segments", [])}
    devices |= {i for i, trace in enumerate(snapshot.get("device_traces", [])) if trace}
    return sorted(devices)


# --- output ---


def _b(value: int) -> str:
    return _core.format_bytes(int(value))


def _sites_table(title: str, sites: list[dict[str, Any]], total: int) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("live", justify="right")
    table.add_column("share", justify="right")
    table.add_column("allocs", justify="right")
    table.add_column("site")
    for site in sites:
        share = f"{100 * site['bytes'] / total:.1f}%" if total else "-"
        table.add_row(_b(site["bytes"]), share, f"{site['allocations']:,}", site["site"])
    return table


def print_report(path: Path, report: dict[str, Any], console: Console) -> None:
    totals = report["totals"]
    console.print(f"[bold]{path.name}[/bold], device {report['device']}: {report['trace_events']:,} trace events, "
                  f"{totals['segments']:,} segments")
    table = Table(title="totals", title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("bytes", justify="right")
    for label, key in (("allocated", "allocated"), ("active (allocated + waiting for streams)", "active"),
                       ("requested by callers", "requested"), ("reserved", "reserved"),
                       ("reserved but unallocated", "reserved_unallocated"),
                       ("largest free block", "largest_free_block")):
        table.add_row(label, _b(totals[key]))
    table.add_row("fragmentation: 1 - largest free block / free reserved bytes",
                  f"{100 * totals['fragmentation']:.1f}%")
    console.print(table)

    segments = report["segments"]
    if segments["count"]:
        sizes = Table(title="segments", title_justify="left")
        sizes.add_column("size")
        sizes.add_column("count", justify="right")
        sizes.add_column("bytes", justify="right")
        for row in segments["by_size"]:
            sizes.add_row(row["size"], f"{row['count']:,}", _b(row["bytes"]))
        console.print(sizes)
        q = segments["fill_quartiles"]
        console.print(f"fill (live / segment): quartiles {100 * q[0]:.0f}% / {100 * q[1]:.0f}% / {100 * q[2]:.0f}%")
        held = segments["held_by_one_small_block"]
        if held:
            kept = Table(title="segments held by one small live block", title_justify="left")
            kept.add_column("segment", justify="right")
            kept.add_column("live", justify="right")
            kept.add_column("held back", justify="right")
            kept.add_column("site")
            for row in held:
                kept.add_row(_b(row["segment_bytes"]), _b(row["live_bytes"]), _b(row["held_back"]), row["site"])
            console.print(kept)
    if report["sites_at_end"]:
        console.print(_sites_table("live at the end, by site", report["sites_at_end"], totals["allocated"]))

    peak = report["peak"]
    if peak["event_index"] >= 0:
        when = f"time_us {peak['time_us']:,}" if peak["time_us"] is not None else f"event {peak['event_index']:,}"
        baseline = f" (of which {_b(peak['baseline'])} live before the trace began)" if peak["baseline"] else ""
        console.print(f"peak: {_b(peak['live_bytes'])} live at {when}{baseline}")
        console.print(_sites_table("live at the peak, by site", peak["sites"], peak["live_bytes"]))
    for oom in report["ooms"]:
        console.print(f"[bold red]out of memory[/bold red] at event {oom['event_index']:,}: asked for "
                      f"{_b(oom['requested'])}; the device had {_b(oom['device_free'])} free; "
                      f"{_b(oom['live_bytes'])} were live.")
        if totals["segments"]:
            console.print(f"at the snapshot, stowage's or torch's cache held {_b(totals['reserved_unallocated'])} "
                          f"reserved but unallocated, the largest free block {_b(totals['largest_free_block'])} "
                          f"(a snapshot dumped at the OOM shows the cache as the request found it)")
        console.print(_sites_table("live at the OOM, by site", oom["sites"], oom["live_bytes"]))
        console.print("what would have helped:")
        short = oom["requested"] - oom["device_free"]
        if short > 0 and oom["sites"]:
            largest = oom["sites"][0]
            verdict = "would make room" if largest["bytes"] >= short else "would not be enough alone"
            console.print(f"  - the request needed {_b(short)} more than the device had free; offloading or "
                          f"recomputing the largest site ({_b(largest['bytes'])}, {largest['site']}) {verdict}")
        if oom["stowage_peak_reserved"] is not None:
            console.print(f"  - replayed through stowage, this trace reserves at most "
                          f"{_b(oom['stowage_peak_reserved'])} for a live peak of "
                          f"{_b(oom['stowage_peak_requested'])} (stowage replay --min-capacity "
                          f"{report.get('path', 'SNAPSHOT')} finds the smallest device)")
        if oom["native_peak_reserved"] is not None:
            console.print(f"  - the allocator that recorded it had reserved up to {_b(oom['native_peak_reserved'])}")


def run(args: argparse.Namespace) -> int:
    err = Console(stderr=True, soft_wrap=True)
    path = Path(args.snapshot)
    if args.top < 1:
        err.print("stowage inspect: --top must be at least 1")
        return 2
    try:
        snapshot = load_with_progress(path, err)
    except SnapshotError as error:
        err.print(f"stowage inspect: {error}")
        return 2
    devices = devices_with_data(snapshot)
    if args.device is not None:
        if args.device not in devices:
            err.print(f"stowage inspect: {path}: device {args.device} has no data "
                      f"(devices with data: {', '.join(map(str, devices)) or 'none'})")
            return 2
        devices = [args.device]
    if not devices:
        err.print(f"stowage inspect: {path}: the snapshot holds no segments and no trace events")
        return 2
    try:
        report = inspect_device(snapshot, devices[0], args.top)
    except (KeyError, TypeError, ValueError) as error:
        err.print(f"stowage inspect: {path}: malformed snapshot ({type(error).__name__}: {error})")
        return 2
    report["path"] = str(path)
    if args.html:
        from stowage.html_report import render

        try:
            Path(args.html).write_text(render(path.name, report, snapshot), encoding="utf-8")
        except OSError as error:
            err.print(f"stowage inspect: cannot write {args.html}: {error}")
            return 2
        err.print(f"stowage inspect: wrote {args.html} ({_b(Path(args.html).stat().st_size)})")
    if args.json:
        print(json.dumps(report))
    else:
        out = Console()
        print_report(path, report, out if out.is_terminal else Console(width=160))
    return 0


def load_with_progress(path: Path, console: Console) -> dict[str, Any]:
    """load_snapshot, with a progress bar per phase (checking the pickle, loading it) on a
    terminal."""
    with Progress(console=console, transient=True, disable=not console.is_terminal) as progress:
        tasks: dict[str, Any] = {}

        def report(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = progress.add_task(f"{phase} {path.name}", total=max(total, 1))
            progress.update(tasks[phase], completed=done)

        return load_snapshot(path, report)
