"""The columnar loader against the plain loader, both the one stack machine: on every layout a
pickler writes, on hostile opcodes, on every truncation of a small snapshot and on thousands of
seeded mutations of one, both load the same data, which is what pickle's own unpickler makes of
it, or both refuse it with a SnapshotError naming the file, and nothing else ever escapes."""

from __future__ import annotations

import gzip
import io
import math
import pickle
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import event

from stowage.snapshot_reader import (ACTIONS, SnapshotError, TraceColumns, columnar, load_snapshot,
                                     load_snapshot_columnar, loading, loads_snapshot, loads_snapshot_columnar,
                                     reading)

KEPT = ("action", "addr", "size", "stream", "time_us", "frames", "device_free", "user_metadata")


def assert_same(whole: dict[str, Any], streamed: dict[str, Any]) -> None:
    """The columnar loader's snapshot is the plain loader's with its traces as columns: the same
    other fields, and every event's kept fields (frames as the same frame dicts)."""
    expected = columnar(whole)
    assert streamed.keys() == expected.keys()
    for key in expected:
        if key != "device_traces":
            assert streamed[key] == expected[key], key
    assert len(streamed.get("device_traces", [])) == len(whole.get("device_traces", []))
    for events, mine, theirs in zip(whole.get("device_traces", []), expected.get("device_traces", []),
                                    streamed.get("device_traces", [])):
        assert isinstance(theirs, TraceColumns)
        for name in ("action", "flags", "addr", "size", "stream", "time_us"):
            assert np.array_equal(getattr(mine, name), getattr(theirs, name)), name
        assert mine.device_free == theirs.device_free and mine.user_metadata == theirs.user_metadata
        assert list(theirs) == [{key: e[key] for key in KEPT if key in e} for e in events]


Outcome = tuple[str, Any]


def outcome(load: Callable[[], dict[str, Any]], name: str) -> Outcome:
    """('ok', snapshot) or ('refused', message); any other exception fails the test."""
    try:
        return "ok", load()
    except SnapshotError as error:
        assert str(error).startswith(f"{name}: "), str(error)
        return "refused", str(error)


def loads_whole_columnar(data: bytes, name: str) -> dict[str, Any]:
    """load_snapshot, then its traces as columns: what the columnar loader must match (it also
    refuses frames that are not lists of dicts, which load_snapshot lets through)."""
    snapshot = loads_snapshot(data, name)
    try:
        return columnar(snapshot)
    except SnapshotError as error:
        raise SnapshotError(f"{name}: {error}") from None


def both(data: bytes, name: str = "<bytes>") -> tuple[Outcome, Outcome]:
    whole = outcome(lambda: loads_whole_columnar(data, name), name)
    streamed = outcome(lambda: loads_snapshot_columnar(data, name), name)
    return whole, streamed


def assert_alike(data: bytes) -> str:
    """Both loaders load `data` alike or both refuse it; returns which. What they load is what
    pickle's own unpickler makes of it (safe to run there: the machine let only plain data
    through), the reference that the one stack machine is held to."""
    whole, streamed = both(data)
    assert whole[0] == streamed[0], (whole[1] if whole[0] == "refused" else "loaded",
                                     streamed[1] if streamed[0] == "refused" else "loaded")
    if whole[0] == "ok":
        plain = loads_snapshot(data)
        assert plain == pickle.loads(data)
        assert_same(plain, streamed[1])
    return whole[0]


# --- every layout a pickler writes ---


def snapshot(frames: bool = True, optional: bool = True, metadata: bool = True) -> dict[str, Any]:
    """Two devices' traces with every action, shared and unshared frames, optional fields present
    or not, and user_metadata as stowage.mark_step writes it and as a structure."""
    pool = [{"filename": f"/src/m{i}.py", "line": i, "name": f"f{i}"} for i in range(6)]
    traces = []
    for device in range(2):
        trace: list[dict[str, Any]] = []
        for i in range(120):
            action = ACTIONS[i % 7]  # alloc ... segment_unmap, snapshot
            entry: dict[str, Any] = {"action": action}
            if action != "snapshot":
                entry.update(addr=(i * 4096) << device, size=(i * 7919) % (1 << 22) + 1)
            if optional:
                if i % 3:
                    entry["stream"] = i % 2
                if i % 4:
                    entry["time_us"] = 1_700_000_000_000_000 + i if i % 5 else i / 8
                if i % 9 == 0:
                    entry["compile_context"] = "N/A"
            if frames and i % 6:
                entry["frames"] = (list(pool[i % 3:i % 3 + 3]), pool[:2], [], None)[i % 4]
            if metadata and action == "snapshot":
                entry["user_metadata"] = "stowage.mark_step" if i % 2 else {"step": i, "tags": ["a"]}
            trace.append(entry)
        trace.append({"action": "oom", "size": 1 << 30, "device_free": 4096, "stream": 0})
        traces.append(trace)
    segments = [{"device": 0, "address": 1 << 32, "total_size": 2 << 20, "segment_pool_id": (0, 0),
                 "frames": pool[:2], "blocks": [{"address": 1 << 32, "size": 512, "state": "active_allocated"}]}]
    return {"segments": segments, "device_traces": traces, "allocator_settings": {"expandable_segments": False}}


def dumps(value: Any, protocol: int, memo: bool) -> bytes:
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=protocol)
    pickler.fast = not memo  # no memo: every shared frame and string written again
    pickler.dump(value)
    return out.getvalue()


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("memo", [True, False], ids=["memo", "no-memo"])
@pytest.mark.parametrize("shape", ["full", "no-frames", "bare"])
def test_every_layout_loads_alike(tmp_path: Path, protocol: int, memo: bool, shape: str) -> None:
    value = snapshot(frames=shape == "full", optional=shape != "bare", metadata=shape != "bare")
    data = dumps(value, protocol, memo)
    assert loads_snapshot(data) == value
    assert assert_alike(data) == "ok"
    path = tmp_path / "snapshot.pickle.gz"
    path.write_bytes(gzip.compress(data))
    assert_same(load_snapshot(path), load_snapshot_columnar(path))


@pytest.mark.parametrize("protocol, shared_event", [(0, False), (1, False), (4, False), (4, True)],
                         ids=["text-lines", "protocol-1", "streamed", "read-again"])
def test_a_large_file_read_as_the_reader_goes_loads_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          protocol: int, shared_event: bool) -> None:
    """Read a few KiB ahead and given back behind (protocol 0's opcodes whose argument is a line
    too), or, with an event written twice, read once, then again whole as plain data."""
    for module, name, value in ((reading, "_MAP_AT_LEAST", 1 << 12), (reading, "_FILL_AHEAD", 1 << 12),
                                (loading, "_RELEASE_EVERY", 1 << 13), (loading, "_REPORT_EVERY", 1 << 12)):
        monkeypatch.setattr(module, name, value)
    value = snapshot()
    if shared_event:
        value["device_traces"][0].append(value["device_traces"][0][0])
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(value, protocol=protocol))
    assert path.stat().st_size > 2 << 12  # more than one window
    assert_same(load_snapshot(path), load_snapshot_columnar(path))


# --- hostile opcodes and wrong values ---


def with_event(extra: dict[str, Any], base: dict[str, Any] | None = None) -> bytes:
    trace = [event("alloc", 4096, 8), {**(base or event("alloc", 8192, 16)), **extra}, event("free_completed", 4096, 8)]
    return pickle.dumps({"segments": [], "device_traces": [trace]}, protocol=4)


def spliced(before: bytes, payload: bytes, after: bytes = b"") -> bytes:
    """A protocol-4 snapshot of one event whose 'size' value is `payload` (raw opcodes)."""
    return (b"\x80\x04}\x94(\x8c\rdevice_traces\x94]\x94]\x94(}\x94(\x8c\x06action\x94\x8c\x05alloc\x94"
            b"\x8c\x04addr\x94K\x01\x8c\x04size\x94" + before + payload + after + b"ueau.")


HOSTILE = {
    "GLOBAL in a size": spliced(b"", b"cos\nsystem\n"),
    "STACK_GLOBAL in a size": spliced(b"", b"\x8c\x02os\x8c\x06system\x93"),
    "REDUCE in a size": spliced(b"", b"N)R"),
    "BUILD in a size": spliced(b"", b"}}b"),
    "INST in a size": spliced(b"", b"(ios\nsystem\n"),
    "EXT1 in a size": spliced(b"", b"\x82\x01"),
    "PERSID in a size": spliced(b"", b"P1\n"),
    "a set in a size": spliced(b"", b"\x8f"),
    "a bytearray in a size": spliced(b"", b"\x96\x01\x00\x00\x00\x00\x00\x00\x00x"),
    "a memo reference beyond the file": spliced(b"", b"j\xff\xff\xff\x7f"),
    "a memo reference to a slot not yet stored": spliced(b"", b"h\x0b"),
    "a memo store beyond the file": spliced(b"K\x02", b"r\xff\xff\xff\x7f"),
    "LONG4 past the end of the file": spliced(b"", b"\x8b\xff\xff\xff\x0f\x01"),
    "BINUNICODE8 past the end of the file": spliced(b"", b"\x8d" + (1 << 40).to_bytes(8, "little") + b"x"),
    "BINBYTES8 past the end of the file": spliced(b"", b"\x8e" + (1 << 62).to_bytes(8, "little")),
    "LONG4 with a negative length": spliced(b"", b"\x8b\xff\xff\xff\xff"),
    "a number of 2**64": spliced(b"", b"\x8a\x09" + (1 << 64).to_bytes(9, "little")),
    "a number of 2**60": spliced(b"", b"\x8a\x08" + (1 << 60).to_bytes(8, "little")),
    "a negative size": with_event({"size": -1}),
    "a size of 2**50": with_event({"size": 2**50}),
    "an address of -1": with_event({"addr": -1}),
    "a size that is a string": with_event({"size": "8"}),
    "a size that is a float": with_event({"size": 8.0}),
    "a size that is True": with_event({"size": True}),
    "a stream that is None": with_event({"stream": None}),
    "an action that is a number": with_event({"action": 1}),
    "an unknown action": with_event({"action": "malloc"}),
    "a time that is NaN": with_event({"time_us": math.nan}),
    "a time that is infinite": with_event({"time_us": math.inf}),
    "a time that is a string": with_event({"time_us": "now"}),
    "frames that are a dict": with_event({"frames": {"a": 1}}),
    "a frame that is a string": with_event({"frames": ["f"]}),
    "an oom without device_free": with_event({}, {"action": "oom", "size": 1}),
    "an event that is a list": pickle.dumps({"device_traces": [[["alloc", 1, 2]]]}, protocol=4),
    "a trace that is a dict": pickle.dumps({"device_traces": [{"action": "alloc"}]}, protocol=4),
    "a top level that is a list": pickle.dumps([{"device_traces": []}], protocol=4),
    "a top level that is None": pickle.dumps(None, protocol=4),
    "no segments nor device_traces": pickle.dumps({"traces": []}, protocol=4),
    "a segment device of -1": pickle.dumps({"segments": [{"address": 0, "total_size": 1, "device": -1}]}),
    "an empty file": b"",
    "no STOP": pickle.dumps({"device_traces": []}, protocol=4)[:-1],
    "protocol 9": b"\x80\x09N.",
    "an unknown opcode": spliced(b"", b"\xff"),
}
ACCEPTED = {
    "a sparse memo store": spliced(b"K\x02", b"q\x14"),
    "duplicate keys (the last wins)": spliced(b"K\x02\x8c\x04size\x94", b"K\x03"),
    "a key that is not a string": with_event({1: "one"}),
    "a time that is True": with_event({"time_us": True}),
    "an integer time of 2**59": with_event({"time_us": 2**59}),
    "a negative float time": with_event({"time_us": -1.5}),
    "an oom with addr instead of device_free": with_event({}, {"action": "oom", "size": 1, "addr": 3}),
    "a snapshot event without addr or size": with_event({}, {"action": "snapshot"}),
    "frames None": with_event({"frames": None}),
    "an empty trace": pickle.dumps({"device_traces": [[]]}, protocol=4),
    "segments only": pickle.dumps({"segments": []}, protocol=4),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_and_wrong_snapshots_are_refused_alike(name: str) -> None:
    assert assert_alike(HOSTILE[name]) == "refused"


@pytest.mark.parametrize("name", ACCEPTED)
def test_odd_but_valid_snapshots_load_alike(name: str) -> None:
    assert assert_alike(ACCEPTED[name]) == "ok"


# --- truncation and mutation ---


def small_snapshot_bytes(protocol: int) -> bytes:
    pool = [{"filename": "/src/a.py", "line": i, "name": "f"} for i in range(3)]
    trace = [dict(event(("alloc", "free_requested", "free_completed")[i % 3], 4096 * i, 512 * i + 1),
                  time_us=1000 + i, frames=[pool[i % 3], pool[(i + 1) % 3]]) for i in range(8)]
    trace += [{"action": "oom", "size": 1 << 20, "device_free": 7, "stream": 0},
              {"action": "snapshot", "user_metadata": "stowage.mark_step"}, dict(event("alloc", 1, 2), time_us=0.5)]
    segment = {"device": 0, "address": 1 << 32, "total_size": 2 << 20, "segment_pool_id": (0, 0), "frames": pool[:1],
               "blocks": [{"address": 1 << 32, "size": 4096, "state": "active_allocated"}]}
    return pickle.dumps({"segments": [segment], "device_traces": [trace, trace[:2]], "allocator_settings": {"x": 1.5}},
                        protocol=protocol)


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip"])
def test_every_truncation_of_a_small_snapshot_is_refused_alike(tmp_path: Path, compressed: bool) -> None:
    data = small_snapshot_bytes(4)
    content = gzip.compress(data) if compressed else data
    path = tmp_path / ("cut.pickle.gz" if compressed else "cut.pickle")
    for cut in range(len(content)):
        path.write_bytes(content[:cut])
        whole = outcome(lambda: load_snapshot(path), str(path))
        streamed = outcome(lambda: load_snapshot_columnar(path), str(path))
        assert whole[0] == streamed[0] == "refused", cut
        assert ("gzip" if compressed else "truncated") in streamed[1] or cut < 2, (cut, streamed[1])


_OPCODE_BYTES = [b"h", b"j", b"q", b"r", b"\x94", b"(", b")", b"}", b"]", b"e", b"u", b"a", b"s", b"0", b"1", b"2",
                 b"\x85", b"\x86", b"\x87", b"t", b"l", b"d", b"N", b"K\x00", b"\x95", b".",
                 b"\x8a\x08" + b"\xff" * 8, b"G\x7f\xf8" + b"\x00" * 6, b"c", b"R", b"\x8f"]


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One to four changes: a byte replaced or flipped, bytes cut, an opcode, a piece of the
    snapshot itself or a memo reference and what changes it inserted, or a frame's length off by
    a little."""
    mutated = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(mutated))
        kind = rng.random()
        if kind < 0.3:
            mutated[at] = rng.randrange(256)
        elif kind < 0.4:
            mutated[at] ^= 1 << rng.randrange(8)
        elif kind < 0.5:
            del mutated[at:at + rng.randint(1, 8)]
        elif kind < 0.7:
            mutated[at:at] = rng.choice(_OPCODE_BYTES)
        elif kind < 0.8:
            slot, key = rng.randrange(48), rng.randrange(48)
            mutated[at:at] = rng.choice([b"h%ch%cK\x05s" % (slot, key), b"h%c}a" % slot, b"h%c0" % slot])
        elif kind < 0.9 and mutated.find(b"\x95") >= 0:
            frame = mutated.find(b"\x95", rng.randrange(mutated.find(b"\x95") + 1))
            frame = frame if frame >= 0 else mutated.find(b"\x95")
            length = int.from_bytes(mutated[frame + 1:frame + 9], "little") + rng.randint(-9, 9)
            mutated[frame + 1:frame + 9] = max(length, 0).to_bytes(8, "little")
        else:
            start = rng.randrange(len(mutated))
            mutated[at:at] = mutated[start:start + rng.randint(1, 40)]
    return bytes(mutated)


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_mutated_snapshots_load_alike_or_are_refused_alike(protocol: int) -> None:
    """1,500 seeded mutations a protocol (about a second each): both loaders agree, and only
    SnapshotError escapes."""
    rng = random.Random(20261122 + protocol)
    data = small_snapshot_bytes(protocol)
    seen = {"ok": 0, "refused": 0}
    for _ in range(1500):
        seen[assert_alike(mutate(data, rng))] += 1
    assert seen["ok"] > 20 and seen["refused"] > 500, seen


# --- one machine: the same answer, for the same reason ---


@pytest.mark.parametrize("name", HOSTILE)
def test_both_loaders_refuse_for_the_same_reason(name: str) -> None:
    """Both loaders are the one stack machine, so a refusal reads alike whichever loader met it:
    the same reason, found at the same byte."""
    whole, streamed = both(HOSTILE[name], "hostile.pickle")
    assert whole[0] == streamed[0] == "refused"
    assert whole[1] == streamed[1]


# Python 2's pickles (protocols 0 to 2) write str as STRING, BINSTRING or SHORT_BINSTRING, and
# numbers as INT, LONG and FLOAT lines: decoded as pickle.loads decodes them (ASCII).
PYTHON2 = (b"(dp0\nS'device_traces'\np1\n(lp2\n(lp3\n(dp4\nS'action'\np5\nS'alloc'\np6\nsS'addr'\np7\nI4096\n"
           b"sS'size'\np8\nL512L\nsS'time_us'\np9\nF1.5\nsS'stream'\nI7\nsaasS'segments'\n(lp10\nsS'flag'\nI01\nsS'note'\n"
           b"p11\nS'a \\'quoted\\' \\x41'\nsT\x02\x00\x00\x00hiU\x02yos.")


def test_python2_text_opcodes_load_as_pickle_loads_them() -> None:
    expected = pickle.loads(PYTHON2)
    assert expected["note"] == "a 'quoted' A" and expected["hi"] == "yo" and expected["flag"] is True
    assert expected["device_traces"][0][0] == {"action": "alloc", "addr": 4096, "size": 512, "time_us": 1.5,
                                               "stream": 7}
    assert loads_snapshot(PYTHON2) == expected
    assert assert_alike(PYTHON2) == "ok"


@pytest.mark.parametrize("line, message", [
    (b"I1152921504606846976\n", "out of any snapshot's range"),  # 2**60
    (b"L-1152921504606846976L\n", "out of any snapshot's range"),
    (b"Fnan\n", "out of any snapshot's range"),
    (b"Finf\n", "out of any snapshot's range"),
    (b"Sunquoted\n", "must be quoted"),
    (b"S'\xe9'\n", "not a readable pickle"),
    (b"I12", "truncated"),
    (b"g5\n", "memo value not found"),
    (b"g999999\n", "memo index 999999 at byte"),
])
def test_text_opcodes_follow_the_policy(line: bytes, message: str) -> None:
    data = b"(dp0\nS'segments'\np1\n" + line + b"s."
    whole, streamed = both(data)
    assert whole[0] == streamed[0] == "refused"
    assert message in whole[1] and whole[1] == streamed[1]
