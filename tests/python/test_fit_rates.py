"""fit's update rates (Note [Update rates] in planner/fit_weighing.hpp): the device's timed with the
implementation torch's optimizer will run there (the factory's class and flags), with a time a
tensor beside the time an element, and fit's predicted update built from them: on a model of many
small tensors, where torch's CPU for-loop spends most of its update a tensor at a time, the
prediction follows what the step takes (within 10x: a busy 2-core machine's timings vary; the
benchmark measures how close)."""

from __future__ import annotations

import importlib
import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
from stowage.fitting import measuring  # noqa: E402
from stowage.fitting.measuring import measure_rates, probe_optimizer, rates_from  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_mode_module")


def test_the_probe_runs_the_factorys_class_and_flags() -> None:
    weight = torch.nn.Parameter(torch.ones(4))
    for flags in ({"foreach": False}, {"foreach": True}, {"fused": True}):
        factory = torch.optim.Adam([weight], lr=3e-4, betas=(0.8, 0.9), **flags)  # type: ignore[arg-type]
        probe = probe_optimizer(factory)([torch.nn.Parameter(torch.ones(8))])
        assert type(probe) is torch.optim.Adam
        group = probe.param_groups[0]
        assert group["lr"] == 3e-4 and group["betas"] == (0.8, 0.9)
        assert {key: group[key] for key in flags} == flags
    sgd = probe_optimizer(torch.optim.SGD([weight], lr=0.1, momentum=0.9))([torch.nn.Parameter(torch.ones(8))])
    assert type(sgd) is torch.optim.SGD and sgd.param_groups[0]["momentum"] == 0.9


def test_the_rates_are_an_element_and_a_tensor_of_the_implementation_that_runs() -> None:
    # torch's CPU for-loop runs about a dozen ops a tensor: tens of microseconds a tensor, beside
    # nanoseconds an element (on a busy host the larger probe's parallel ops stall: no ratio here).
    factory = torch.optim.AdamW([torch.nn.Parameter(torch.ones(4))], foreach=False)
    rates = measure_rates(torch.device("cpu"), torch.float32, factory, [1 << 16] * 16)
    assert rates.device_ms_per_tensor > 0.002 and rates.device_ms_per_parameter > 0
    # The host's and the offloaded step's lines (a Python call a tensor, stalls and all) are measured.
    assert rates.host_ms_per_tensor * 16 + rates.host_ms_per_parameter * (1 << 20) > 0
    assert rates.streamed_ms_per_tensor * 16 + rates.streamed_ms_per_parameter * (1 << 20) > 0


class Timed:
    """A probe run that takes `ms` by the (fake) clock."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self) -> None:
        pass


def test_the_rates_line_goes_through_both_differences(monkeypatch: Any) -> None:
    # A made-up update taking 0.03 ms a tensor and 2e-6 ms an element: both come back, and neither
    # goes below zero where the larger probe gains nothing on the smaller ones.
    monkeypatch.setattr(measuring, "best_seconds", lambda run, synchronize, repeats: run.ms / 1e3)
    per_element, per_tensor = rates_from(lambda sizes: Timed(0.03 * len(sizes) + 2e-6 * sum(sizes)), lambda: None,
                                         1 << 16, 8)
    assert per_tensor == pytest.approx(0.03) and per_element == pytest.approx(2e-6)
    per_element, per_tensor = rates_from(lambda sizes: Timed(0.03 * len(sizes)), lambda: None, 1 << 16, 8)
    assert per_tensor == pytest.approx(0.03) and per_element == pytest.approx(0.0, abs=1e-12)


def many_small_layers() -> tuple[Any, torch.Tensor]:
    torch.manual_seed(0)
    layers = [module for _ in range(96) for module in (torch.nn.Linear(16, 16), torch.nn.Tanh())]
    return torch.nn.Sequential(*layers), torch.randn(4, 16)


def fit_small_layers(**flags: Any) -> Any:
    model, batch = many_small_layers()
    return stowage.fit(model, lambda params: torch.optim.AdamW(params, lr=1e-3, **flags), batch,
                       loss_fn=lambda model, batch: model(batch).square().mean(), verbose=False,
                       offload_optimizer=False, offload_parameters=False), batch


Seen = list[tuple[Any, Any, Any]]  # what fit measured its rates with (optimizer, numels) and the rates


def recording_rates(monkeypatch: Any) -> Seen:
    fit_module = importlib.import_module("stowage.fitting.fit")  # (stowage.fitting.fit is the function)
    seen: Seen = []

    def recorded(device: Any, dtype: Any, optimizer: Any = None, numels: Any = None) -> Any:
        seen.append((optimizer, numels, measure_rates(device, dtype, optimizer, numels)))
        return seen[-1][2]

    monkeypatch.setattr(fit_module, "measure_rates", recorded)
    return seen


def test_fit_predicts_the_update_from_the_rates_of_the_factorys_implementation(monkeypatch: Any) -> None:
    seen = recording_rates(monkeypatch)
    fitted, _ = fit_small_layers(foreach=False)
    (optimizer, numels, rates), = seen
    assert type(optimizer) is torch.optim.AdamW and optimizer.defaults["foreach"] is False
    assert numels == [p.numel() for p in fitted.model.parameters()]
    assert fitted.device_fraction == 1.0
    elements = sum(numels)
    expected = elements * rates.device_ms_per_parameter + len(numels) * rates.device_ms_per_tensor
    assert fitted.chosen.update_ms == pytest.approx(expected, rel=1e-9)


def test_the_predicted_update_follows_a_for_loop_over_many_small_tensors(monkeypatch: Any) -> None:
    # 192 tensors of 16 or 256 elements: torch's CPU AdamW (a for-loop) takes its time a tensor at a
    # time. A rate an element alone (the fused probe's, on one large tensor) predicted it 100x low.
    # The probes' best times against the steps' best (a busy machine slows both alike at best).
    seen = recording_rates(monkeypatch)
    fitted, batch = fit_small_layers()
    assert type(fitted.optimizer) is torch.optim.AdamW
    rates = seen[0][2]
    update_ms = []
    for _ in range(7):
        fitted.backward(batch)
        start = time.perf_counter()
        fitted.optimizer.step()
        update_ms.append((time.perf_counter() - start) * 1e3)
        fitted.optimizer.zero_grad(set_to_none=True)
    best = min(update_ms[1:])
    # Within 10x either way (the benchmark measures how close: bench/results/2026-11-29-cpu-fit-
    # prediction.md): a probe or the steps slowed by a busy host stay inside; 100x low does not.
    assert best / 10 < fitted.chosen.update_ms < best * 10, (
        fitted.chosen.update_ms, update_ms, rates.device_ms_per_parameter, rates.device_ms_per_tensor)
