"""``stowage inspect``'s findings as the terminal shows them (rich tables), read from the report
of stowage.inspection.findings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from stowage import _core
from stowage.offload import summary_lines
from stowage.terminal import literal


# The tables the terminal and the HTML report share: their rows, and byte counts, are _core's
# (snapshot/findings_rows.hpp).
bytes_text = _core.bytes_text
LEFT_COLUMNS = {"what", "site", "category", "module", "size"}
SITES = ["live", "share", "allocs", "site"]
HELD = ["segment", "live", "held back", "site"]
STEPS = ["step", "events", "peak", "at its end"]


def rows_table(title: str, header: list[str], rows: list[list[str]], show_header: bool = True,
               left: set[str] = LEFT_COLUMNS) -> Table:
    """A table of `rows` under `header`, the columns named in `left` justified left, the others right;
    every cell shown literally."""
    table = Table(title=title, title_justify="left", show_header=show_header)
    for name in header:
        table.add_column(name, justify="left" if name in left else "right")
    for row in rows:
        table.add_row(*map(literal, row))
    return table


def _print_oom(oom: dict[str, Any], finding: _core.OomFinding, report: dict[str, Any], console: Console) -> None:
    if oom.get("in_fit_trial"):
        console.print(f"out of memory at event {oom['event_index']:,} in stowage.fit's own trial step (fit tried a "
                      f"size that did not fit, and went on): asked for {bytes_text(oom['requested'])}, not the run's")
        return
    console.print(Text.assemble(("out of memory", "bold red"),
                                f" at event {oom['event_index']:,}: asked for {bytes_text(oom['requested'])}; the device had "
                                f"{bytes_text(oom['device_free'])} free; {bytes_text(oom['live_bytes'])} were live."))
    totals = report["totals"]
    if totals["segments"]:
        console.print(f"at the snapshot, stowage's or torch's cache held {bytes_text(totals['reserved_unallocated'])} "
                      f"reserved but unallocated, the largest free block {bytes_text(totals['largest_free_block'])} "
                      f"(a snapshot dumped at the OOM shows the cache as the request found it)")
    console.print(rows_table("live at the OOM, by site", SITES, _core.site_rows(finding.sites, oom["live_bytes"])))
    console.print("what would have helped:")
    short = oom["requested"] - oom["device_free"]
    if short > 0 and oom["sites"]:
        largest = oom["sites"][0]
        verdict = "would make room" if largest["bytes"] >= short else "would not be enough alone"
        console.print(f"  - the request needed {bytes_text(short)} more than the device had free; offloading or "
                      f"recomputing the largest site ({bytes_text(largest['bytes'])}, {literal(largest['site'])}) {verdict}")
    if oom["stowage_peak_reserved"] is not None:
        console.print(f"  - replayed through stowage, this trace reserves at most "
                      f"{bytes_text(oom['stowage_peak_reserved'])} for a live peak of "
                      f"{bytes_text(oom['stowage_peak_requested'])} (stowage replay --min-capacity "
                      f"{literal(report.get('path', 'SNAPSHOT'))} finds the smallest device)")
    if oom["native_peak_reserved"] is not None:
        console.print(f"  - the allocator that recorded it had reserved up to {bytes_text(oom['native_peak_reserved'])}")


SHOWN_STEPS = 12  # steps listed one by one; more are summarised


def _print_steps(report: dict[str, Any], found: _core.Findings, console: Console) -> None:
    """The steps' peaks (fit's own trial steps apart), and the sites that grew step over step."""
    trial = report.get("fit_trial_peak")
    if trial is not None:
        console.print(f"stowage.fit's own trial steps (left out of the peak above): peak {bytes_text(trial['live_bytes'])} "
                      f"at event {trial['event_index']:,}")
    run = [step for step in found.steps if not step.fit_trial]
    if not run:
        return
    shown = run if len(run) <= SHOWN_STEPS else run[:SHOWN_STEPS // 2] + run[-SHOWN_STEPS // 2:]
    console.print(rows_table(f"steps ({len(run)}, found by {report['steps_found_by']})", STEPS, _core.step_rows(shown)))
    if len(run) > SHOWN_STEPS:
        peaks = sorted(step.peak_bytes for step in run)
        console.print(f"({len(run) - len(shown)} steps not shown; peaks from {bytes_text(peaks[0])} to {bytes_text(peaks[-1])}, "
                      f"median {bytes_text(peaks[len(peaks) // 2])})")
    for row in report.get("growing") or []:
        console.print(f"grows every step: {literal(row['site'])} holds {bytes_text(row['bytes_per_step'])} more after each "
                      f"of the last {row['steps']} steps (memory kept across steps: a leak, or a cache)")


def _print_advice(report: dict[str, Any], console: Console) -> None:
    for row in report.get("advice") or []:
        saves = "saves up to" if row.get("upper_bound") else "saves"
        console.print(Text.assemble(("advice", "bold"), f": {saves} {bytes_text(row['saving_bytes'])} of the peak "
                                    f"(re-simulated): {literal(row['advice'])}"))


def print_report(path: Path, report: dict[str, Any], found: _core.Findings, console: Console) -> None:
    totals = report["totals"]
    console.print(Text.assemble((literal(path.name), "bold"), f", device {report['device']}: "
                                f"{report['trace_events']:,} trace events, {totals['segments']:,} segments"))
    rows = [[label, bytes_text(totals[key])] for label, key in (
        ("allocated", "allocated"), ("active (allocated + waiting for streams)", "active"),
        ("requested by callers", "requested"), ("reserved", "reserved"),
        ("reserved but unallocated", "reserved_unallocated"), ("largest free block", "largest_free_block"))]
    rows.append(["fragmentation: 1 - largest free block / free reserved bytes", f"{100 * totals['fragmentation']:.1f}%"])
    console.print(rows_table("totals", ["what", "bytes"], rows, show_header=False))
    _print_advice(report, console)

    segments = report["segments"]
    if segments["count"]:
        console.print(rows_table("segments", ["size", "count", "bytes"], [
            [row["size"], f"{row['count']:,}", bytes_text(row["bytes"])] for row in segments["by_size"]]))
        q = segments["fill_quartiles"]
        console.print(f"fill (live / segment): quartiles {100 * q[0]:.0f}% / {100 * q[1]:.0f}% / {100 * q[2]:.0f}%")
        if segments["held_by_one_small_block"]:
            console.print(rows_table("segments held by one small live block", HELD,
                                     _core.held_rows(found.segments.held_by_one_small_block)))
    if report["sites_at_end"]:
        console.print(rows_table("live at the end, by site", SITES,
                                 _core.site_rows(found.sites_at_end, totals["allocated"])))

    peak = report["peak"]
    if report["trace_events"]:
        if peak["event_index"] < 0:
            when = "the start of the trace"
        else:
            when = f"event {peak['event_index']:,}"
            start = report.get("trace_start_us")
            if peak["time_us"] is not None and start is not None:
                when += f" ({(peak['time_us'] - start) / 1000:,.1f} ms into the trace)"
        baseline = f"; {bytes_text(peak['baseline'])} were live before the trace began" if peak["baseline"] else ""
        console.print(f"peak: {bytes_text(peak['live_bytes'])} live at {when}{baseline}")
        if peak.get("categories"):
            console.print(rows_table(f"live at the peak, by what it is ({report.get('category_source', 'inferred')})",
                                 ["live", "share", "category"], _core.category_rows(found.peak, before_trace=True)))
        if peak.get("modules"):
            console.print(rows_table("live at the peak, by the module that made it", ["live", "share", "module"],
                                 _core.module_rows(found.peak)))
        console.print(rows_table("live at the peak, by site", SITES,
                                 _core.site_rows(found.peak.sites, peak["live_bytes"])))
    _print_steps(report, found, console)
    for oom, finding in zip(report["ooms"], found.ooms):
        _print_oom(oom, finding, report, console)
    if report["oom_events"] > len(report["ooms"]):
        console.print(f"({report['oom_events'] - len(report['ooms']):,} more OOM events not shown)")
    if report.get("offload"):
        for line in summary_lines(report["offload"]):
            console.print(f"offload: {literal(line)}")

