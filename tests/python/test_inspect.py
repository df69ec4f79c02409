"""stowage inspect: its figures agree with an independent computation on every recorded trace,
an OOM recorded in CPU mode is explained with the site that held the memory, and hostile or
malformed inputs end in a clear message and a non-zero exit."""

from __future__ import annotations

import json
import pickle
import random
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, SHARED_TRACES, stowage
from stowage import _core
from stowage.inspection.findings import oom_dict, peak_dict
from stowage.inspection.html import timeline_dict
from stowage.snapshot_reader import TraceColumns, load_snapshot, load_snapshot_columnar

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


def test_a_snapshot_from_a_pipe_is_read() -> None:
    """Not a regular file: read, not mapped."""
    result = subprocess.run([sys.executable, "-m", "stowage", "inspect", "/dev/stdin", "--json"],
                            input=(REPO / "bench" / "traces" / "lstm_varlen_3steps.pickle.gz").read_bytes(),
                            capture_output=True)
    assert result.returncode == 0, result.stderr
    expected = inspect_json(REPO / "bench" / "traces" / "lstm_varlen_3steps.pickle.gz")
    assert json.loads(result.stdout) == {**expected, "path": "/dev/stdin"}


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


MAX_POINTS = _core.timeline_max_points


def test_the_timeline_keeps_its_sample_cap() -> None:
    trace = [{"action": "alloc", "addr": 4096 * i, "size": 512, "stream": 0} for i in range(2 * MAX_POINTS - 1)]
    columns = TraceColumns.from_events(trace)
    assert len(timeline(columns, None, 10)["x"]) <= MAX_POINTS + 2  # the peak and the last event may add one each


# --- the columnar analysis against a count with a dict per event ---


_LIBRARY_PARTS = ("site-packages/", "dist-packages/", "/lib/python3", "<frozen ", "/torch/")


def site_of(frames: list[dict[str, Any]] | None, size: int) -> str:
    """A stack's innermost user frame, else its innermost Python frame, else the size class
    (powers of four from 512 B), as `stowage inspect` names sites."""
    python = [f for f in frames or [] if str(f.get("filename", "")).endswith(".py")]
    for frame in [f for f in python if not any(part in str(f["filename"]) for part in _LIBRARY_PARTS)] + python:
        return f"{frame['filename']}:{frame.get('line', 0)} in {frame.get('name', '?')}"
    if size <= 512:
        return "size <= 512 B"
    low = 512
    while low * 4 < size:
        low *= 4
    return f"size {_core.format_bytes(low)}-{_core.format_bytes(low * 4)}"


def _ranked_sites(by_site: dict[str, int], counts: dict[str, int], pre_trace: int,
                  top: int) -> list[dict[str, Any]]:
    rows = [{"site": site, "bytes": total, "allocations": counts[site]}
            for site, total in by_site.items() if total > 0]
    if pre_trace > 0:
        rows.append({"site": "(live before the trace began)", "bytes": pre_trace, "allocations": 0})
    return sorted(rows, key=lambda row: row["bytes"], reverse=True)[:top]


def counted_with_dicts(trace: list[dict[str, Any]], requested_at_end: int | None, top: int) -> dict[str, Any]:
    """The peak, its sites and the OOMs as analyse_trace defines them, counted event by event
    with dicts from address to size (as the inspector did before it read columns)."""
    sizes: dict[int, int] = {}
    own = unknown = best = 0
    best_index = -1
    for index, entry in enumerate(trace):
        if entry["action"] == "alloc":
            sizes[entry["addr"]] = entry["size"]
            own += entry["size"]
        elif entry["action"] == "free_completed":
            if entry["addr"] in sizes:
                own -= sizes.pop(entry["addr"])
            else:
                unknown += entry["size"]
        else:
            continue
        if own - unknown > best:
            best, best_index = own - unknown, index
    baseline = max(unknown if requested_at_end is None else requested_at_end - own + unknown, unknown, 0)
    live: dict[int, tuple[str, int]] = {}
    by_site: dict[str, int] = defaultdict(int)
    counts: dict[str, int] = defaultdict(int)
    freed = 0
    peak_sites = _ranked_sites({}, counts, baseline, top)
    ooms = []
    for index, entry in enumerate(trace):
        if entry["action"] == "alloc":
            site = site_of(entry.get("frames"), entry["size"])
            live[entry["addr"]] = (site, entry["size"])
            by_site[site] += entry["size"]
            counts[site] += 1
        elif entry["action"] == "free_completed":
            found = live.pop(entry["addr"], None)
            if found is None:
                freed += entry["size"]
            else:
                by_site[found[0]] -= found[1]
                counts[found[0]] -= 1
        elif entry["action"] == "oom":
            ooms.append({"event_index": index, "requested": entry.get("size", 0),
                         "device_free": entry.get("device_free", entry.get("addr", 0)),
                         "live_bytes": baseline - freed + sum(by_site.values()),
                         "sites": _ranked_sites(by_site, counts, baseline - freed, top)})
        if index == best_index:
            peak_sites = _ranked_sites(by_site, counts, baseline - freed, top)
    return {"live_bytes": baseline + best, "event_index": best_index, "baseline": baseline,
            "time_us": trace[best_index].get("time_us") if best_index >= 0 else None,
            "sites": peak_sites, "ooms": ooms[:50], "oom_events": len(ooms)}


def inspected(trace: TraceColumns, requested_at_end: int | None, top: int) -> _core.Findings:
    """The findings of stowage._core.inspect (with timelines), with segments whose live blocks
    asked for `requested_at_end` bytes (None: no segments)."""
    segments = [] if requested_at_end is None else [
        {"address": 0, "total_size": requested_at_end,
         "blocks": [{"size": requested_at_end, "requested_size": requested_at_end, "state": "active_allocated"}]}]
    return _core.inspect(trace, segments, top, False, None, 0, timelines=True)


def timeline(trace: TraceColumns, requested_at_end: int | None, top: int) -> dict[str, Any]:
    """The findings' timeline by site (the peak's first eight sites by name, the rest "other")."""
    return timeline_dict(inspected(trace, requested_at_end, top).timelines.by_site)


def analysed(trace: TraceColumns, requested_at_end: int | None, top: int) -> dict[str, Any]:
    found = inspected(trace, requested_at_end, top)
    fields = ("event_index", "requested", "device_free", "live_bytes", "sites")
    counted = {key: value for key, value in peak_dict(found.peak, trace).items()
               if key not in ("categories", "modules")}  # (tested on their own)
    return {**counted, "ooms": [{key: oom_dict(oom)[key] for key in fields} for oom in found.ooms],
            "oom_events": found.oom_events}


def timeline_with_dicts(trace: list[dict[str, Any]], baseline: int, named: list[str]) -> dict[str, Any]:
    """The findings' timeline by site counted event by event, `named` sites by name."""
    events = [(i, e) for i, e in enumerate(trace) if e["action"] in ("alloc", "free_completed")]
    if not events:
        return {"x": [], "series": {}, "peak_index": -1}
    k_of = {site: k for k, site in enumerate(named)}
    other, before = len(named), len(named) + 1
    live: dict[int, tuple[int, int]] = {}
    running = [0] * (len(named) + 2)
    running[before] = baseline
    rows = []
    for _, entry in events:
        if entry["action"] == "alloc":
            k = k_of.get(site_of(entry.get("frames"), entry["size"]), other)
            live[entry["addr"]] = (k, entry["size"])
            running[k] += entry["size"]
        elif entry["addr"] in live:
            k, size = live.pop(entry["addr"])
            running[k] -= size
        else:
            running[before] -= entry["size"]
        rows.append(list(running))
    totals = [sum(row[:before]) + row[before] for row in rows]
    peak_at = max(range(len(totals)), key=totals.__getitem__)
    stride = max(1, -(-len(events) // MAX_POINTS))
    chosen = [p for p in range(len(events)) if p % stride == 0 or p in (peak_at, len(events) - 1)]
    series: dict[str, list[int]] = {}
    if baseline:
        series["(live before the trace began)"] = [max(rows[p][before], 0) for p in chosen]
    series.update({site: [rows[p][k] for p in chosen] for site, k in k_of.items()})
    series["other"] = [rows[p][other] for p in chosen]
    return {"x": [events[p][0] for p in chosen], "series": series, "peak_index": events[peak_at][0]}


def requested_at_end(snapshot: dict[str, Any], device: int) -> int | None:
    segments = [s for s in snapshot["segments"] if s.get("device", 0) == device]
    return sum(b.get("requested_size", b["size"]) for s in segments for b in s.get("blocks", [])
               if b.get("state") == "active_allocated") if segments else None


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_the_columnar_analysis_counts_as_dicts_do_on_every_recorded_trace(path: Path) -> None:
    whole, streamed = load_snapshot(path), load_snapshot_columnar(path)
    for device, trace in enumerate(whole["device_traces"]):
        columns = streamed["device_traces"][device]
        requested = requested_at_end(whole, device)
        expected = counted_with_dicts(trace, requested, 10)
        assert analysed(columns, requested, 10) == expected
        named = [s["site"] for s in expected["sites"] if not s["site"].startswith("(")][:8]
        assert timeline(columns, requested, 10) == timeline_with_dicts(trace, expected["baseline"], named)


def random_trace(seed: int) -> list[dict[str, Any]]:
    """Addresses reused, allocated twice without a free, freed without an allocation; sizes of
    0, at size-class edges and huge (sums past int64); frames absent, None, empty, without user
    code or with it; OOM events with device_free or addr; events the analysis skips."""
    rng = random.Random(seed)
    frames = [{"filename": f"/home/u/train{i}.py", "line": i, "name": f"f{i}"} for i in range(5)]
    frames += [{"filename": "/usr/lib/python3/site-packages/torch/x.py", "line": 3, "name": "lib"},
               {"filename": "??", "line": 0, "name": "cpp"}]
    stacks = [rng.sample(frames, rng.randint(1, 3)) for _ in range(6)] + [[frames[6]], [frames[6], frames[5]]]
    huge = seed % 5 == 0
    addresses = [4096 * rng.randint(1, 60) for _ in range(40)]
    trace: list[dict[str, Any]] = []
    for _ in range(rng.randint(0, 3000 if huge else 1500)):
        r = rng.random()
        action = ("alloc" if r < 0.45 else "free_completed" if r < 0.85 else "oom" if r < 0.88
                  else rng.choice(["free_requested", "segment_alloc", "segment_free"]))
        entry: dict[str, Any] = {"action": action, "stream": 0}
        if action == "oom":
            entry.update({"size": rng.randint(1, 1 << 34)}, **({"device_free": rng.randint(0, 1 << 30)}
                                                              if rng.random() < 0.5 else {"addr": 77}))
        else:
            entry["addr"] = rng.choice(addresses) if rng.random() < 0.9 else 4096 * rng.randint(1, 1 << 30)
            entry["size"] = ((1 << 50) - rng.randint(1, 9) if huge else
                             rng.choice([0, 1, 512, 513, 2048, 2049, rng.randint(1, 1 << 30)]))
        if rng.random() < 0.7:
            entry["time_us"] = len(trace) * 3 if rng.random() < 0.9 else len(trace) / 2
        choice = rng.random()
        if choice < 0.6:
            entry["frames"] = rng.choice(stacks)
        elif choice < 0.7:
            entry["frames"] = rng.choice([[], None])
        trace.append(entry)
    return trace


@pytest.mark.parametrize("seed", range(40))
def test_the_columnar_analysis_counts_as_dicts_do_on_random_traces(seed: int) -> None:
    trace = random_trace(seed)
    columns = TraceColumns.from_events(trace)
    requested = None if seed % 3 else sum(e["size"] for e in trace if e["action"] == "alloc") // 3
    expected = counted_with_dicts(trace, requested, 5 + seed % 7)
    assert analysed(columns, requested, 5 + seed % 7) == expected
    named = [s["site"] for s in expected["sites"] if not s["site"].startswith("(")][:8]
    assert timeline(columns, requested, 5 + seed % 7) == timeline_with_dicts(trace, expected["baseline"], named)


def test_live_bytes_past_int64_are_counted_exactly() -> None:
    """Sizes below 2**50 each, 10,000 of them live together: 2**63.3 bytes."""
    trace = [{"action": "alloc", "addr": 4096 * i, "size": (1 << 50) - 1, "stream": 0,
              "frames": [{"filename": "/home/u/train.py", "line": i % 3, "name": "f"}]} for i in range(10_000)]
    trace.append({"action": "oom", "size": 1, "device_free": 0})
    columns = TraceColumns.from_events(trace)
    expected = counted_with_dicts(trace, None, 3)
    assert expected["live_bytes"] == 10_000 * ((1 << 50) - 1) > 2**63
    assert analysed(columns, None, 3) == expected
    assert sum(series[-1] for series in timeline(columns, None, 3)["series"].values()) == expected["live_bytes"]


def test_the_memory_benchmark_runs_in_its_smoke_mode() -> None:
    """bench/inspect/memory_ratio.py, on a small synthetic snapshot."""
    result = subprocess.run([sys.executable, str(REPO / "bench" / "inspect" / "memory_ratio.py"), "--smoke"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "resident / file" in result.stdout
