"""`stowage replay` and the C++ replay behind it."""

from __future__ import annotations

import bisect
import json
import pickle
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import REPO, MiB, SHARED_TRACES, event, stowage

from stowage import _core
from stowage.replay import STEP, min_capacity, replay_snapshot
from stowage.snapshot_reader import TraceColumns, load_snapshot, load_snapshot_columnar, loads_snapshot_columnar
from stowage.replay import device_event_arrays, device_events, native_figures, step_period

sys.path.insert(0, str(REPO / "bench" / "replay"))
import native_rules  # noqa: E402  (bench/replay: PyTorch's allocator's rules, replayed)

SMALL = {
    "segments": [],
    "device_traces": [[
        event("alloc", 0x1000, 3 * MiB),
        event("alloc", 0x9000, 5 * MiB),
        event("free_requested", 0x1000, 3 * MiB),
        event("free_completed", 0x1000, 3 * MiB),
        event("free_completed", 0x7777, 64),  # never allocated in the trace: skipped
        event("alloc", 0, 0),  # zero-size: a counted no-op
        event("alloc", 0x2000, 1 * MiB),
        event("free_completed", 0x9000, 5 * MiB),
        event("free_completed", 0x2000, 1 * MiB),
    ]],
}


def test_replay_counts_and_peaks(write_snapshot) -> None:
    result = stowage("replay", str(write_snapshot(SMALL)), "--json", "--min-capacity")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout.strip())
    assert record["device"] == 0
    assert record["allocs"] == 4
    assert record["frees"] == 4
    assert record["skipped_frees"] == 1
    assert record["zero_size"] == 1
    assert record["peak_requested"] == 8 * MiB
    # Paged (the default): the 3 and 5 MiB blocks share four 2 MiB pages; with room to spare
    # (the replay's 1 TiB device) the 1 MiB block's small-class page is new, not moved from
    # under the freed 3 MiB block (Note [Stitching]).
    assert record["peak_reserved"] == 10 * MiB
    assert record["peak_mapped_pages"] == 5
    assert record["unmaps"] == 0
    assert record["oom"] is False
    assert record["native_peak_reserved"] is None  # the trace has no segment events
    # On the smallest device the page moves instead.
    assert record["min_capacity"] == 8 * MiB
    assert record["min_capacity_verified"] is True
    for key in ("trace", "events", "ns_per_call_p50", "ns_per_call_p99", "preexisting_segments",
                "maps"):
        assert key in record
    # No marks: the trace is one step, all of it warm-up.
    assert len(record["steps"]) == 1 and record["steps"][0]["maps"] == 5
    assert record["after_warmup"]["steps"] == 0


def test_the_segment_path_replays_too(write_snapshot) -> None:
    result = stowage("replay", str(write_snapshot(SMALL)), "--json", "--min-capacity",
                     "--config", "virtual_memory:off")
    record = json.loads(result.stdout.strip())
    # One medium segment holds the 3 and 5 MiB blocks (24 MiB: eight of the first request's
    # blocks), a 2 MiB small one the 1 MiB block.
    assert record["peak_reserved"] == 26 * MiB
    assert record["maps"] == 0
    # 10 MiB: a 4 MiB and a 6 MiB segment when no shared one fits; then the 4 MiB one is
    # released for the 1 MiB block's 2 MiB segment.
    assert record["min_capacity"] == 10 * MiB
    assert record["min_capacity_verified"] is True


def test_a_small_device_runs_out_and_says_where(write_snapshot) -> None:
    result = stowage("replay", str(write_snapshot(SMALL)), "--json", "--capacity", "6MiB")
    record = json.loads(result.stdout.strip())
    assert record["oom"] is True
    assert record["oom_event"] == 1
    assert "out of memory" in record["oom_message"]
    assert record["peak_requested"] == 8 * MiB, "counted over the whole trace despite the OOM"


def test_min_capacity_is_verified_on_both_sides() -> None:
    rng = np.random.default_rng(3)
    n = 400
    sizes = rng.integers(1, 8 * MiB, n).astype(np.uint64)
    kinds, addresses, event_sizes = [], [], []
    live: list[int] = []
    for i in range(n):
        kinds.append(0)
        addresses.append(0x10000 + i * 0x1000)
        event_sizes.append(int(sizes[i]))
        live.append(i)
        if len(live) > 20:
            j = live.pop(int(rng.integers(0, len(live))))
            kinds.append(1)
            addresses.append(0x10000 + j * 0x1000)
            event_sizes.append(0)
    trace = _core.ReplayEvents(np.array(kinds, np.uint8), np.array(addresses, np.uint64),
                        np.array(event_sizes, np.uint64), np.zeros(len(kinds), np.uint64))
    first = trace.replay(1 << 40)
    found = min_capacity(trace, first["peak_requested"], "", first["peak_reserved"])
    capacity = found["min_capacity"]
    assert found["min_capacity_verified"]
    assert not trace.replay(capacity)["oom"]
    assert trace.replay(capacity - STEP)["oom"]
    assert first["peak_requested"] <= capacity <= first["peak_reserved"] + STEP


def test_config_reaches_the_allocator_and_bad_config_is_refused(write_snapshot) -> None:
    path = str(write_snapshot(SMALL))
    limited = json.loads(stowage("replay", path, "--json", "--config", "limit:6MiB").stdout)
    assert limited["oom"] is True
    bad = stowage("replay", path, "--config", "max_split:1")
    assert bad.returncode == 2
    assert "unknown key 'max_split'" in bad.stderr


def test_the_table_shows_the_figures(write_snapshot) -> None:
    result = stowage("replay", str(write_snapshot(SMALL)), "--min-capacity")
    assert result.returncode == 0, result.stderr
    assert "peak requested" in result.stdout
    assert "calls once warm" in result.stdout
    assert "snapshot " in result.stdout  # the trace's name, without .pickle


def test_trace_arrays_must_agree() -> None:
    with pytest.raises(ValueError, match="same length"):
        _core.ReplayEvents(np.zeros(2, np.uint8), np.zeros(1, np.uint64), np.zeros(2, np.uint64),
                    np.zeros(2, np.uint64))
    with pytest.raises(ValueError, match="kind 7"):
        _core.ReplayEvents(np.full(1, 7, np.uint8), np.zeros(1, np.uint64), np.zeros(1, np.uint64),
                    np.zeros(1, np.uint64))


def test_device_events_keep_alloc_and_free_completed_only() -> None:
    assert len(device_events(SMALL["device_traces"][0])) == 8


TRANSFORMER = SHARED_TRACES / "gpu_transformer2.7b_ctx128_fullstep.pickle"


@pytest.mark.skipif(not TRANSFORMER.exists(), reason="../shared/traces is not beside this clone")
def test_the_real_2_7b_training_step() -> None:
    result = stowage("replay", str(TRANSFORMER), "--json")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert abs(record["peak_requested"] / MiB - 39_267) <= 1
    assert record["native_peak_reserved"] == 45_154 * MiB
    assert record["skipped_frees"] == 0
    assert record["preexisting_segments"] == 227
    assert record["allocs_in_preexisting_segments"] == 222


def _recorded_traces() -> list[Path]:
    traces = sorted((REPO / "bench" / "traces").glob("*.pickle.gz"))
    if SHARED_TRACES.exists():
        traces += sorted(SHARED_TRACES.glob("*.pickle"))
    return traces


@pytest.mark.parametrize("trace", _recorded_traces(), ids=lambda path: path.name)
def test_the_memory_targets_hold_on_every_recorded_trace(trace: Path) -> None:
    """The default configuration's targets: the step fits a device within 2% of the live peak;
    with room to spare (1 TiB, and 1.25 times the peak) it reserves no more than PyTorch's
    allocator would (its rules replayed: bench/replay/native_rules.py); live mappings stay
    bounded; and steps that repeat make no device call once warm."""
    result = stowage("replay", str(trace), "--json", "--min-capacity")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    requested = record["peak_requested"]
    assert record["min_capacity"] <= 1.02 * requested
    assert record["min_capacity_verified"]
    assert record["peak_mapped_pages"] * 2 * MiB == record["peak_reserved"]
    arrays = device_event_arrays(load_snapshot_columnar(trace)["device_traces"][0])
    assert record["peak_reserved"] <= native_rules.replay(*arrays).peak_reserved
    roomy = int(1.25 * requested)
    on_roomy = _core.ReplayEvents(*arrays).replay(roomy, "", measure_latency=False)
    assert on_roomy["peak_reserved"] <= native_rules.replay(*arrays, capacity=roomy).peak_reserved
    warm = record["after_warmup"]
    if record["step_period"] is not None and warm["steps"] >= 2 * record["step_period"]:
        assert warm["device_calls"] == 0, warm


def test_learned_placement_on_the_steady_trace_lays_out_and_says_so() -> None:
    """The steady 8-step trace: the step is found without marks, laid out, and placed; memory is
    no more than the dynamic pool's; the table says what learned placement did."""
    path = REPO / "bench" / "traces" / "gpt2_fixed_8steps.pickle.gz"
    dynamic = json.loads(stowage("replay", str(path), "--json").stdout)
    learned = json.loads(stowage("replay", str(path), "--json", "--config",
                                 "placement:learned").stdout)
    assert learned["layouts_made"] == 1 and learned["departures"] == 0
    assert learned["placed_allocations"] >= 5 * 300  # steps 4 to 8
    assert learned["peak_reserved"] <= dynamic["peak_reserved"]
    assert learned["layout_live_bytes"] <= learned["arena_bytes"] <= 1.01 * learned["layout_live_bytes"] + 2 * MiB
    table = stowage("replay", str(path), "--config", "placement:learned")
    assert "learned placement made 1 step layout(s), left 0" in table.stdout


def test_step_marks_in_a_trace_reach_the_allocator(write_snapshot) -> None:
    """Marked steps (snapshot entries with user_metadata stowage.mark_step): two alike give a layout."""
    entries = []
    address = 0x100000
    for _ in range(5):
        live = []
        for size in (3 * MiB, 5 * MiB, 7 * MiB):
            entries.append(event("alloc", address, size))
            live.append((address, size))
            address += 16 * MiB
        for addr, size in live:
            entries.append(event("free_completed", addr, size))
        entries.append({"action": "snapshot", "addr": 0, "size": 0, "stream": 0,
                        "user_metadata": "stowage.mark_step"})
    path = write_snapshot({"segments": [], "device_traces": [entries]})
    learned = json.loads(stowage("replay", str(path), "--json", "--config",
                                 "placement:learned").stdout)
    assert learned["layouts_made"] == 1
    assert learned["placed_allocations"] == 2 * 3  # steps 4 and 5


# --- replay reads the columns: the same figures as from plain event dicts ---


def plain_events(trace: list[dict[str, Any]]) -> _core.ReplayEvents:
    """The replayable events made from plain event dicts one at a time: the reference for the
    arrays that stowage.replay makes from the columns."""
    kinds, addresses, sizes, streams = [], [], [], []
    for entry in trace:
        if entry["action"] in ("alloc", "free_completed"):
            kinds.append(0 if entry["action"] == "alloc" else 1)
            addresses.append(entry["addr"])
            sizes.append(entry["size"])
            streams.append(entry.get("stream", 0))
        elif entry["action"] == "snapshot" and entry.get("user_metadata") == "stowage.mark_step":
            kinds.append(2)
            addresses.append(0)
            sizes.append(0)
            streams.append(0)
    return _core.ReplayEvents(np.array(kinds, np.uint8), np.array(addresses, np.uint64), np.array(sizes, np.uint64),
                       np.array(streams, np.uint64))


def plain_native(snapshot: dict[str, Any], device: int) -> dict[str, Any]:
    """The recording allocator's figures from plain event dicts, one at a time."""
    trace = snapshot["device_traces"][device]
    reserved = peak = 0
    segment_events = 0
    created = set()
    for entry in trace:
        if entry["action"] in ("segment_alloc", "segment_map"):
            segment_events += 1
            reserved += entry["size"]
            peak = max(peak, reserved)
            created.add(entry["addr"])
        elif entry["action"] in ("segment_free", "segment_unmap"):
            segment_events += 1
            reserved -= entry["size"]
    preexisting = sorted((s["address"], s["total_size"]) for s in snapshot.get("segments", [])
                         if s.get("device", device) == device and s["address"] not in created)
    starts = [address for address, _ in preexisting]
    landed = landed_bytes = 0
    for entry in trace:
        if entry["action"] == "alloc" and preexisting:
            index = bisect.bisect_right(starts, entry["addr"]) - 1
            if index >= 0 and entry["addr"] < preexisting[index][0] + preexisting[index][1]:
                landed += 1
                landed_bytes += entry["size"]
    return {"native_peak_reserved": peak if segment_events else None, "preexisting_segments": len(preexisting),
            "preexisting_segment_bytes": sum(size for _, size in preexisting),
            "allocs_in_preexisting_segments": landed, "bytes_in_preexisting_segments": landed_bytes}


TIMINGS = {"seconds", "ns_per_call_p50", "ns_per_call_p99", "events_per_second"}


def figures(result: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in result.items() if key not in TIMINGS}


def segments_and_marks() -> dict[str, Any]:
    """Two devices' traces with what the columns must get right: step marks (and snapshot
    entries and metadata that are not marks), segment growth and shrinkage, allocations landing
    in segments cached before the trace (and one segment the trace created), streams present or
    not, oom entries, frees of addresses never allocated."""
    traces = []
    for device in range(2):
        trace: list[dict[str, Any]] = [event("segment_alloc", (1 << 30) * (device + 1), 64 * MiB)]
        for step in range(4):
            base = (1 << 30) * (device + 1) + step * MiB
            trace += [event("alloc", base, 3 * MiB, stream=step % 2), event("alloc", 0x7000_0000 + step, 512),
                      {"action": "alloc", "addr": base + 4 * MiB, "size": 1 * MiB},
                      event("free_requested", base, 3 * MiB), event("free_completed", base, 3 * MiB),
                      event("free_completed", 0x9999, 64),
                      {"action": "free_completed", "addr": base + 4 * MiB, "size": 1 * MiB},
                      event("segment_map", 1 << 40, 2 * MiB), event("segment_unmap", 1 << 40, 2 * MiB),
                      {"action": "snapshot", "user_metadata": "stowage.mark_step" if step % 3 else {"step": step}}]
        trace += [{"action": "oom", "size": 1 << 34, "device_free": 0, "stream": 0},
                  event("segment_free", (1 << 30) * (device + 1), 64 * MiB)]
        traces.append(trace)
    segments = [{"device": 0, "address": 0x7000_0000, "total_size": 2 * MiB, "blocks": []},
                {"device": 1, "address": 0x7000_0001, "total_size": 1, "blocks": []},
                {"address": 1 << 30, "total_size": 64 * MiB, "blocks": []}]
    return {"segments": segments, "device_traces": traces}


@pytest.mark.parametrize("config", ["", "placement:learned"])
def test_the_columns_replay_as_plain_event_dicts_do(config: str) -> None:
    snapshot = segments_and_marks()
    columns = loads_snapshot_columnar(pickle.dumps(snapshot, protocol=4))
    for device in range(2):
        trace = columns["device_traces"][device]
        assert isinstance(trace, TraceColumns)
        mine = device_events(trace)
        assert len(mine) == len(plain_events(snapshot["device_traces"][device])) == 4 * 6 + 2  # steps 1, 2 marked
        assert figures(mine.replay(1 << 40, config)) == figures(
            plain_events(snapshot["device_traces"][device]).replay(1 << 40, config))
        native = native_figures(columns, device)
        assert plain_native(snapshot, device) == {
            "native_peak_reserved": native.peak_reserved, "preexisting_segments": native.preexisting_segments,
            "preexisting_segment_bytes": native.preexisting_bytes,
            "allocs_in_preexisting_segments": native.allocs_in_preexisting,
            "bytes_in_preexisting_segments": native.bytes_in_preexisting}
        assert native.allocs_in_preexisting == (4, 1)[device] and native.peak_reserved == 66 * MiB


@pytest.mark.parametrize("trace", _recorded_traces(), ids=lambda path: path.name)
def test_replay_gives_on_every_recorded_trace_the_figures_of_plain_event_dicts(trace: Path) -> None:
    """`stowage replay` reads the columns; its figures are those of the trace's plain events."""
    result = stowage("replay", str(trace), "--json", "--min-capacity")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    snapshot = load_snapshot(trace)
    devices = [d for d, events in enumerate(snapshot["device_traces"]) if len(plain_events(events))]
    assert [record["device"] for record in records] == devices
    for record in records:
        device = record["device"]
        reference = plain_events(snapshot["device_traces"][device])
        replayed = figures(reference.replay(1 << 40, ""))
        assert {key: record[key] for key in replayed} == replayed
        expected = plain_native(snapshot, device)
        assert {key: record[key] for key in expected} == expected
        assert record["trace_entries"] == len(snapshot["device_traces"][device])


def test_replay_holds_a_fraction_of_the_snapshot(tmp_path: Path) -> None:
    """Loading and replaying a snapshot shaped as torch writes them stays under three quarters of
    the pickle's size in Python objects and arrays (plain event dicts took over four times it)."""
    sys.path.insert(0, str(REPO / "bench" / "inspect"))
    from synthetic_snapshot import write_snapshot as write_synthetic

    path = tmp_path / "synthetic.pickle"
    with path.open("wb") as out:
        write_synthetic(out, events=40_000)
    tracemalloc.start()
    try:
        snapshot = load_snapshot_columnar(path)
        results = replay_snapshot(path, snapshot, 1 << 40, "", search=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert results[0]["trace_entries"] == 40_000 and results[0]["allocs"] > 10_000
    assert peak < 0.75 * path.stat().st_size, f"{peak / path.stat().st_size:.2f} times the pickle"


def test_the_period_of_steps_is_found_from_what_they_allocate() -> None:
    def steps(*sizes: int) -> tuple[np.ndarray, np.ndarray]:
        kinds, values = [], []
        for size in sizes:
            kinds += [0, 1, 2]
            values += [size, 0, 0]
        return np.asarray(kinds, np.uint8), np.asarray(values, np.uint64)

    assert step_period(*steps(9, 5, 5, 5)) == 1  # the first step (optimizer state) is left out
    assert step_period(*steps(9, 1, 2, 3, 1, 2, 3, 1)) == 3
    assert step_period(*steps(9, 1, 2, 3, 4)) is None
    assert step_period(*steps(9)) is None


def test_each_step_reports_its_device_calls_and_their_cost(write_snapshot) -> None:
    entries = []
    for step in range(4):
        entries += [event("alloc", 0x1000, 3 * MiB), event("free_completed", 0x1000, 3 * MiB)]
        entries.append({"action": "snapshot", "addr": 0, "size": 0, "stream": 0,
                        "user_metadata": "stowage.mark_step"})
    path = write_snapshot({"segments": [], "device_traces": [entries]})
    record = json.loads(stowage("replay", str(path), "--json").stdout)
    assert [step["maps"] for step in record["steps"]] == [2, 0, 0, 0]
    assert record["steps"][0]["charged_ns"] > 0 and record["steps"][1]["charged_ns"] == 0
    assert record["step_period"] == 1
    assert record["after_warmup"] == {"warmup_steps": 2, "steps": 2, "maps": 0, "unmaps": 0,
                                      "device_calls": 0, "worst_step_ms": 0.0}
    free = _core.ReplayEvents(*device_event_arrays(load_snapshot_columnar(path)["device_traces"][0]))
    assert free.replay(1 << 40, "", costs="none")["steps"][0]["charged_ns"] == 0
    assert json.loads(stowage("replay", str(path), "--json", "--warmup", "0").stdout)[
        "after_warmup"]["maps"] == 2
    refused = stowage("replay", str(path), "--json", "--warmup", "-1")  # not the last step counted as warm
    assert refused.returncode == 2 and "warmup must be 0 or more steps, not -1" in refused.stderr
