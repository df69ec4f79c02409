"""stowage.fit changes nothing training computes: the factory's optimizer options cross to the
offloaded twin (or the factory's optimizer stays, and the table says why), and recording the step
leaves the model's buffers, gradients and the random streams as they were (CPU mode)."""

from __future__ import annotations

from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
import test_fit  # noqa: E402
from test_fit import COST, HYPER, LARGE_STATES, loss_fn  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_mode_module")


def model_and_batch() -> tuple[Any, torch.Tensor]:
    """A model whose AdamW states cannot stay on the device under tight_budget()."""
    return test_fit.model_and_batch(LARGE_STATES)


def tight_budget() -> int:
    """Room for what is in use, gradients, half the step and fit's margin (8 pages)."""
    model, tokens = model_and_batch()
    stowage.mark_step()
    in_use = stowage.memory_allocated()
    stowage.reset_peak_stats()
    loss_fn(model, tokens).backward()
    step_bytes = stowage.max_memory_allocated() - in_use
    parameters = sum(p.numel() * 4 for p in model.parameters())
    return in_use + parameters + step_bytes // 2 + (16 << 20)


def trained(factory: Callable[[Any], Any], steps: int, budget: int | None) -> tuple[list[torch.Tensor], Any]:
    """Parameters after `steps` steps, through fit (a budget) or plain torch (None), and fit's result."""
    model, tokens = model_and_batch()
    if budget is None:
        optimizer, fitted = factory(list(model.parameters())), None
        run = lambda: (loss_fn(model, tokens).backward(), optimizer.step(), optimizer.zero_grad())  # noqa: E731
    else:
        fitted = stowage.fit(model, factory, tokens, loss_fn=loss_fn, budget=budget, cost=COST, verbose=False)
        run = lambda: fitted.step(tokens)  # noqa: E731
    for _ in range(steps):
        run()
    return [p.detach().clone() for p in model.parameters()], fitted


FACTORIES: dict[str, tuple[Callable[[Any], Any], str]] = {
    "AdamW maximize": (lambda ps: torch.optim.AdamW(ps, **HYPER, maximize=True), "AdamW"),
    "AdamW amsgrad": (lambda ps: torch.optim.AdamW(ps, **HYPER, amsgrad=True), "AdamW"),
    "Adam with L2": (lambda ps: torch.optim.Adam(ps, **HYPER), "Adam"),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_every_option_of_the_factory_s_optimizer_crosses_to_the_host(name: str) -> None:
    factory, twin = FACTORIES[name]
    ours, fitted = trained(factory, 3, tight_budget())
    assert fitted.device_fraction < 1.0
    assert type(fitted.optimizer) is getattr(stowage.offload, twin)
    made = factory([torch.nn.Parameter(torch.zeros(1))]).param_groups[0]
    for key in ("maximize", "amsgrad", "weight_decay", "betas", "decoupled_weight_decay"):
        assert fitted.optimizer.param_groups[0][key] == made[key], key
    theirs, _ = trained(factory, 3, None)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_an_optimizer_without_a_host_twin_stays_and_the_table_says_why(capsys: Any) -> None:
    model, tokens = model_and_batch()
    fitted = stowage.fit(model, lambda ps: torch.optim.AdamW(ps, **HYPER, differentiable=True), tokens,
                         loss_fn=loss_fn, cost=COST)
    assert type(fitted.optimizer) is torch.optim.AdamW and fitted.device_fraction == 1.0
    assert "kept on the device: differentiable=True" in capsys.readouterr().out


class Noisy(torch.nn.Module):
    """BatchNorm (running statistics, a counter) and dropout (the random stream)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16),
                                        torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Conv2d(16, 16, 3),
                                        torch.nn.BatchNorm2d(16, momentum=None))
        self.head = torch.nn.Linear(16, 4)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(images).mean(dim=(2, 3)))


def test_recording_the_step_leaves_buffers_gradients_and_random_streams_as_they_were() -> None:
    torch.manual_seed(3)
    model = Noisy()
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 4, (8,))
    loss = lambda m, batch: torch.nn.functional.cross_entropy(m(batch[0]), batch[1])  # noqa: E731
    buffers = [b.clone() for b in model.buffers()]
    model.head.weight.grad = torch.ones_like(model.head.weight)
    rng = torch.get_rng_state()
    stowage.fit(model, lambda ps: torch.optim.AdamW(ps, **HYPER), (images, labels), loss_fn=loss, cost=COST,
                verbose=False)
    assert all(torch.equal(a, b) for a, b in zip(model.buffers(), buffers))
    assert torch.equal(model.head.weight.grad, torch.ones_like(model.head.weight))
    assert all(p.grad is None for p in model.body.parameters())
    assert torch.equal(torch.get_rng_state(), rng)
    assert model.training


def test_a_model_with_frozen_parameters_fits_and_trains_as_torch() -> None:
    def frozen(model: Any) -> Any:
        for name, parameter in model.named_parameters():
            parameter.requires_grad_("blocks.0" not in name and "embed" not in name)
        return model

    def run(budget: int | None) -> list[torch.Tensor]:
        model, tokens = model_and_batch()
        frozen(model)
        factory = lambda ps: torch.optim.AdamW(ps, **HYPER)  # noqa: E731
        if budget is None:
            optimizer = factory(list(model.parameters()))
            step = lambda: (loss_fn(model, tokens).backward(), optimizer.step(), optimizer.zero_grad())  # noqa: E731
        else:
            fitted = stowage.fit(model, factory, tokens, loss_fn=loss_fn, budget=budget, cost=COST, verbose=False)
            step = lambda: fitted.step(tokens)  # noqa: E731
        for _ in range(3):
            step()
        return [p.detach().clone() for p in model.parameters()]

    for a, b in zip(run(tight_budget()), run(None)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
