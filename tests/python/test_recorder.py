"""The recorder captures every CPU allocation and free of a real PyTorch workload, in order."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from stowage.profiler_snapshot import profiled_snapshot, save_snapshot  # noqa: E402
from stowage.snapshot_reader import load_snapshot  # noqa: E402


def test_allocation_count_and_peak_match_a_count_by_hand(tmp_path) -> None:
    # Each step creates 5 tensors of 1000 float32 (4000 bytes each), keeps them all, then
    # drops them: 5 allocations, a peak of 20,000 bytes more than before the step, 5 frees.
    def step(index: int) -> None:
        held = [torch.empty(1000, dtype=torch.float32) for _ in range(5)]
        del held

    snapshot = profiled_snapshot(step, 3)
    trace = snapshot["device_traces"][0]
    allocs = [e for e in trace if e["action"] == "alloc" and e["size"] == 4000]
    frees = [e for e in trace if e["action"] == "free_completed" and e["size"] == 4000]
    assert len(allocs) == 15
    assert len(frees) == 15
    live = peak = 0
    for entry in trace:
        if entry["action"] == "alloc":
            live += entry["size"]
        elif entry["action"] == "free_completed":
            live -= entry["size"]
        peak = max(peak, live)
    assert peak == 20_000
    assert live == 0
    # Each step ends with the mark stowage.mark_step() writes, after that step's frees.
    marks = [index for index, e in enumerate(trace) if e["action"] == "snapshot"]
    assert len(marks) == 3
    assert all(trace[index]["user_metadata"] == "stowage.mark_step" for index in marks)
    frees_before = [sum(1 for e in trace[:index] if e["action"] == "free_completed" and e["size"] == 4000)
                    for index in marks]
    assert frees_before == [5, 10, 15]

    path = tmp_path / "steps.pickle.gz"
    save_snapshot(snapshot, path)
    assert load_snapshot(path) == snapshot
    result = subprocess.run([sys.executable, "-m", "stowage", "replay", str(path), "--json"],
                            capture_output=True, text=True)
    replayed = json.loads(result.stdout)
    assert replayed["allocs"] == len([e for e in trace if e["action"] == "alloc"])
    assert replayed["peak_requested"] == 20_000
    assert replayed["skipped_frees"] == 0
    assert len(replayed["steps"]) == 3


def test_a_training_step_frees_what_it_allocates() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.AdamW(model.parameters())

    def step(index: int) -> None:
        model(torch.randn(32, 64)).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    trace = profiled_snapshot(step, 3)["device_traces"][0]
    allocated = {e["addr"] for e in trace if e["action"] == "alloc"}
    # Every free in the trace is of an address allocated earlier in it, except tensors made
    # before recording began (none here: the model's parameters are never freed).
    live: set[int] = set()
    for entry in trace:
        if entry["action"] == "alloc":
            live.add(entry["addr"])
        elif entry["action"] == "free_completed":
            assert entry["addr"] in live or entry["addr"] not in allocated
            live.discard(entry["addr"])
    assert len(allocated) > 10
