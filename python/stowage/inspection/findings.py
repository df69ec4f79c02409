"""One device's findings (``stowage._core.inspect``: snapshot/inspection.hpp computes every figure
in one call) and their JSON form, the report the text and HTML formatters read.

Beside the findings, the report carries what the snapshot holds as it is: the trace's times, the
replay of a trace that ran out of memory (stowage.replay's allocator, for the OOM's "what would
have helped") and stowage's offload statistics.
"""

from __future__ import annotations

from typing import Any

from stowage import _core
from stowage.recorded_by import recorded_by_stowage
from stowage.replay import device_events, native_figures
from stowage.snapshot_reader import SnapshotError, TraceColumns, as_columns
from stowage.tagging import TAGS_KEY

EXACT = "exact, noted by stowage while recording"
INFERRED = "inferred from stacks and lifetimes"


def device_segments(snapshot: dict[str, Any], device: int) -> list[dict[str, Any]]:
    return [s for s in snapshot.get("segments", []) if int(s.get("device", 0)) == device]


def device_trace(snapshot: dict[str, Any], device: int) -> TraceColumns:
    traces = snapshot.get("device_traces", [])
    return as_columns(traces[device] if device < len(traces) else [])


def devices_with_data(snapshot: dict[str, Any]) -> list[int]:
    devices = {int(s.get("device", 0)) for s in snapshot.get("segments", [])}
    devices |= {i for i, trace in enumerate(snapshot.get("device_traces", [])) if trace}
    return sorted(devices)


def inspect(snapshot: dict[str, Any], device: int, top: int, timelines: bool = False,
            moments: list[int] | None = None) -> tuple[_core.Findings, TraceColumns]:
    """The device's findings (with the HTML report's timelines, and what was live just after each
    event of `moments`, where asked), and its trace's columns."""
    trace = device_trace(snapshot, device)
    try:
        found = _core.inspect(trace, device_segments(snapshot, device), top, recorded_by_stowage(snapshot),
                              snapshot.get(TAGS_KEY), device, timelines, moments or [])
    except _core.SnapshotRefused as error:  # stowage's tags, a field that does not fit
        raise SnapshotError(str(error)) from None
    return found, trace


def _sites(rows: list[Any]) -> list[dict[str, Any]]:
    return [{"site": row.site, "bytes": row.bytes, "allocations": row.allocations} for row in rows]


def peak_dict(peak: _core.Peak, trace: TraceColumns) -> dict[str, Any]:
    return {"live_bytes": peak.live_bytes, "event_index": peak.event_index,
            "time_us": trace.time_at(peak.event_index) if peak.event_index >= 0 else None,
            "baseline": peak.baseline, "sites": _sites(peak.sites), "categories": dict(peak.categories),
            "modules": [{"module": row.module, "bytes": row.bytes} for row in peak.modules]}


def oom_dict(oom: _core.OomFinding) -> dict[str, Any]:
    return {"event_index": oom.event_index, "requested": oom.requested, "device_free": oom.device_free,
            "live_bytes": oom.live_bytes, "sites": _sites(oom.sites), "stowage_peak_reserved": None,
            "stowage_peak_requested": None, "native_peak_reserved": None, "in_fit_trial": oom.in_fit_trial,
            "under_stowage": oom.under_stowage}


def _replayed(snapshot: dict[str, Any], device: int, trace: TraceColumns, ooms: list[dict[str, Any]]) -> None:
    """The OOMs' figures from the trace replayed through stowage's allocator (in place)."""
    if not ooms:
        return
    events = device_events(trace)
    if len(events) == 0:
        return
    replayed = events.replay(1 << 40, "", measure_latency=False)
    native = native_figures(snapshot, device)
    for oom in ooms:
        oom["stowage_peak_reserved"] = int(replayed["peak_reserved"])
        oom["stowage_peak_requested"] = int(replayed["peak_requested"])
        if native.comparable(int(replayed["peak_requested"])):
            oom["native_peak_reserved"] = native.peak_reserved


def advice_dict(row: _core.Advice) -> dict[str, Any]:
    out = {"rule": row.rule, "waste_bytes": row.waste_bytes, "saving_bytes": row.saving_bytes}
    if row.upper_bound is not None:
        out["upper_bound"] = row.upper_bound
    out["advice"] = row.advice
    return out


def inspect_device(snapshot: dict[str, Any], device: int, top: int) -> dict[str, Any]:
    """The device's report (`report_of` its findings)."""
    return report_of(snapshot, device, *inspect(snapshot, device, top))


def report_of(snapshot: dict[str, Any], device: int, found: _core.Findings, trace: TraceColumns) -> dict[str, Any]:
    """The device's findings as JSON-ready values, in the order `stowage inspect --json` prints
    them."""
    totals, segments = found.totals, found.segments
    ooms = [oom_dict(oom) for oom in found.ooms]
    _replayed(snapshot, device, trace, ooms)
    trial = found.fit_trial_peak
    return {
        "device": device,
        "totals": {name: getattr(totals, name) for name in (
            "allocated", "active", "requested", "reserved", "reserved_unallocated", "largest_free_block",
            "fragmentation", "segments")},
        "segments": {"count": segments.count,
                     "by_size": [{"size": row.size, "count": row.count, "bytes": row.bytes} for row in segments.by_size],
                     "fill_quartiles": list(segments.fill_quartiles),
                     "held_by_one_small_block": [
                         {"address": row.address, "segment_bytes": row.segment_bytes, "live_bytes": row.live_bytes,
                          "held_back": row.held_back, "site": row.site} for row in segments.held_by_one_small_block]},
        "sites_at_end": _sites(found.sites_at_end),
        "trace_events": len(trace),
        "trace_start_us": trace.first_time(),
        "peak": peak_dict(found.peak, trace),
        "ooms": ooms,
        "oom_events": found.oom_events,
        "steps": [{"number": s.number, "first_event": s.first_event, "last_event": s.last_event,
                   "peak_bytes": s.peak_bytes, "peak_event": s.peak_event, "end_bytes": s.end_bytes,
                   "fit_trial": s.fit_trial} for s in found.steps],
        "steps_found_by": found.steps_found_by,
        "growing": [{"site": row.site, "bytes_per_step": row.bytes_per_step, "steps": row.steps}
                    for row in found.growing],
        "fit_trial_peak": peak_dict(trial, trace) if trial is not None else None,
        "category_source": EXACT if found.exact_categories else INFERRED,
        "advice": [advice_dict(row) for row in found.advice],
        # stowage's snapshots of a device with activation offload carry its statistics.
        "offload": {k: int(v) for k, v in snapshot.get("offload", {}).items()} or None,
    }
