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
    # The peak of the running sum of alloc minus free_completed, plus what was live before.
    running, highest = 0, 0
    for entry in snapshot["device_traces"][device]:
        if entry["action"] == "alloc":
            running += entry["size"]
        elif entry["action"] == "free_completed":
            running -= entry["size"]
        highest = max(highest, running)
    baseline = max(0, allocated - running) if segments else 0
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
