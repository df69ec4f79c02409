"""One device's findings (``stowage._core.inspect``: snapshot/inspection.hpp computes every figure
in one call) and their JSON form, the report the text and HTML formatters read.

Beside the findings, the report carries what the snapshot holds as it is: the trace's times, the
replay of a trace that ran out of memory (stowage.replay's allocator, for the OOM's "what would
have helped") and stowage's offload statistics.
"""

from __future__ import annotations

from typing import Any

from stowage import _core
from stowage.replay import device_events, native_figures
from stowage.snapshot_reader import SnapshotError, TraceColumns, as_columns
from stowage.tagging import TAGS_KEY

# Which allocator recorded a snapshot: stowage's as torch's CUDA allocator (python/libtorch/cuda_allocator.cpp)
# fills torch's own settings, written as allocator_settings["PYTORCH_CUDA_ALLOC_CONF"] = "stowage:" and its
# configuration; stowage's CPU mode (python/bindings/torch/snapshot_dict.cpp) writes allocator_settings =
# {"allocator": "stowage", "config": ...}. Stock torch writes its PYTORCH_CUDA_ALLOC_CONF there (often empty);
# older snapshots, and stowage's profiler recordings of torch's CPU allocator, have other settings or none.
CUDA_MARK = "stowage:"

EXACT = "exact, noted by stowage while recording"
INFERRED = "inferred from stacks and lifetimes"


def recorded_by_stowage(snapshot: dict[str, Any]) -> bool:
    """Whether stowage's allocator (CUDA or CPU mode) recorded `snapshot`."""
    settings = snapshot.get("allocator_settings")
    if not isinstance(settings, dict):
        return False
    if settings.get("allocator") == "stowage":
        return True
    conf = settings.get("PYTORCH_CUDA_ALLOC_CONF")
    return isinstance(conf, str) and conf.startswith(CUDA_MARK)


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


def as_data(value: Any) -> Any:
    """A bound finding (stowage._core's) as JSON-ready data: a dict of its fields in the order the
    bindings define them (python/bindings/trace_analysis_bindings.cpp), a list item by item."""
    if isinstance(value, list):
        return [as_data(item) for item in value]
    if type(value).__module__ != _core.__name__:
        return value
    return {name: as_data(getattr(value, name)) for name, field in vars(type(value)).items()
            if isinstance(field, property)}


def peak_dict(peak: _core.Peak, trace: TraceColumns) -> dict[str, Any]:
    return {"live_bytes": peak.live_bytes, "event_index": peak.event_index,
            "time_us": trace.time_at(peak.event_index) if peak.event_index >= 0 else None,
            "baseline": peak.baseline, "sites": as_data(peak.sites), "categories": dict(peak.categories),
            "modules": as_data(peak.modules)}


def oom_dict(oom: _core.OomFinding) -> dict[str, Any]:
    return {"event_index": oom.event_index, "requested": oom.requested, "device_free": oom.device_free,
            "live_bytes": oom.live_bytes, "sites": as_data(oom.sites), "stowage_peak_reserved": None,
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


def inspect_device(snapshot: dict[str, Any], device: int, top: int) -> dict[str, Any]:
    """The device's report (`report_of` its findings)."""
    return report_of(snapshot, device, *inspect(snapshot, device, top))


def report_of(snapshot: dict[str, Any], device: int, found: _core.Findings, trace: TraceColumns) -> dict[str, Any]:
    """The device's findings as JSON-ready values, in the order `stowage inspect --json` prints
    them."""
    ooms = [oom_dict(oom) for oom in found.ooms]
    _replayed(snapshot, device, trace, ooms)
    trial = found.fit_trial_peak
    return {
        "device": device,
        "totals": as_data(found.totals),
        "segments": as_data(found.segments),
        "sites_at_end": as_data(found.sites_at_end),
        "trace_events": len(trace),
        "trace_start_us": trace.first_time(),
        "peak": peak_dict(found.peak, trace),
        "ooms": ooms,
        "oom_events": found.oom_events,
        "steps": as_data(found.steps),
        "steps_found_by": found.steps_found_by,
        "growing": as_data(found.growing),
        "fit_trial_peak": peak_dict(trial, trace) if trial is not None else None,
        "category_source": EXACT if found.exact_categories else INFERRED,
        "advice": [{key: value for key, value in as_data(row).items() if key != "upper_bound" or value is not None}
                   for row in found.advice],  # (upper_bound only where the saving is one)
        # stowage's snapshots of a device with activation offload carry its statistics.
        "offload": {k: int(v) for k, v in snapshot.get("offload", {}).items()} or None,
    }
