"""The safe snapshot loader refuses hostile and malformed files with clear errors, quickly."""

from __future__ import annotations

import gzip
import io
import os
import pickle
import time
from pathlib import Path

import pytest
from conftest import event, stowage

from stowage.snapshot_loader import SnapshotError, load_snapshot, loads_snapshot

VALID = {"segments": [], "device_traces": [[event("alloc", 4096, 100), event("free_completed", 4096, 100)]]}


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


def test_a_pickle_that_would_run_code_is_refused_before_anything_runs(tmp_path, write_snapshot) -> None:
    marker = tmp_path / "pwned"
    path = write_snapshot(pickle.dumps({"segments": [Payload(marker)], "device_traces": []}))
    with pytest.raises(SnapshotError, match=r"opcode (STACK_)?GLOBAL .* refused"):
        load_snapshot(path)
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
def test_wrong_shapes_name_the_first_bad_field(write_snapshot, snapshot, field) -> None:
    with pytest.raises(SnapshotError, match=field):
        load_snapshot(write_snapshot(snapshot))


def test_truncated_files_say_so(write_snapshot) -> None:
    data = pickle.dumps(VALID)
    path = write_snapshot(data[: len(data) // 2])
    with pytest.raises(SnapshotError, match="truncated"):
        load_snapshot(path)
    result = stowage("replay", str(path))
    assert result.returncode == 2
    assert "truncated" in result.stderr


def test_the_unpickler_refuses_globals_even_when_handed_a_pickle_directly() -> None:
    from stowage.snapshot_loader import _RefusingUnpickler

    data = pickle.dumps(Payload(Path("/nonexistent/marker")))
    with pytest.raises(SnapshotError, match="refused"):
        _RefusingUnpickler(io.BytesIO(data)).load()


def test_foreign_types_are_refused() -> None:
    with pytest.raises(SnapshotError, match="EMPTY_SET"):
        loads_snapshot(pickle.dumps({"segments": [], "device_traces": [], "x": {1, 2}}, protocol=4))


def memo_bomb(levels: int = 40) -> bytes:
    """A few hundred bytes whose tree has 2**levels leaves: each list holds the previous twice."""
    ops = [b"\x80\x04", b"]", b"q\x00"]  # PROTO 4, EMPTY_LIST, BINPUT 0
    for level in range(1, levels + 1):
        ops += [b"(", b"h", bytes([level - 1]), b"h", bytes([level - 1]), b"l", b"q", bytes([level])]
    body = b"".join(ops)
    return body + b"}(X\x08\x00\x00\x00segmentsh" + bytes([levels]) + b"u."


def test_a_memo_bomb_is_refused_in_under_a_second() -> None:
    data = memo_bomb()
    assert len(data) < 1000
    start = time.perf_counter()
    with pytest.raises(SnapshotError, match="memo bomb"):
        loads_snapshot(data)
    assert time.perf_counter() - start < 1.0


def test_deep_nesting_is_refused_in_under_a_second() -> None:
    depth = 100_000
    data = b"\x80\x04" + b"]" * depth + b"a" * (depth - 1) + b"."
    start = time.perf_counter()
    with pytest.raises(SnapshotError, match="deeper than"):
        loads_snapshot(data)
    assert time.perf_counter() - start < 1.0


def test_a_missing_file_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(SnapshotError, match="cannot read"):
        load_snapshot(tmp_path / "absent.pickle")


def test_a_huge_memo_index_is_refused_before_the_unpickler_sees_it() -> None:
    start = time.perf_counter()
    with pytest.raises(SnapshotError, match="memo index"):
        loads_snapshot(b"\x80\x04Nr\x00\x00\x00\x10.")  # PROTO 4, NONE, LONG_BINPUT 2**28, STOP
    assert time.perf_counter() - start < 1.0


def test_numbers_built_to_collide_in_hash_tables_are_refused() -> None:
    keys = {i * (2**61 - 1): 0 for i in range(1, 50)}  # all hash to 0
    with pytest.raises(SnapshotError, match="out of any snapshot's range"):
        loads_snapshot(pickle.dumps({"segments": [], "device_traces": [], "x": keys}, protocol=4))


def test_a_gzip_bomb_is_refused(write_snapshot) -> None:
    bomb = gzip.compress(b"\x00" * (300 << 20))
    start = time.perf_counter()
    with pytest.raises(SnapshotError, match="gzip bomb"):
        load_snapshot(write_snapshot(bomb, "bomb.pickle.gz"))
    assert time.perf_counter() - start < 5.0


@pytest.mark.parametrize(
    "snapshot, message",
    [
        ({"segments": [{"address": 1, "total_size": 2, "blocks": 5}]}, r"segments\[0\].blocks: expected list"),
        ({"device_traces": [[event("alloc", -4096, 10)]]}, "out of range"),
        ({"device_traces": [[event("alloc", 4096, 2**55)]]}, "out of range"),
    ],
)
def test_values_that_would_crash_the_replay_are_refused_by_name(write_snapshot, snapshot, message) -> None:
    with pytest.raises(SnapshotError, match=message):
        load_snapshot(write_snapshot(snapshot))


def test_a_trace_of_frees_only_replays_without_a_traceback(write_snapshot) -> None:
    path = write_snapshot({"device_traces": [[event("free_completed", 4096, 10)]]})
    result = stowage("replay", str(path), "--min-capacity", "--json")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr


def test_progress_is_reported_through_checking_and_loading(tmp_path: Path) -> None:
    trace = [{"action": "alloc", "addr": 4096 * i, "size": 512, "stream": 0} for i in range(200_000)]
    path = tmp_path / "big.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [trace]}, protocol=4))
    heard: dict[str, list[tuple[int, int]]] = {}
    snapshot = load_snapshot(path, lambda phase, done, total: heard.setdefault(phase, []).append((done, total)))
    assert len(snapshot["device_traces"][0]) == 200_000
    size = path.stat().st_size
    for phase in ("checking", "loading"):
        reports = heard[phase]
        assert len(reports) >= 2, phase
        assert [done for done, _ in reports] == sorted(done for done, _ in reports)
        assert reports[-1] == (size, size)


def test_an_oom_event_needs_its_free_bytes_and_a_device_must_be_a_number() -> None:
    oom = {"action": "oom", "size": 1 << 30, "stream": 0}
    with pytest.raises(SnapshotError, match="missing 'device_free'"):
        loads_snapshot(pickle.dumps({"segments": [], "device_traces": [[oom]]}))
    assert loads_snapshot(pickle.dumps({"segments": [], "device_traces": [[dict(oom, device_free=7)]]}))
    segment = {"device": "x", "address": 0, "total_size": 512, "blocks": []}
    with pytest.raises(SnapshotError, match=r"segments\[0\].device"):
        loads_snapshot(pickle.dumps({"segments": [segment], "device_traces": []}))
