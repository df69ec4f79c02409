"""`stowage replay` and the C++ replay behind it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, MiB, SHARED_TRACES, event, stowage

from stowage import _core
from stowage.replay import STEP, min_capacity
from stowage.trace import device_events


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
    # Paged (the default): the 3 and 5 MiB blocks share four 2 MiB pages; the 1 MiB block's
    # small-pool page is moved from under the freed 3 MiB block rather than created.
    assert record["peak_reserved"] == 8 * MiB
    assert record["peak_mapped_pages"] == 4
    assert record["unmaps"] == 1
    assert record["oom"] is False
    assert record["native_peak_reserved"] is None  # the trace has no segment events
    assert record["min_capacity"] == 8 * MiB
    assert record["min_capacity_verified"] is True
    for key in ("trace", "events", "ns_per_call_p50", "ns_per_call_p99", "preexisting_segments",
                "maps"):
        assert key in record


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
    trace = _core.Trace(np.array(kinds, np.uint8), np.array(addresses, np.uint64),
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
    assert "snapshot.pickle" in result.stdout


def test_trace_arrays_must_agree() -> None:
    with pytest.raises(ValueError, match="same length"):
        _core.Trace(np.zeros(2, np.uint8), np.zeros(1, np.uint64), np.zeros(2, np.uint64),
                    np.zeros(2, np.uint64))
    with pytest.raises(ValueError, match="kind 7"):
        _core.Trace(np.full(1, 7, np.uint8), np.zeros(1, np.uint64), np.zeros(1, np.uint64),
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
def test_the_fragmentation_targets_hold_on_every_recorded_trace(trace: Path) -> None:
    """Issue #6's targets for the default configuration: reserved within 3% of the live peak
    with room to spare, and the step fits a device within 2% of it. Live mappings stay bounded."""
    result = stowage("replay", str(trace), "--json", "--min-capacity")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    requested = record["peak_requested"]
    assert record["peak_reserved"] <= 1.03 * requested
    assert record["min_capacity"] <= 1.02 * requested
    assert record["min_capacity_verified"]
    assert record["peak_mapped_pages"] * 2 * MiB == record["peak_reserved"]
    if record["native_comparable"]:
        assert record["peak_reserved"] <= record["native_peak_reserved"]


def test_learned_placement_on_the_steady_trace_plans_and_says_so() -> None:
    """The steady 8-step trace: the step is found without marks, planned, and placed; memory is
    no more than the dynamic pool's; the table says what learned placement did."""
    path = REPO / "bench" / "traces" / "gpt2_fixed_8steps.pickle.gz"
    dynamic = json.loads(stowage("replay", str(path), "--json").stdout)
    learned = json.loads(stowage("replay", str(path), "--json", "--config",
                                 "placement:learned").stdout)
    assert learned["plans_made"] == 1 and learned["departures"] == 0
    assert learned["planned_allocations"] >= 5 * 300  # steps 4 to 8
    assert learned["peak_reserved"] <= dynamic["peak_reserved"]
    assert learned["plan_live_bytes"] <= learned["arena_bytes"] <= 1.01 * learned["plan_live_bytes"] + 2 * MiB
    table = stowage("replay", str(path), "--config", "placement:learned")
    assert "learned placement made 1 plan(s), left 0" in table.stdout


def test_step_marks_in_a_trace_reach_the_allocator(write_snapshot) -> None:
    """Marked steps (snapshot entries with user_metadata stowage.mark_step): two alike give a plan."""
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
    assert learned["plans_made"] == 1
    assert learned["planned_allocations"] == 2 * 3  # steps 4 and 5
