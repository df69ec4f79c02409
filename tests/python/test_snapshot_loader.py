"""The safe snapshot loaders refuse hostile and malformed files with clear errors, quickly; the
columnar loader reads what the plain loader reads, in a fraction of the file's size."""

from __future__ import annotations

import gzip
import io
import os
import pickle
import struct
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import REPO, SHARED_TRACES, event, stowage

from stowage.snapshot_reader import (ACTION_CODES, HAS_ADDR, HAS_DEVICE_FREE, HAS_FRAMES, HAS_SIZE, HAS_STREAM,
                                     TIME_BOOL, TIME_FLOAT, TIME_INT, SnapshotError, TraceColumns, columnar,
                                     load_snapshot, load_snapshot_columnar, loading, loads_snapshot,
                                     loads_snapshot_columnar, reading)

VALID = {"segments": [], "device_traces": [[event("alloc", 4096, 100), event("free_completed", 4096, 100)]]}
TRACES = sorted((REPO / "bench" / "traces").glob("*.pickle.gz")) + sorted(SHARED_TRACES.glob("*.pickle"))


@pytest.fixture(params=["whole", "columnar"])
def load(request: pytest.FixtureRequest) -> Callable[..., dict[str, Any]]:
    """Each loader in turn: every hostile input must be refused by both."""
    return load_snapshot if request.param == "whole" else load_snapshot_columnar


@pytest.fixture(params=["whole", "columnar"])
def loads(request: pytest.FixtureRequest) -> Callable[..., dict[str, Any]]:
    return loads_snapshot if request.param == "whole" else loads_snapshot_columnar


class Payload:
    """Unpickling this would run os.system and create the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_valid_snapshot_loads_plain_and_gzipped(write_snapshot) -> None:
    assert load_snapshot(write_snapshot(VALID)) == VALID
    gz = write_snapshot(gzip.compress(pickle.dumps(VALID)), "snapshot.pickle.gz")
    assert load_snapshot(gz) == VALID


def test_optional_fields_may_be_missing(write_snapshot) -> None:
    bare = {"device_traces": [[{"action": "alloc", "addr": 1, "size": 2}]]}
    assert load_snapshot(write_snapshot(bare)) == bare


def test_a_pickle_that_would_run_code_is_refused_before_anything_runs(tmp_path, write_snapshot, load) -> None:
    marker = tmp_path / "pwned"
    path = write_snapshot(pickle.dumps({"segments": [Payload(marker)], "device_traces": []}))
    with pytest.raises(SnapshotError, match=r"opcode (STACK_)?GLOBAL .* refused"):
        load(path)
    result = stowage("replay", str(path))
    assert result.returncode != 0
    assert "refused" in result.stderr
    assert not marker.exists()


@pytest.mark.parametrize(
    "snapshot, field",
    [
        ("not a dict", "snapshot: expected dict"),
        ({"segments": "x"}, "segments: expected list"),
        ({"device_traces": [[event("alloc", 1, 2), {"action": "alloc", "addr": 1, "size": "big"}]]},
         r"device_traces\[0\]\[1\].size: expected int, got str"),
        ({"device_traces": [[{"action": "teleport", "addr": 1, "size": 1}]]}, "unknown action"),
        ({"segments": [{"address": 1}]}, r"segments\[0\]: missing 'total_size'"),
        ({"device_traces": [[{"action": "alloc", "size": 1}]]}, r"device_traces\[0\]\[0\]: missing 'addr'"),
    ],
)
def test_wrong_shapes_name_the_first_bad_field(write_snapshot, snapshot, field, load) -> None:
    with pytest.raises(SnapshotError, match=field):
        load(write_snapshot(snapshot))


def test_truncated_files_say_so(write_snapshot, load) -> None:
    data = pickle.dumps(VALID)
    path = write_snapshot(data[: len(data) // 2])
    with pytest.raises(SnapshotError, match="truncated"):
        load(path)
    result = stowage("replay", str(path))
    assert result.returncode == 2
    assert "truncated" in result.stderr


@pytest.mark.parametrize("streaming", [False, True], ids=["plain", "columns"])
def test_the_machine_refuses_globals_even_when_handed_a_pickle_directly(tmp_path: Path, streaming: bool) -> None:
    marker = tmp_path / "pwned"
    data = pickle.dumps(Payload(marker))
    with pytest.raises(SnapshotError, match="opcode STACK_GLOBAL at byte [0-9]+ would build objects"):
        (loads_snapshot_columnar if streaming else loads_snapshot)(data)
    assert not marker.exists()


def test_foreign_types_are_refused(loads) -> None:
    with pytest.raises(SnapshotError, match="EMPTY_SET"):
        loads(pickle.dumps({"segments": [], "device_traces": [], "x": {1, 2}}, protocol=4))


def memo_bomb(levels: int = 40) -> bytes:
    """A few hundred bytes whose tree has 2**levels leaves: each list holds the previous twice."""
    ops = [b"\x80\x04", b"]", b"q\x00"]  # PROTO 4, EMPTY_LIST, BINPUT 0
    for level in range(1, levels + 1):
        ops += [b"(", b"h", bytes([level - 1]), b"h", bytes([level - 1]), b"l", b"q", bytes([level])]
    body = b"".join(ops)
    return body + b"}(X\x08\x00\x00\x00segmentsh" + bytes([levels]) + b"u."


def test_a_memo_bomb_is_refused_in_under_a_second(loads) -> None:
    data = memo_bomb()
    assert len(data) < 1000
    start = time.perf_counter()
    with pytest.raises(SnapshotError, match="memo bomb"):
        loads(data)
    assert time.perf_counter() - start < 1.0


def test_deep_nesting_is_refused_in_under_a_second(loads) -> None:
    depth = 100_000
    data = b"\x80\x04" + b"]" * depth + b"a" * (depth - 1) + b"."
    start = time.perf_counter()
    with pytest.raises(SnapshotError, match="deeper than"):
        loads(data)
    assert time.perf_counter() - start < 1.0


def test_a_missing_file_is_a_clear_error(tmp_path, load) -> None:
    with pytest.raises(SnapshotError, match="cannot read"):
        load(tmp_path / "absent.pickle")


def test_a_huge_memo_index_is_refused_before_the_unpickler_sees_it(loads) -> None:
    start = time.perf_counter()
    with pytest.raises(SnapshotError, match="memo index"):
        loads(b"\x80\x04Nr\x00\x00\x00\x10.")  # PROTO 4, NONE, LONG_BINPUT 2**28, STOP
    assert time.perf_counter() - start < 1.0


def test_numbers_built_to_collide_in_hash_tables_are_refused(loads) -> None:
    keys = {i * (2**61 - 1): 0 for i in range(1, 50)}  # all hash to 0
    with pytest.raises(SnapshotError, match="out of any snapshot's range"):
        loads(pickle.dumps({"segments": [], "device_traces": [], "x": keys}, protocol=4))


def test_a_gzip_bomb_is_refused(write_snapshot, load) -> None:
    bomb = gzip.compress(b"\x00" * (300 << 20))
    start = time.perf_counter()
    with pytest.raises(SnapshotError, match=r"gzip bomb\?\); if this is a real snapshot, gunzip"):
        load(write_snapshot(bomb, "bomb.pickle.gz"))
    assert time.perf_counter() - start < 5.0


def test_gzip_expanding_beyond_any_recorded_snapshot_is_refused(write_snapshot, load) -> None:
    # About 100 times (random bytes between runs of zeros): more than any recorded snapshot
    # (6 to 25), under the old limit of 256.
    rng = np.random.default_rng(0)
    chunks = [rng.bytes(100) + b"\x00" * 10_000 for _ in range(1_000)]
    data = b"".join(chunks)
    packed = gzip.compress(data)
    assert 64 < len(data) / len(packed) < 256 and len(data) > (8 << 20)
    with pytest.raises(SnapshotError, match="expands more than 64 times"):
        load(write_snapshot(packed, "packed.pickle.gz"))


def test_a_small_gzip_file_cannot_expand_into_gigabytes_of_objects(write_snapshot, load) -> None:
    """Each EMPTY_LIST byte is a list of about 70 bytes: 16 MiB of them, gzipped into 16 KiB,
    were a gigabyte of lists (60 KiB, 4.5 GiB and 15 s) before anything was refused."""
    bomb = gzip.compress(b"\x80\x04" + b"]" * (16 << 20) + b".")
    assert len(bomb) < 20_000
    start = time.perf_counter()
    with pytest.raises(SnapshotError, match="gzip bomb"):
        load(write_snapshot(bomb, "lists.pickle.gz"))
    assert time.perf_counter() - start < 2.0


@pytest.mark.parametrize(
    "snapshot, message",
    [
        ({"segments": [{"address": 1, "total_size": 2, "blocks": 5}]}, r"segments\[0\].blocks: expected list"),
        ({"device_traces": [[event("alloc", -4096, 10)]]}, "out of range"),
        ({"device_traces": [[event("alloc", 4096, 2**55)]]}, "out of range"),
    ],
)
def test_values_that_would_crash_the_replay_are_refused_by_name(write_snapshot, snapshot, message, load) -> None:
    with pytest.raises(SnapshotError, match=message):
        load(write_snapshot(snapshot))


def test_a_trace_of_frees_only_replays_without_a_traceback(write_snapshot) -> None:
    path = write_snapshot({"device_traces": [[event("free_completed", 4096, 10)]]})
    result = stowage("replay", str(path), "--min-capacity", "--json")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr


def test_progress_is_reported_while_loading_plain_data(tmp_path: Path) -> None:
    """The machine checks each opcode as it loads: one phase, reported as it goes."""
    trace = [{"action": "alloc", "addr": 4096 * i, "size": 512, "stream": 0} for i in range(200_000)]
    path = tmp_path / "big.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [trace]}, protocol=4))
    heard: list[tuple[str, int, int]] = []
    snapshot = load_snapshot(path, lambda *report: heard.append(report))
    assert len(snapshot["device_traces"][0]) == 200_000
    size = path.stat().st_size
    assert len(heard) >= 3 and {phase for phase, _, _ in heard} == {"loading"}
    assert [done for _, done, _ in heard] == sorted(done for _, done, _ in heard)
    assert heard[-1] == ("loading", size, size)


def test_an_oom_event_needs_its_free_bytes_and_a_device_must_be_a_number(loads) -> None:
    oom = {"action": "oom", "size": 1 << 30, "stream": 0}
    with pytest.raises(SnapshotError, match="missing 'device_free'"):
        loads(pickle.dumps({"segments": [], "device_traces": [[oom]]}))
    assert loads(pickle.dumps({"segments": [], "device_traces": [[dict(oom, device_free=7)]]}))
    segment = {"device": "x", "address": 0, "total_size": 512, "blocks": []}
    with pytest.raises(SnapshotError, match=r"segments\[0\].device"):
        loads(pickle.dumps({"segments": [segment], "device_traces": []}))


# --- the columnar loader ---


def empty_metadata(trace: TraceColumns) -> list[int]:
    """The events whose user_metadata is "" (torch writes one on every event: a mask, not a dict)."""
    return [] if trace.empty_metadata is None else np.flatnonzero(trace.empty_metadata).tolist()


def same_columns(a: TraceColumns, b: TraceColumns) -> None:
    for name in ("action", "flags", "addr", "size", "stream", "time_us"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.device_free == b.device_free and a.user_metadata == b.user_metadata
    assert empty_metadata(a) == empty_metadata(b)
    stacks_a = [a.stacks[s] if s >= 0 else None for s in a.stack.tolist()]
    stacks_b = [b.stacks[s] if s >= 0 else None for s in b.stack.tolist()]
    assert stacks_a == stacks_b


def same_snapshots(whole: dict[str, Any], streamed: dict[str, Any]) -> None:
    """The columnar loader's snapshot equals the plain loader's with its traces as columns."""
    expected = columnar(whole)
    assert expected.keys() == streamed.keys()
    for key in expected:
        if key != "device_traces":
            assert streamed[key] == expected[key], key
    assert len(streamed["device_traces"]) == len(expected["device_traces"])
    for a, b in zip(expected["device_traces"], streamed["device_traces"]):
        assert isinstance(b, TraceColumns)
        same_columns(a, b)


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_the_columnar_loader_reads_every_recorded_trace_as_the_plain_loader_does(path: Path) -> None:
    whole = load_snapshot(path)
    streamed = load_snapshot_columnar(path)
    same_snapshots(whole, streamed)
    for events, trace in zip(whole["device_traces"], streamed["device_traces"]):
        assert list(trace) == events  # these traces hold only the fields the columns keep
        if events:
            assert trace[-1] == events[-1] and trace[len(events) // 2] == events[len(events) // 2]


def reference_columns(events: list[dict[str, Any]]) -> dict[str, Any]:
    """What TraceColumns must hold of a list of event dicts, written out here from the format
    (stowage.snapshot_reader.columns) rather than taken from the reader."""
    columns: dict[str, Any] = {name: [] for name in ("action", "flags", "addr", "size", "stream", "time_us")}
    columns.update(frames=[], device_free={}, user_metadata={}, empty_metadata=[])
    for k, entry in enumerate(events):
        flags = sum(flag for name, flag in (("addr", HAS_ADDR), ("size", HAS_SIZE), ("stream", HAS_STREAM),
                                            ("device_free", HAS_DEVICE_FREE), ("frames", HAS_FRAMES)) if name in entry)
        time = entry.get("time_us")
        if "time_us" in entry:
            flags |= TIME_BOOL if isinstance(time, bool) else TIME_FLOAT if isinstance(time, float) else TIME_INT
        columns["action"].append(ACTION_CODES[entry["action"]])
        columns["flags"].append(flags)
        for name in ("addr", "size", "stream"):
            columns[name].append(entry.get(name, 0))
        columns["time_us"].append(struct.unpack("<q", struct.pack("<d", time))[0] if isinstance(time, float)
                                  else int(time or 0))
        columns["frames"].append(entry.get("frames", []))
        for name in ("device_free", "user_metadata"):
            if name == "user_metadata" and entry.get(name) == "":
                columns["empty_metadata"].append(k)
            elif name in entry:
                columns[name][k] = entry[name]
    return columns


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_every_recorded_trace_reads_as_pickle_reads_it(path: Path) -> None:
    """The recorded traces (files this project trusts) as pickle's own unpickler reads them: the
    plain loader gives its very data, and the columnar loader its events as the format says."""
    raw = path.read_bytes()
    expected = pickle.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    assert load_snapshot(path) == expected
    streamed = load_snapshot_columnar(path)
    assert {key: value for key, value in streamed.items() if key != "device_traces"} == \
        {key: value for key, value in expected.items() if key != "device_traces"}
    for events, trace in zip(expected["device_traces"], streamed["device_traces"], strict=True):
        reference = reference_columns(events)
        for name in ("action", "flags", "addr", "size", "stream", "time_us"):
            assert getattr(trace, name).tolist() == reference[name], name
        frames = [trace.stacks[s] if s >= 0 else [] if s == -1 else None for s in trace.stack.tolist()]
        assert frames == reference["frames"]
        assert trace.device_free == reference["device_free"] and trace.user_metadata == reference["user_metadata"]
        assert empty_metadata(trace) == reference["empty_metadata"]


def varied_snapshot(shared_event: bool = False) -> dict[str, Any]:
    """Two devices' traces with what snapshots vary in: shared frame dicts, frames None, empty or
    absent, float and missing times, oom events with device_free or addr, snapshot events
    without addr and with user_metadata (stowage.mark_step's marks), fields the inspector does
    not read, more than one APPENDS batch."""
    frames = [{"filename": f"/home/u/train{i}.py", "line": i, "name": f"f{i}"} for i in range(5)]
    stacks = [frames[:2], frames[1:4], [frames[4]], frames]
    traces = []
    for device in range(2):
        trace: list[dict[str, Any]] = []
        for i in range(2500):
            entry: dict[str, Any] = {"action": ("alloc", "free_completed", "free_requested", "segment_alloc")[i % 4],
                                     "addr": 4096 * (i % 97), "size": (i * 7919) % (1 << 24), "stream": i % 3}
            if i % 5:
                entry["time_us"] = 1_700_000_000_000_000 + i if i % 7 else i / 4
            entry["frames"] = (list(stacks[i % 4]), [], None)[i % 3] if i % 11 else stacks[i % 4]
            if i % 13 == 0:
                entry["compile_context"] = "N/A"
            if i % 2 == 0:
                entry["user_metadata"] = ""  # as torch writes every event
            trace.append(entry)
        trace.append({"action": "oom", "size": 1 << 30, "device_free": 5, "stream": 0, "frames": stacks[0]})
        trace.append({"action": "oom", "size": 1 << 30, "addr": 9})
        trace.append({"action": "snapshot"})
        trace += [{"action": "snapshot", "user_metadata": "stowage.mark_step"} for _ in range(3)]
        trace.append(dict(event("alloc", 8192, 512), user_metadata={"note": [1, 2]}))
        if shared_event:
            trace.append(trace[0])
        traces.append(trace)
    segment = {"device": 0, "address": 1 << 32, "total_size": 2 << 20, "frames": stacks[1],
               "blocks": [{"address": 1 << 32, "size": 2 << 20, "state": "active_allocated", "frames": stacks[1]}]}
    return {"segments": [segment], "device_traces": traces, "allocator_settings": {"x": [1.5, None]}}


def loaded_whole(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Notes whether the columnar loader reads the snapshot again as plain data."""
    calls: list[bool] = []

    def whole(*args: Any) -> dict[str, Any]:
        calls.append(True)
        return loads_snapshot(*args)

    monkeypatch.setattr(loading, "loads_snapshot", whole)
    return calls


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("shared_event", [False, True], ids=["", "shared-event"])
def test_every_pickle_protocol_and_layout_reads_alike(write_snapshot, monkeypatch, protocol: int,
                                                      shared_event: bool) -> None:
    """An event written twice is read again as plain data; every protocol streams otherwise.
    Protocol 0 makes its lists with MARK ... LIST, not EMPTY_LIST: its traces are read as plain
    data in the one reading, then become columns."""
    path = write_snapshot(pickle.dumps(varied_snapshot(shared_event), protocol=protocol))
    whole = load_snapshot(path)
    calls = loaded_whole(monkeypatch)
    streamed = load_snapshot_columnar(path)
    same_snapshots(whole, streamed)
    assert bool(calls) == (shared_event and protocol > 0)
    kept = ("action", "addr", "size", "stream", "time_us", "frames", "device_free", "user_metadata")
    for events, trace in zip(whole["device_traces"], streamed["device_traces"]):
        assert list(trace) == [{key: e[key] for key in kept if key in e} for e in events]


def test_a_large_file_is_mapped_given_back_as_read_and_reads_alike(write_snapshot, monkeypatch) -> None:
    monkeypatch.setattr(reading, "_MAP_AT_LEAST", 1 << 12)
    monkeypatch.setattr(loading, "_RELEASE_EVERY", 1 << 16)
    path = write_snapshot(pickle.dumps(varied_snapshot(), protocol=4))
    assert path.stat().st_size > 1 << 17
    same_snapshots(load_snapshot(path), load_snapshot_columnar(path))


def test_bad_frames_are_named_by_the_columnar_loader(write_snapshot) -> None:
    for frames, message in (("abc", r"device_traces\[0\]\[0\].frames: expected list, got str"),
                            ([1], r"device_traces\[0\]\[0\].frames\[0\]: expected dict, got int")):
        path = write_snapshot({"device_traces": [[dict(event("alloc", 4096, 8), frames=frames)]]})
        with pytest.raises(SnapshotError, match=message):
            load_snapshot_columnar(path)


def test_the_first_bad_event_is_named_whichever_path_read_it(monkeypatch) -> None:
    """A bad event read by the general path (it holds a new string) before a bad one matched
    whole, in the same APPENDS batch: the first is named."""
    trace = [event("alloc", 4096 * i, 8) for i in range(5)]
    trace[1].update(size="big", odd="x")
    trace[3]["size"] = True
    calls = loaded_whole(monkeypatch)
    with pytest.raises(SnapshotError, match=r"device_traces\[0\]\[1\].size: expected int, got str"):
        loads_snapshot_columnar(pickle.dumps({"device_traces": [trace]}, protocol=4))
    assert not calls


def test_columnar_progress_is_reported_while_loading(tmp_path: Path) -> None:
    trace = [{"action": "alloc", "addr": 4096 * i, "size": 512, "stream": 0} for i in range(200_000)]
    path = tmp_path / "big.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [trace]}, protocol=4))
    heard: list[tuple[str, int, int]] = []
    snapshot = load_snapshot_columnar(path, lambda *report: heard.append(report))
    assert len(snapshot["device_traces"][0]) == 200_000
    size = path.stat().st_size
    assert len(heard) >= 3 and {phase for phase, _, _ in heard} == {"loading"}
    assert [done for _, done, _ in heard] == sorted(done for _, done, _ in heard)
    assert heard[-1] == ("loading", size, size)


def test_columnar_loading_holds_a_fraction_of_the_file() -> None:
    """A snapshot shaped as torch writes them (bench/inspect/synthetic_snapshot.py): the loaded
    snapshot and everything made on the way stay under three quarters of the pickle's size
    (about half here, where segments and stacks weigh more than in a large one; the plain loader
    needs 4.4 times it)."""
    sys.path.insert(0, str(REPO / "bench" / "inspect"))
    from synthetic_snapshot import write_snapshot as write_synthetic

    out = io.BytesIO()
    write_synthetic(out, events=40_000)
    data = out.getvalue()
    tracemalloc.start()
    try:
        snapshot = loads_snapshot_columnar(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(snapshot["device_traces"][0]) == 40_000
    assert peak < 0.75 * len(data), f"{peak / len(data):.2f} times the pickle"


# --- frames, tuples and what the machine must not get wrong ---


def framed(frame: bytes, after: bytes) -> bytes:
    """PROTO 4, one FRAME holding `frame`, then `after` outside any frame."""
    return b"\x80\x04\x95" + len(frame).to_bytes(8, "little") + frame + after


def test_an_opcode_across_a_frame_end_is_refused_as_the_opcode_check_cannot_follow_it(loads) -> None:
    """The C unpickler reads an opcode that runs past its frame's end from after the frame,
    dropping the frame's last bytes, so it would run other opcodes than those checked: here the
    check sees a float and a string, the unpickler a float read from beyond the frame and then
    a GLOBAL hidden in the string."""
    hidden = b"cos\nsystem\n.".ljust(19, b"\x00")
    data = framed(b"G\x00\x00\x00", b"\x00" * 5 + b"\x8c\x14" + b"\x00" + hidden + b"00N.")
    with pytest.raises(SnapshotError, match="past the end of its frame"):
        loads(data)


@pytest.mark.parametrize("data, message", [
    (framed(b"N\x95\x01\x00\x00\x00\x00\x00\x00\x00N", b"0."), "before the frame at byte 2 ends"),
    (framed(b"N", b"\x95\xff\xff\x00\x00\x00\x00\x00\x00N."), "truncated"),
])
def test_frames_that_lie_about_their_length_are_refused(loads, data: bytes, message: str) -> None:
    with pytest.raises(SnapshotError, match=message):
        loads(data)


@pytest.mark.parametrize("protocol", [4, 5])
def test_large_strings_written_outside_frames_still_load(protocol: int) -> None:
    snapshot = {"segments": [], "device_traces": [[event("alloc", 4096, 8)]], "note": "x" * 200_000,
                "after": [{"a": 1}] * 3}
    data = pickle.dumps(snapshot, protocol=protocol)
    assert loads_snapshot(data) == snapshot
    assert list(loads_snapshot_columnar(data)["device_traces"][0]) == snapshot["device_traces"][0]


def test_deeply_nested_tuples_are_refused_without_crashing(write_snapshot) -> None:
    """A dict key made of 200,000 nested tuples (200 KB) made the unpickler's hashing recurse in C
    until the process died; both commands refuse it."""
    path = write_snapshot(b"\x80\x04}" + b")" + b"\x85" * 200_000 + b"Ns.")
    for command in ("replay", "inspect"):
        result = stowage(command, str(path))
        assert result.returncode == 2, (command, result.returncode, result.stderr[-500:])
        assert "tuples nested deeper than 64 levels" in result.stderr


def colliding_pairs(count: int, bits: int = 60, target: int = 0x123456789ABCDEF) -> list[tuple[int, int]]:
    """Pairs of integers below 2**bits whose tuples all hash to `target` (CPython's tuple hash is
    xxHash's round on each item's hash, which is the integer itself: invertible)."""
    mask, prime1, prime2, prime5 = (1 << 64) - 1, 11400714785074694791, 14029467366897019727, 2870177450012600261
    inverse1, inverse2 = pow(prime1, -1, 1 << 64), pow(prime2, -1, 1 << 64)
    after_second = ((target - (2 ^ prime5 ^ 3527539)) * inverse1) & mask  # undo the length and last multiply
    after_second = ((after_second >> 31) | (after_second << 33)) & mask  # undo the rotation
    pairs, first = [], 0
    while len(pairs) < count:
        first += 1
        accumulator = prime5 + first * prime2
        accumulator = (((accumulator << 31) | ((accumulator & mask) >> 33)) * prime1) & mask
        second = ((after_second - accumulator) * inverse2) & mask
        if second < 2**bits:
            pairs.append((first, second))
    return pairs


@pytest.mark.parametrize("count", [10, 20_000])
def test_tuple_keys_are_refused_before_they_can_collide(loads, count: int) -> None:
    """20,000 tuple keys that hash alike would take minutes to put in one dict (quadratic)."""
    pairs = colliding_pairs(count)
    assert len({hash(pair) for pair in pairs}) == 1
    body = b"".join(b"\x8a\x08" + a.to_bytes(8, "little") + b"\x8a\x08" + b.to_bytes(8, "little") + b"\x86N"
                    for a, b in pairs)
    data = b"\x80\x04}\x94(\x8c\x08segments]\x8c\x01x}(" + body + b"uu."
    start = time.perf_counter()
    with pytest.raises(SnapshotError, match="a dict key is a tuple"):
        loads(data)
    assert time.perf_counter() - start < 2.0


def test_memoized_tuple_keys_are_refused_before_dict_after_dict_collides(loads) -> None:
    """1,000 colliding tuples, made as torch makes segment_pool_id (small integers, TUPLE2) and
    memoized, then the keys of 400 dicts: counting tuples would not bound the time (seconds)."""
    pairs = colliding_pairs(1000, bits=55)
    made = b"".join(b"\x8a\x07" + a.to_bytes(7, "little") + b"\x8a\x07" + b.to_bytes(7, "little") + b"\x86r"
                    + i.to_bytes(4, "little") + b"0" for i, (a, b) in enumerate(pairs))
    keyed = b"}(" + b"".join(b"j" + i.to_bytes(4, "little") + b"N" for i in range(len(pairs))) + b"u"
    data = b"\x80\x04" + made + b"}\x94(\x8c\x08segments]\x8c\x01x(" + keyed * 400 + b"lu."
    start = time.perf_counter()
    with pytest.raises(SnapshotError, match="a dict key is a tuple"):
        loads(data)
    assert time.perf_counter() - start < 1.0


def test_tuples_as_torch_writes_them_load_alike(write_snapshot, monkeypatch) -> None:
    """segment_pool_id is a tuple of two integers in every segment of a GPU snapshot."""
    segments = [{"address": i << 21, "total_size": 2 << 20, "segment_pool_id": (0, i % 3), "blocks": []}
                for i in range(50)]
    snapshot = {"segments": segments, "device_traces": [[event("alloc", 4096, 8)]], "x": [(), ("a", (1, 2.5))]}
    path = write_snapshot(pickle.dumps(snapshot, protocol=4))
    assert load_snapshot(path) == snapshot
    same_snapshots(load_snapshot(path), load_snapshot_columnar(path))


def short(text: str) -> bytes:
    """SHORT_BINUNICODE `text`, MEMOIZE."""
    return b"\x8c" + bytes([len(text)]) + text.encode() + b"\x94"


# Hand-written pickles that the C pickler never writes but that unpickle to valid snapshots: in
# each an event or its frames list changes after the reader has made it a row, or a matched
# event is dropped, repeated or changed on the stack. Memo slots are noted as [n].
_ROOT = b"\x80\x04}\x94(" + short("device_traces") + b"]\x94]\x94("  # root [0], key [1], traces [2], trace [3]
_FIRST = (b"}\x94(" + short("action") + short("alloc") + short("addr") + b"K\x01" + short("size")
          + b"K\x02u")  # event [4], keys and values [5] to [8]


def _matched(addr: int, size: int) -> bytes:
    """An event as the C pickler writes it once its keys are memoized: matched whole."""
    return b"}\x94(h\x05h\x06h\x07K" + bytes([addr]) + b"h\x08K" + bytes([size]) + b"u"


_FRAMES = (b"\x80\x04}\x94(" + short("segments") + b"]\x94}\x94(" + short("address") + b"K\x00"
           + short("total_size") + b"K\x01" + short("frames") + b"]\x94}\x94" + short("name") + short("a")
           + b"saua" + short("device_traces") + b"]\x94]\x94}\x94(" + short("action") + short("alloc")
           + short("addr") + b"K\x01" + short("size") + b"K\x02h\x06h\x07uaa")  # a segment's frames [7] shared

CHANGED_AFTER_READ = {
    # The first event memoized twice ([4] and [5]): set its size through [4] once it is a row.
    "event memoized twice": _ROOT + _FIRST.replace(b"}\x94(", b"}\x94\x94(", 1).replace(b"h\x05", b"h\x06")
    + b"ea" + b"h\x04\x8c\x04size\x94K\x63s0u.",
    # A matched event popped, the next one repeated: torch's reader of the trace sees [b, b].
    "matched event popped and another repeated": _ROOT + _FIRST + _matched(10, 10) + b"0" + _matched(20, 20) + b"2eau.",
    # A matched event's size set on the stack before the trace takes it.
    "matched event changed on the stack": _ROOT + _FIRST + _matched(10, 10) + b"h\x08K\x63seau.",
    # An event made outside the trace (root["e"], [2]) and appended to it; then changed.
    "event made elsewhere, changed": b"\x80\x04}\x94(" + short("e") + b"}\x94(" + short("action") + short("alloc")
    + short("addr") + b"K\x01" + short("size") + b"K\x02u" + short("device_traces") + b"]\x94]\x94h\x02aa"
    + short("x") + b"h\x02h\x06K\x63su.",
    # The trace's frames list is a segment's; a frame is appended to it after the event is read.
    "frames list appended to": _FRAMES + short("x") + b"h\x07}\x94h\x09" + short("b") + b"sau.",
}


@pytest.mark.parametrize("name", CHANGED_AFTER_READ)
def test_events_changed_after_they_are_read_read_alike(name: str) -> None:
    data = CHANGED_AFTER_READ[name]
    same_snapshots(loads_snapshot(data), loads_snapshot_columnar(data))


def _event_with(field: bytes) -> bytes:
    """A snapshot of one event whose last field is `field` (key and value opcodes); the
    event's slot is [4], its keys' and values' [5] to [8]."""
    return (_ROOT + b"}\x94(" + short("action") + short("alloc") + short("addr") + b"K\x01" + short("size")
            + b"K\x02" + field + b"ueau.")


def _bomb(levels: int = 40) -> bytes:
    """A list holding twice a list holding twice ... (2**levels leaves), from slot 10 on."""
    ops = b"]r\x0a\x00\x00\x000"
    for level in range(levels):
        slot = (10 + level).to_bytes(4, "little")
        ops += b"(j" + slot + b"j" + slot + b"lr" + (11 + level).to_bytes(4, "little") + b"0"
    return ops + b"j" + (10 + levels).to_bytes(4, "little")


def _shared_stack(events: int = 1000, width: int = 5000) -> dict[str, Any]:
    """Events sharing one frames list whose frame holds `width` numbers: the tree the plain loader
    measures holds the frame once an event, over the budget of 64 values a byte."""
    frames = [{"name": "f", "line": 1, "locals": list(range(width))}]
    return {"device_traces": [[dict(event("alloc", 4096 * i, 8), frames=frames) for i in range(events)]]}


REFUSED_ALIKE = {
    "a memo bomb in a field the columns do not keep": (_event_with(short("x") + _bomb()), "memo bomb"),
    "a list holding itself in a field the columns do not keep":
        (_event_with(short("x") + b"]\x94h\x0aa"), "contains itself"),
    "user_metadata holding the snapshot": (_event_with(short("user_metadata") + b"h\x00"), "contains itself"),
    "a frame nested 60 deep (64 with the event's own levels)":
        (_event_with(short("frames") + b"]\x94}\x94" + short("name") + b"]" * 60 + b"a" * 59 + b"sa"),
         "nested deeper than 64 levels"),
    "a frames list shared by many events, over the budget as a tree": (pickle.dumps(_shared_stack(), protocol=4),
                                                                       "memo bomb"),
}


@pytest.mark.parametrize("name", REFUSED_ALIKE)
def test_what_the_whole_loader_refuses_inside_events_the_columnar_loader_refuses(loads, name: str) -> None:
    """The plain-data walk measures the events the columnar loader never holds as dicts: their
    fields it does not keep, their frames once for each event, as load_snapshot does."""
    data, message = REFUSED_ALIKE[name]
    with pytest.raises(SnapshotError, match=message):
        loads(data)


LOADED_ALIKE = {
    # A trace, and the device_traces list, referred to again after them: plain data.
    "a trace referred to twice": _ROOT + b"ea" + short("x") + b"h\x03u.",
    "device_traces referred to twice": _ROOT + b"ea" + short("x") + b"h\x02u.",
    # An APPENDS of nothing, which pickle does without looking at its target (here a dict).
    "an empty APPENDS on a dict": _ROOT + b"ea" + short("x") + b"}(eu.",
    # The budget counts the whole snapshot: events and frames within it, segments without.
    "a frames list shared by a few events": pickle.dumps(_shared_stack(events=50, width=100), protocol=4),
}


@pytest.mark.parametrize("name", LOADED_ALIKE)
def test_what_the_whole_loader_loads_the_columnar_loader_loads(name: str) -> None:
    data = LOADED_ALIKE[name]
    same_snapshots(loads_snapshot(data), loads_snapshot_columnar(data))


_SHRINK = """
import os, pickle, sys
from stowage.snapshot_reader import SnapshotError, load_snapshot_columnar, reading
reading._MAP_AT_LEAST = reading._FILL_AHEAD = 1 << 16
path = sys.argv[1]
trace = [{"action": "alloc", "addr": 4096 * i, "size": 512, "stream": 0} for i in range(200_000)]
with open(path, "wb") as file:
    pickle.dump({"segments": [], "device_traces": [trace]}, file, protocol=4)
def cut(phase, done, total):  # as torch.cuda.memory._dump_snapshot rewriting the file would
    if done < total:
        os.truncate(path, (done + (1 << 20)) & ~4095)
try:
    load_snapshot_columnar(path, cut)
except SnapshotError as error:
    print(error)
"""


def test_a_file_that_shrinks_while_it_is_read_is_refused_not_a_crash(tmp_path: Path) -> None:
    """A large file was mapped, and a page of it read after the file had shrunk below it ended the
    process (SIGBUS), as when a snapshot is rewritten in place while inspect reads it."""
    path = tmp_path / "rewritten.pickle"
    result = subprocess.run([sys.executable, "-c", _SHRINK, str(path)], capture_output=True, text=True)
    assert result.returncode == 0, (result.returncode, result.stderr[-500:])
    assert f"{path}: the file changed while it was read" in result.stdout


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_a_device_or_an_endless_pipe_is_refused_not_read_forever(
        load, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SnapshotError, match="does not start as a gzip file or a pickle"):
        load(Path("/dev/zero"))
    # A pipe that starts like a pickle but does not end is read up to the bound, then refused.
    monkeypatch.setattr(reading, "MAX_STREAM_BYTES", 32 << 20)
    fifo = tmp_path / "snapshot.pickle"
    os.mkfifo(fifo)
    # The writer opens the pipe itself: opening it blocks until the loader opens the other end.
    writer = subprocess.Popen([sys.executable, "-c", "import sys\n"
                               "out = open(sys.argv[1], 'wb')\n"
                               "out.write(b'\\x80\\x04')\n"
                               "while True: out.write(b'N' * (1 << 20))", str(fifo)],
                              stderr=subprocess.DEVNULL)
    try:
        with pytest.raises(SnapshotError, match="more than 32 MiB from a pipe"):
            load(fifo)
    finally:
        writer.kill()
        writer.wait()


def test_joined_gzip_files_are_refused_not_half_read(write_snapshot, load) -> None:
    one = gzip.compress(pickle.dumps(VALID, protocol=4))
    with pytest.raises(SnapshotError, match="after the end of the gzip stream"):
        load(write_snapshot(one + one, "joined.pickle.gz"))
    assert load(write_snapshot(one + b"\x00" * 16, "padded.pickle.gz"))["segments"] == []


def test_the_reader_leaves_stowage_snapshot_the_function() -> None:
    """Importing a submodule sets it as an attribute of its package: a reader package named
    stowage.snapshot would replace the function stowage.snapshot()."""
    import stowage
    import stowage.snapshot_reader  # noqa: F401

    assert callable(stowage.snapshot) and stowage.snapshot is stowage.memory.snapshot
