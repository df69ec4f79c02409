"""The inspector says what each live byte at the peak is (snapshot/categories.hpp), inferred from the
stacks and lifetimes a snapshot records: on a recorded CPU-mode training loop the parameters, the
optimizer's states and the input are found to the byte, the saved activations and gradients by
their lifetimes; a trace without Python frames is all unknown, not guessed."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
from stowage.inspection.findings import inspect, inspect_device, report_of  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_mode_module")


def recorded_training(steps: int = 3) -> tuple[dict[str, Any], int, int]:
    stowage.record_history(True)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU())
                                      for _ in range(4)), torch.nn.Linear(256, 4))
        optimizer = torch.optim.AdamW(model.parameters())
        rows = torch.randn(512, 256)
        for _ in range(steps):
            model(rows).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            stowage.mark_step()
        return stowage.snapshot(), sum(p.numel() * 4 for p in model.parameters()), rows.numel() * 4
    finally:
        stowage.record_history(False)


def test_the_peak_s_bytes_are_told_apart_by_what_they_are() -> None:
    snapshot, parameters, inputs = recorded_training()
    peak = inspect_device(snapshot, 0, 5)["peak"]
    found = peak["categories"]
    assert found["parameters"] == parameters
    assert 2 * parameters <= found["optimizer states"] <= 2 * parameters + 4096  # two moments, and step counts
    assert inputs <= found["inputs"] <= inputs + 4096
    # the peak is where backward begins: the four hidden layers' saved inputs and outputs
    assert found["activations"] >= 4 * inputs
    assert sum(found.values()) == peak["live_bytes"] - peak["baseline"]
    assert found.get("unknown", 0) == 0


def test_a_trace_without_python_frames_is_unknown_not_guessed() -> None:
    snapshot, _, _ = recorded_training(2)
    trace = [{key: value for key, value in event.items() if key != "frames"} for event in snapshot["device_traces"][0]]
    snapshot.pop("stowage_tags")  # as stock torch writes it
    peak = inspect_device({**snapshot, "device_traces": [trace]}, 0, 5)["peak"]
    assert set(peak["categories"]) == {"unknown"}


def test_the_html_report_leads_with_the_categories_and_lists_the_steps() -> None:
    from stowage.inspection.html import render

    snapshot, _, _ = recorded_training()
    found, trace = inspect(snapshot, 0, 5, timelines=True)
    html = render("loop", report_of(snapshot, 0, found, trace), snapshot, found)
    assert html.index("by what it is") < html.index("Live memory by allocation site")
    assert "optimizer states" in html and "steps (3, found by marks)" in html
