"""The inspector cuts a trace into steps (at stowage's step marks, or where a stock trace's
allocations repeat), keeps stowage.fit's own trial steps out of the run's peak, and names what
grows from one step to the next."""

from __future__ import annotations

from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
from stowage.inspection.findings import inspect_device  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_mode_module")

STEPS = 5


def recorded(run: Callable[[], None]) -> dict[str, Any]:
    stowage.record_history(True)
    try:
        run()
        return stowage.snapshot()
    finally:
        stowage.record_history(False)


def mlp() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU()) for _ in range(4)),
                               torch.nn.Linear(256, 4))


def train(model: Any, steps: int, kept: list[Any] | None = None) -> None:
    optimizer = torch.optim.AdamW(model.parameters())
    rows = torch.randn(512, 256, generator=torch.Generator().manual_seed(0))
    for _ in range(steps):
        loss = model(rows).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if kept is not None:
            kept.append(model(rows[:64]))  # an output kept across steps, its graph with it
        stowage.mark_step()


def test_steps_are_cut_at_the_marks_and_fit_s_trial_steps_kept_out_of_the_run_s_peak() -> None:
    model = mlp()
    rows = torch.randn(2048, 256)

    def run() -> None:
        start = stowage.memory_allocated()
        fitted = stowage.fit(model, lambda params: torch.optim.AdamW(params), rows, verbose=False,
                             loss_fn=lambda m, batch: m(batch).square().mean(), budget=start + (24 << 20))
        for _ in range(STEPS):
            fitted.step(rows)
            stowage.mark_step()

    report = inspect_device(recorded(run), 0, 5)
    run_steps = [step for step in report["steps"] if not step["fit_trial"]]
    assert report["steps_found_by"] == "marks" and len(run_steps) == STEPS
    assert any(step["fit_trial"] for step in report["steps"])
    trial = report["fit_trial_peak"]
    assert trial is not None and trial["live_bytes"] > report["peak"]["live_bytes"]  # fit's unplanned recording
    assert not any(step["fit_trial"] and step["first_event"] <= report["peak"]["event_index"] <= step["last_event"]
                   for step in report["steps"])
    assert max(step["peak_bytes"] for step in run_steps) == report["peak"]["live_bytes"]


def test_a_trace_without_marks_is_cut_where_its_allocations_repeat() -> None:
    snapshot = recorded(lambda: train(mlp(), STEPS))
    trace = [event for event in snapshot["device_traces"][0] if "user_metadata" not in event]  # as stock torch's
    snapshot.pop("stowage_tags")
    report = inspect_device({**snapshot, "device_traces": [trace]}, 0, 5)
    assert report["steps_found_by"] == "repeating allocations"
    assert STEPS - 2 <= len(report["steps"]) <= STEPS + 1
    peaks = [step["peak_bytes"] for step in report["steps"][1:-1]]
    assert peaks and max(peaks) - min(peaks) <= max(peaks) // 20  # alike steps, alike peaks


def test_memory_kept_across_steps_is_named_by_its_site() -> None:
    kept: list[Any] = []
    report = inspect_device(recorded(lambda: train(mlp(), 6, kept)), 0, 5)
    assert report["growing"], report["steps"]
    assert "test_inspect_steps.py" in report["growing"][0]["site"] and report["growing"][0]["bytes_per_step"] > 0
    plain = inspect_device(recorded(lambda: train(mlp(), 6)), 0, 5)
    assert plain["growing"] == []
