"""``stowage inspect``: what held the memory, from a PyTorch memory snapshot.

Reads a snapshot written by ``torch.cuda.memory._dump_snapshot`` or by stowage (through the safe
loader, which runs no code) and explains one device's memory in the terminal, or as JSON:

- totals: allocated, active, reserved, reserved but unallocated, the largest free block, and
  fragmentation = 1 - largest free block / free reserved bytes (reserved minus active; 0 when
  nothing is free): the share of free cached memory that a single request could not use;
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
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from stowage import _core, advice, categories, tag_reading, trace_steps
from stowage.recorded_by import recorded_by_stowage
from stowage.snapshot_reader import ACTION_CODES, SnapshotError, TraceColumns, load_snapshot_columnar
from stowage.trace import as_columns, device_events, native_figures
from stowage.trace_pairs import LivePairs, TraceSites, live_pairs, site_of
from stowage.terminal import console, literal

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
    categories: dict[str, int] = field(default_factory=dict)  # the trace's own live bytes (stowage.categories)
    modules: list[dict[str, Any]] = field(default_factory=list)  # by module path, where the snapshot has them


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
    in_fit_trial: bool = False  # in one of stowage.fit's own trial steps, not the run's
    under_stowage: bool = False  # stowage's allocator recorded the snapshot (stowage.recorded_by)


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
        # An expandable segment's free pages can be unmapped: one small block holds nothing back.
        if len(live) == 1 and live_bytes < _SMALL_SEGMENT * total and not segment.get("is_expandable"):
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
                # Classified by the size asked for, as the trace's events are.
                entry = by_site[site_of(block.get("frames"), int(block.get("requested_size", size)))]
                entry[0] += size
                entry[1] += 1
    return _ranked(by_site, top)


_OOM = ACTION_CODES["oom"]
_BEFORE = "(live before the trace began)"
_MAX_OOMS = 50  # OOM events explained; a trace with more says how many it left out


def _ranked_sites(by_site: dict[str, int], counts: dict[str, int], pre_trace: int,
                  top: int) -> list[dict[str, Any]]:
    rows = [{"site": site, "bytes": total, "allocations": counts[site]}
            for site, total in by_site.items() if total > 0]
    if pre_trace > 0:
        rows.append({"site": _BEFORE, "bytes": pre_trace, "allocations": 0})
    return sorted(rows, key=lambda row: row["bytes"], reverse=True)[:top]


def _live_at(pairs: LivePairs, sites: TraceSites, position: int) -> tuple[dict[str, int], dict[str, int]]:
    """Live bytes and allocations by site just after `position` (-1: before any event), in the
    order the sites first allocated."""
    if position < 0:
        return {}, {}
    totals, counts = _core.live_at(pairs.is_alloc, pairs.end, pairs.size, sites.of, len(sites.names), position)
    present = np.flatnonzero(counts)
    present = present[np.argsort(sites.first[present], kind="stable")]
    return ({sites.names[i]: totals[i] for i in present.tolist()},
            {sites.names[i]: int(counts[i]) for i in present.tolist()})


ReadTags = Callable[[np.ndarray, np.ndarray], "tag_reading.ExactTags | None"]  # (actions, LivePairs.index)
INFERRED = "inferred from stacks and lifetimes"
EXACT = "exact, noted by stowage while recording"


@dataclass
class TraceAnalysis:
    """A trace's findings: its headline peak (fit's own trial steps left out), its OOMs, its steps
    and what grew over them (stowage.trace_steps), and the peak of fit's trials, apart."""

    peak: Peak
    ooms: list[OomExplanation]
    oom_events: int
    steps: list[Any] = field(default_factory=list)
    steps_found_by: str = ""
    growing: list[dict[str, Any]] = field(default_factory=list)
    fit_trial_peak: Peak | None = None
    advice: list[dict[str, Any]] = field(default_factory=list)
    category_source: str = INFERRED


def analyse_trace(trace: TraceColumns | Sequence[dict[str, Any]], requested_at_end: int | None,
                  top: int) -> tuple[Peak, list[OomExplanation], int]:
    """The live-bytes peak and the OOM events of a trace (`analyse`)."""
    found = analyse(trace, requested_at_end, top)
    return found.peak, found.ooms, found.oom_events


def analyse(trace: TraceColumns | Sequence[dict[str, Any]], requested_at_end: int | None,
            top: int, cached_free: int = 0, read_tags: ReadTags | None = None,
            under_stowage: bool = False) -> TraceAnalysis:
    """The live-bytes peak, the OOM events and the steps of a trace.

    Live bytes at an event = the trace's own allocations still live (each counted at the size it
    was allocated with) + what was live before the trace began and is not yet freed. The latter
    starts at a baseline and drops with every free of an address the trace never allocated (a
    ring buffer that dropped its oldest events). The baseline comes from the snapshot's end
    (requested bytes of the live blocks, minus the trace's own still live, plus those unknown
    frees) when segments are known, else it is the unknown frees alone: never negative, and
    never less than what was freed of it. The headline peak leaves out stowage.fit's own trial
    steps (their peak is reported apart). Returns the peak, the OOMs (at most _MAX_OOMS), the
    number of OOM events in all, the steps and the advice (stowage.advice; `cached_free`: the
    cache's free bytes at the snapshot, for an OOM's; `under_stowage`: stowage's allocator recorded
    it, so no advice names that allocator). Categories are the snapshot's own where
    `read_tags` finds stowage's (tag_reading), else inferred. (LivePairs says how frees are matched.)
    """
    columns = as_columns(trace)
    pairs = live_pairs(columns)
    live = np.cumsum(pairs.own - pairs.unknown)  # the trace's own live less what was freed of before it
    trial = trace_steps.in_trial(columns, pairs.index)
    own, unknown = int(pairs.own.sum()), int(pairs.unknown.sum())
    baseline = unknown if requested_at_end is None else requested_at_end - own + unknown
    baseline = max(baseline, unknown, 0)
    live += baseline  # (in place) and what is left of what was live before the trace
    sites = TraceSites(columns, pairs)

    def ranked_at(position: int) -> tuple[list[dict[str, Any]], int, int]:
        by_site, counts = _live_at(pairs, sites, position)
        pre_trace = baseline - int(pairs.unknown[:position + 1].sum())  # less the unknown frees so far
        return _ranked_sites(by_site, counts, pre_trace, top), pre_trace, sum(by_site.values())

    def peak_over(where: np.ndarray) -> Peak:
        best, best_at = 0, -1  # own - unknown at its highest, first reached; -1: before any event
        chosen = np.flatnonzero(where)
        if len(chosen):
            at = int(chosen[np.argmax(live[chosen])])
            if live[at] - baseline > 0:
                best, best_at = int(live[at] - baseline), at
        best_index = int(pairs.index[best_at]) if best_at >= 0 else -1
        peak = Peak(live_bytes=baseline + best, event_index=best_index, baseline=baseline)
        if best_index >= 0:
            peak.time_us = columns.time_at(best_index)
        peak.sites = ranked_at(best_at)[0]
        return peak

    found = TraceAnalysis(peak_over(~trial), [], 0)
    found.steps, found.steps_found_by = trace_steps.cut(columns, pairs.index, live, pairs.is_alloc, pairs.size)
    step_starts = np.searchsorted(pairs.index, np.array([s.first_event for s in found.steps], dtype=np.int64))
    at = int(np.searchsorted(pairs.index, found.peak.event_index)) if found.peak.event_index >= 0 else -1
    exact = read_tags(columns.action, pairs.index) if read_tags is not None else None
    flags, marked = categories.both_flags(columns, pairs.index, pairs.is_alloc)
    if exact is not None:
        live_at = categories.live_positions(pairs.is_alloc, pairs.end, at)
        category, found.category_source = exact.category[live_at], EXACT
        found.peak.modules = tag_reading.module_totals(exact, live_at, pairs.size, top)
    else:
        live_at, category = categories.live_categories(columns, pairs.index, pairs.is_alloc, pairs.end,
                                                       step_starts, at, marked)
    found.peak.categories = categories.totals(live_at, category, pairs.size)
    if trial.any():
        found.fit_trial_peak = peak_over(trial)
    oom_at = np.flatnonzero(columns.action == _OOM)
    oom_in_trial = trace_steps.in_trial(columns, oom_at[:_MAX_OOMS])
    for index, in_fit_trial in zip(oom_at[:_MAX_OOMS].tolist(), oom_in_trial.tolist()):
        ranked, pre_trace, own_live = ranked_at(int(np.searchsorted(pairs.index, index)) - 1)
        found.ooms.append(OomExplanation(
            event_index=index, requested=int(columns.size[index]),
            device_free=columns.device_free.get(index, int(columns.addr[index])),
            live_bytes=pre_trace + own_live, sites=ranked,
            in_fit_trial=bool(in_fit_trial), under_stowage=under_stowage))
    found.oom_events = len(oom_at)

    found.growing = trace_steps.growing(found.steps, pairs, sites, found.steps_found_by)[:top]
    found.advice = advice.advise(columns, pairs, sites, (flags, marked), live, asdict(found.peak), at,
                                 (live_at, category), step_starts, exact, found.growing,
                                 [dict(asdict(o), cached_free=cached_free) for o in found.ooms if not o.in_fit_trial])
    return found


def inspect_device(snapshot: dict[str, Any], device: int, top: int) -> dict[str, Any]:
    segments = [s for s in snapshot.get("segments", []) if int(s.get("device", 0)) == device]
    traces = snapshot.get("device_traces", [])
    trace = as_columns(traces[device] if device < len(traces) else [])
    totals = totals_of(segments)
    # Without segments the snapshot tells nothing about the end state; the trace's own balance
    # is then taken as the whole story.
    found = analyse(trace, totals.requested if segments else None, top, totals.reserved_unallocated,
                    lambda action, index: tag_reading.read(snapshot, device, action, index),
                    recorded_by_stowage(snapshot))
    peak, ooms, oom_events = found.peak, found.ooms, found.oom_events
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
    first_time = trace.first_time()
    return {
        "device": device,
        "totals": asdict(totals),
        "segments": asdict(segments_of(segments, top)),
        "sites_at_end": sites_at_end(segments, top),
        "trace_events": len(trace),
        "trace_start_us": first_time,
        "peak": asdict(peak),
        "ooms": [asdict(oom) for oom in ooms],
        "oom_events": oom_events,
        "steps": trace_steps.as_dicts(found.steps),
        "steps_found_by": found.steps_found_by,
        "growing": found.growing,
        "fit_trial_peak": asdict(found.fit_trial_peak) if found.fit_trial_peak is not None else None,
        "category_source": found.category_source,
        "advice": found.advice,
        # stowage's snapshots of a device with activation offload carry its statistics.
        "offload": {k: int(v) for k, v in snapshot.get("offload", {}).items()} or None,
    }


def devices_with_data(snapshot: dict[str, Any]) -> list[int]:
    devices = {int(s.get("device", 0)) for s in snapshot.get("segments", [])}
    devices |= {i for i, trace in enumerate(snapshot.get("device_traces", [])) if trace}
    return sorted(devices)


# --- output ---


def _b(value: int) -> str:
    value = int(value)
    return _core.format_bytes(value) if value >= 0 else "-" + _core.format_bytes(-value)


def _sites_table(title: str, sites: list[dict[str, Any]], total: int) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("live", justify="right")
    table.add_column("share", justify="right")
    table.add_column("allocs", justify="right")
    table.add_column("site")
    for site in sites:
        share = f"{100 * site['bytes'] / total:.1f}%" if total else "-"
        table.add_row(_b(site["bytes"]), share, f"{site['allocations']:,}", literal(site["site"]))
    return table


def _print_oom(oom: dict[str, Any], totals: dict[str, Any], report: dict[str, Any], console: Console) -> None:
    if oom.get("in_fit_trial"):
        console.print(f"out of memory at event {oom['event_index']:,} in stowage.fit's own trial step (fit tried a "
                      f"size that did not fit, and went on): asked for {_b(oom['requested'])}, not the run's")
        return
    console.print(Text.assemble(("out of memory", "bold red"),
                                f" at event {oom['event_index']:,}: asked for {_b(oom['requested'])}; the device had "
                                f"{_b(oom['device_free'])} free; {_b(oom['live_bytes'])} were live."))
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
                      f"recomputing the largest site ({_b(largest['bytes'])}, {literal(largest['site'])}) {verdict}")
    if oom["stowage_peak_reserved"] is not None:
        console.print(f"  - replayed through stowage, this trace reserves at most "
                      f"{_b(oom['stowage_peak_reserved'])} for a live peak of "
                      f"{_b(oom['stowage_peak_requested'])} (stowage replay --min-capacity "
                      f"{literal(report.get('path', 'SNAPSHOT'))} finds the smallest device)")
    if oom["native_peak_reserved"] is not None:
        console.print(f"  - the allocator that recorded it had reserved up to {_b(oom['native_peak_reserved'])}")


def _categories_table(peak: dict[str, Any], source: str) -> Table:
    table = Table(title=f"live at the peak, by what it is ({source})", title_justify="left")
    table.add_column("live", justify="right")
    table.add_column("share", justify="right")
    table.add_column("category")
    rows = sorted(peak["categories"].items(), key=lambda item: item[1], reverse=True)
    before = peak["live_bytes"] - sum(peak["categories"].values())
    if before > 0:
        rows.append(("(live before the trace began)", before))
    for name, value in rows:
        table.add_row(_b(value), f"{100 * value / max(peak['live_bytes'], 1):.1f}%", name)
    return table


def _modules_table(peak: dict[str, Any]) -> Table:
    table = Table(title="live at the peak, by the module that made it", title_justify="left")
    table.add_column("live", justify="right")
    table.add_column("share", justify="right")
    table.add_column("module")
    for row in peak["modules"]:
        table.add_row(_b(row["bytes"]), f"{100 * row['bytes'] / max(peak['live_bytes'], 1):.1f}%",
                      literal(row["module"] or "(outside any module's forward)"))
    return table


SHOWN_STEPS = 12  # steps listed one by one; more are summarised


def _print_steps(report: dict[str, Any], console: Console) -> None:
    """The steps' peaks (fit's own trial steps apart), and the sites that grew step over step."""
    steps = report.get("steps") or []
    trial = report.get("fit_trial_peak")
    if trial is not None:
        console.print(f"stowage.fit's own trial steps (left out of the peak above): peak {_b(trial['live_bytes'])} "
                      f"at event {trial['event_index']:,}")
    run = [step for step in steps if not step["fit_trial"]]
    if not run:
        return
    table = Table(title=f"steps ({len(run)}, found by {report['steps_found_by']})", title_justify="left")
    for name in ("step", "events", "peak", "at its end"):
        table.add_column(name, justify="right")
    shown = run if len(run) <= SHOWN_STEPS else run[:SHOWN_STEPS // 2] + run[-SHOWN_STEPS // 2:]
    for step in shown:
        table.add_row(str(step["number"]), f"{step['first_event']:,}-{step['last_event']:,}", _b(step["peak_bytes"]),
                      _b(step["end_bytes"]))
    console.print(table)
    if len(run) > SHOWN_STEPS:
        peaks = sorted(step["peak_bytes"] for step in run)
        console.print(f"({len(run) - len(shown)} steps not shown; peaks from {_b(peaks[0])} to {_b(peaks[-1])}, "
                      f"median {_b(peaks[len(peaks) // 2])})")
    for row in report.get("growing") or []:
        console.print(f"grows every step: {literal(row['site'])} holds {_b(row['bytes_per_step'])} more after each "
                      f"of the last {row['steps']} steps (memory kept across steps: a leak, or a cache)")


def _print_advice(report: dict[str, Any], console: Console) -> None:
    for row in report.get("advice") or []:
        saves = "saves up to" if row.get("upper_bound") else "saves"
        console.print(Text.assemble(("advice", "bold"), f": {saves} {_b(row['saving_bytes'])} of the peak "
                                    f"(re-simulated): {literal(row['advice'])}"))


def print_report(path: Path, report: dict[str, Any], console: Console) -> None:
    totals = report["totals"]
    console.print(Text.assemble((literal(path.name), "bold"), f", device {report['device']}: "
                                f"{report['trace_events']:,} trace events, {totals['segments']:,} segments"))
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
    _print_advice(report, console)

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
                kept.add_row(_b(row["segment_bytes"]), _b(row["live_bytes"]), _b(row["held_back"]), literal(row["site"]))
            console.print(kept)
    if report["sites_at_end"]:
        console.print(_sites_table("live at the end, by site", report["sites_at_end"], totals["allocated"]))

    peak = report["peak"]
    if report["trace_events"]:
        if peak["event_index"] < 0:
            when = "the start of the trace"
        else:
            when = f"event {peak['event_index']:,}"
            start = report.get("trace_start_us")
            if peak["time_us"] is not None and start is not None:
                when += f" ({(peak['time_us'] - start) / 1000:,.1f} ms into the trace)"
        baseline = f"; {_b(peak['baseline'])} were live before the trace began" if peak["baseline"] else ""
        console.print(f"peak: {_b(peak['live_bytes'])} live at {when}{baseline}")
        if peak.get("categories"):
            console.print(_categories_table(peak, report.get("category_source", "inferred")))
        if peak.get("modules"):
            console.print(_modules_table(peak))
        console.print(_sites_table("live at the peak, by site", peak["sites"], peak["live_bytes"]))
    _print_steps(report, console)
    for oom in report["ooms"]:
        _print_oom(oom, totals, report, console)
    if report["oom_events"] > len(report["ooms"]):
        console.print(f"({report['oom_events'] - len(report['ooms']):,} more OOM events not shown)")
    if report.get("offload"):
        from stowage.offload import summary_lines

        for line in summary_lines(report["offload"]):
            console.print(f"offload: {literal(line)}")


def run(args: argparse.Namespace) -> int:
    err = console(stderr=True, soft_wrap=True)
    path = Path(args.snapshot)
    if args.top < 1:
        err.print("stowage inspect: --top must be at least 1")
        return 2
    try:
        snapshot = load_with_progress(path, err, getattr(args, "command_line", None))
    except SnapshotError as error:
        err.print(f"stowage inspect: {literal(str(error))}")
        return 2
    devices = devices_with_data(snapshot)
    if args.device is not None:
        if args.device not in devices:
            err.print(f"stowage inspect: {literal(str(path))}: device {args.device} has no data "
                      f"(devices with data: {', '.join(map(str, devices)) or 'none'})")
            return 2
        devices = [args.device]
    if not devices:
        err.print(f"stowage inspect: {literal(str(path))}: the snapshot holds no segments and no trace events")
        return 2
    try:
        report = inspect_device(snapshot, devices[0], args.top)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as error:
        err.print(f"stowage inspect: {literal(str(path))}: malformed snapshot ({type(error).__name__}: "
                  f"{literal(str(error))})")
        return 2
    report["path"] = str(path)
    if args.html:
        from stowage.html_report import render, write as write_html

        try:
            page = render(path.name, report, snapshot)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as error:
            err.print(f"stowage inspect: {literal(str(path))}: cannot draw the report ({type(error).__name__}: "
                      f"{literal(str(error))})")
            return 2
        try:
            write_html(page, args.html)
        except (OSError, UnicodeError) as error:
            err.print(f"stowage inspect: cannot write {literal(args.html)}: {literal(str(error))}")
            return 2
        err.print(f"stowage inspect: wrote {literal(args.html)} ({_b(Path(args.html).stat().st_size)})")
    if args.json:
        print(json.dumps(report))
    else:
        out = console()
        print_report(path, report, out if out.is_terminal else console(width=160))
    return 0


def load_with_progress(path: Path, console: Console, command: str | None = None) -> dict[str, Any]:
    """load_snapshot_columnar, with a progress bar per phase on a terminal (`command`: the command
    line reading it, for a refusal's message)."""
    with Progress(console=console, transient=True, disable=not console.is_terminal) as progress:
        tasks: dict[str, Any] = {}

        def report(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = progress.add_task(f"{phase} {literal(path.name)}", total=max(total, 1))
            progress.update(tasks[phase], completed=done)

        return load_snapshot_columnar(path, report if console.is_terminal else None, command)
