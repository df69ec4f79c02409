"""stowage inspect: its figures agree with an independent computation on every recorded trace,
an OOM recorded in CPU mode is explained with the site that held the memory, and hostile or
malformed inputs end in a clear message and a non-zero exit."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, SHARED_TRACES, stowage
from stowage.snapshot_loader import load_snapshot

TRACES = sorted((REPO / "bench" / "traces").glob("*.pickle.gz")) + sorted(SHARED_TRACES.glob("*.pickle"))


def inspect_json(path: Path, *extra: str) -> dict[str, Any]:
    result = stowage("inspect", str(path), "--json", *extra)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_totals_and_the_peak_agree_with_an_independent_count(path: Path) -> None:
    report = inspect_json(path)
    snapshot = load_snapshot(path)
    device = report["device"]
    segments = [s for s in snapshot["segments"] if s.get("device", 0) == device]
    blocks = [b for s in segments for b in s["blocks"]]
    allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    assert report["totals"]["reserved"] == sum(s["total_size"] for s in segments)
    assert report["totals"]["allocated"] == allocated
    assert report["totals"]["largest_free_block"] == max(
        (b["size"] for b in blocks if b["state"] == "inactive"), default=0)
    # The trace's own live bytes (each allocation counted at its size until its address is
    # freed) minus the frees of addresses it never allocated, at its highest; plus what was live
    # before the trace began (from the end's requested bytes, at least what was freed of it).
    sizes: dict[int, int] = {}
    own = unknown = highest = 0
    for entry in snapshot["device_traces"][device]:
        if entry["action"] == "alloc":
            sizes[entry["addr"]] = entry["size"]
            own += entry["size"]
        elif entry["action"] == "free_completed":
            if entry["addr"] in sizes:
                own -= sizes.pop(entry["addr"])
            else:
                unknown += entry["size"]
        highest = max(highest, own - unknown)
    requested = sum(b["requested_size"] for b in blocks if b["state"] == "active_allocated")
    baseline = max(requested - own + unknown, unknown, 0) if segments else unknown
    assert report["peak"]["baseline"] == baseline
    assert report["peak"]["live_bytes"] == highest + baseline
    assert sum(site["bytes"] for site in report["peak"]["sites"]) <= report["peak"]["live_bytes"]


def test_the_text_report_names_its_sections() -> None:
    result = stowage("inspect", str(TRACES[0]))
    assert result.returncode == 0, result.stderr
    for section in ("totals", "fragmentation", "peak", "live at the peak, by site"):
        assert section in result.stdout


def test_a_cpu_mode_oom_is_explained_with_the_site_that_held_the_memory(tmp_path: Path) -> None:
    snapshot = tmp_path / "oom.pickle"
    script = textwrap.dedent(f"""
        import torch, stowage
        stowage.enable(device="cpu", capacity="64MiB")
        stowage.record_history(True)
        def hold_activations():
            return [torch.empty(10 << 20, dtype=torch.uint8) for _ in range(4)]
        held = hold_activations()
        try:
            torch.empty(40 << 20, dtype=torch.uint8)
        except torch.OutOfMemoryError:
            pass
        stowage.dump_snapshot({str(snapshot)!r})
    """)
    program = tmp_path / "train.py"
    program.write_text(script)
    made = subprocess.run([sys.executable, str(program)], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    report = inspect_json(snapshot)
    assert len(report["ooms"]) == 1
    oom = report["ooms"][0]
    assert oom["requested"] == 40 << 20
    assert oom["live_bytes"] >= 40 << 20
    line = next(i for i, text in enumerate(script.splitlines(), 1) if "10 << 20" in text)
    assert f"train.py:{line} in " in oom["sites"][0]["site"]
    assert oom["sites"][0]["bytes"] == 40 << 20
    assert oom["stowage_peak_requested"] >= 40 << 20
    text = stowage("inspect", str(snapshot)).stdout
    assert "out of memory" in text and f"train.py:{line}" in text and "what would have helped" in text


def test_hostile_and_malformed_inputs_end_in_a_message(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return (print, ("pwned",))

    cases = {
        "missing.pickle": None,
        "garbage.pickle": b"\x00\x01not a pickle",
        "evil.pickle": pickle.dumps(Evil()),
        "list.pickle": pickle.dumps([1, 2, 3]),
        "empty.pickle": pickle.dumps({"segments": [], "device_traces": []}),
        "badfield.pickle": pickle.dumps({"segments": [{"device": 0, "address": 0, "total_size": "x",
                                                       "blocks": []}], "device_traces": []}),
    }
    for name, content in cases.items():
        path = tmp_path / name
        if content is not None:
            path.write_bytes(content)
        result = stowage("inspect", str(path))
        assert result.returncode == 2, (name, result.stdout, result.stderr)
        assert "stowage inspect:" in result.stderr, (name, result.stderr)
        assert "pwned" not in result.stdout + result.stderr
        assert "Traceback" not in result.stderr, (name, result.stderr)


def test_a_device_without_data_is_refused() -> None:
    result = stowage("inspect", str(TRACES[0]), "--device", "7")
    assert result.returncode == 2
    assert "device 7 has no data" in result.stderr


def _frames(line: int) -> list[dict[str, Any]]:
    return [{"filename": "/home/user/train.py", "line": line, "name": "step"}]


def test_a_torch_oom_event_with_device_free_is_explained(write_snapshot: Any) -> None:
    """torch writes an oom event's free bytes under device_free, with no addr."""
    trace = [
        {"action": "alloc", "addr": 1 << 30, "size": 10 << 20, "stream": 0, "frames": _frames(7)},
        {"action": "oom", "size": 1 << 30, "device_free": 5 << 20, "stream": 0, "frames": _frames(9)},
    ]
    report = inspect_json(write_snapshot({"segments": [], "device_traces": [trace]}))
    oom = report["ooms"][0]
    assert (oom["requested"], oom["device_free"], oom["live_bytes"]) == (1 << 30, 5 << 20, 10 << 20)
    assert oom["sites"][0]["site"] == "/home/user/train.py:7 in step"


def test_a_trace_that_starts_mid_run_never_goes_below_zero(write_snapshot: Any, tmp_path: Path) -> None:
    """A ring buffer that dropped its oldest events: frees of addresses the trace never saw."""
    trace = [{"action": "free_completed", "addr": 4096 * i, "size": 64 << 20, "stream": 0} for i in range(8)]
    trace += [{"action": "alloc", "addr": 1 << 40, "size": 100 << 20, "stream": 0}]
    path = write_snapshot({"segments": [], "device_traces": [trace]})
    report = inspect_json(path)
    peak = report["peak"]
    assert peak["baseline"] == 512 << 20  # at least what was freed of it was live before
    assert peak["live_bytes"] == 512 << 20 and peak["event_index"] == -1
    out = tmp_path / "report.html"
    result = stowage("inspect", str(path), "--html", str(out))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr


def test_many_oom_events_are_counted_and_a_bounded_number_explained(write_snapshot: Any) -> None:
    trace = []
    for i in range(400):
        trace.append({"action": "alloc", "addr": 4096 * i, "size": 1 << 20, "stream": 0})
        trace.append({"action": "oom", "size": 1 << 40, "device_free": 0, "stream": 0})
    report = inspect_json(write_snapshot({"segments": [], "device_traces": [trace]}))
    assert report["oom_events"] == 400
    assert len(report["ooms"]) == 50
    assert report["ooms"][-1]["live_bytes"] == 50 << 20


def test_an_expandable_segment_is_not_held_by_its_one_block(write_snapshot: Any) -> None:
    segment = {"device": 0, "address": 1 << 32, "total_size": 1 << 30, "is_expandable": True,
               "blocks": [{"address": 1 << 32, "size": 2 << 20, "requested_size": 2 << 20,
                           "state": "active_allocated"},
                          {"address": (1 << 32) + (2 << 20), "size": (1 << 30) - (2 << 20), "state": "inactive"}]}
    report = inspect_json(write_snapshot({"segments": [segment], "device_traces": [[]]}))
    assert report["segments"]["held_by_one_small_block"] == []
    fixed = dict(segment, is_expandable=False)
    report = inspect_json(write_snapshot({"segments": [fixed], "device_traces": [[]]}, "fixed.pickle"))
    assert len(report["segments"]["held_by_one_small_block"]) == 1


def test_the_timeline_keeps_its_sample_cap() -> None:
    from stowage.html_report import MAX_POINTS, timeline

    trace = [{"action": "alloc", "addr": 4096 * i, "size": 512, "stream": 0} for i in range(2 * MAX_POINTS - 1)]
    assert len(timeline(trace, 0, [])["x"]) <= MAX_POINTS + 2  # the peak and the last event may add one each
