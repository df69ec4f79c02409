"""stowage.fit choosing where the model's blocks' parameters live (README's "Fitting a larger
model"): forced to the host (offload_parameters=True) or chosen there by "auto" where the device
holds no other option, the table says so with each option's device and host bytes, the step is
torch's bit for bit, and fitted.close() puts the parameters back on the device; a host too small
is named in the refusal."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
import stowage.fitting.choosing as choosing  # noqa: E402
from stowage.models.llama import Llama, LlamaShape  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_mode_module")

COST = {"to_host_bytes_per_ms": 8e6, "to_device_bytes_per_ms": 8e6, "prefetch_depth": 2}
# Blocks large beside the embeddings and the activations: their parameters and gradients (about
# 12.6 MiB each) fill a small device whatever share of the states stays on it.
SHAPE = LlamaShape(hidden=256, layers=4, heads=4, kv_heads=2, vocab=256, max_sequence=32)
HYPER = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
MiB = 1 << 20


def loss_fn(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    return model.chunked_loss(tokens, chunks=2)


def model_and_batch() -> tuple[Any, torch.Tensor]:
    torch.manual_seed(0)
    return Llama(SHAPE), torch.randint(0, SHAPE.vocab, (2, 32), generator=torch.Generator().manual_seed(1))


def adamw(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, **HYPER)  # type: ignore[arg-type]


def sgd(params: Any) -> torch.optim.Optimizer:  # no offloaded twin: the factory's optimizer steps the host parameters
    return torch.optim.SGD(params, lr=0.1)


def reference_parameters(steps: int, factory: Any = adamw) -> list[torch.Tensor]:
    model, tokens = model_and_batch()
    optimizer = factory(model.parameters())
    for _ in range(steps):
        loss_fn(model, tokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return [p.detach().clone() for p in model.parameters()]


def fitted_with(capsys: Any, factory: Any = adamw, **options: Any) -> tuple[Any, Any, torch.Tensor, str]:
    model, tokens = model_and_batch()
    fitted = stowage.fit(model, factory, tokens, loss_fn=loss_fn, cost=COST, **options)
    return fitted, model, tokens, capsys.readouterr().out


def block_bytes(model: Any) -> int:
    return sum(p.numel() * p.element_size() for p in model.blocks.parameters())


def train_and_compare(fitted: Any, model: Any, tokens: torch.Tensor, steps: int = 2, factory: Any = adamw) -> None:
    for _ in range(steps):
        fitted.step(tokens)
    for mine, reference in zip(model.parameters(), reference_parameters(steps, factory)):
        assert torch.equal(mine.detach().cpu(), reference)


def test_forced_to_the_host_the_table_says_so_the_step_is_torch_s_and_close_puts_them_back(capsys: Any) -> None:
    fitted, model, tokens, table = fitted_with(capsys, offload_parameters=True)
    assert fitted.parameters_on_host and fitted.chosen.parameters_on_host
    # The offloaded twin updates the blocks' parameters where they live (the host kernel), the rest's
    # states on the device: torch's whole share.
    assert type(fitted.optimizer) is stowage.offload.AdamW and fitted.optimizer.device_fraction == 1.0
    assert "stowage.offload.adam.AdamW" in table
    assert "  parameters on the host" in table and "of the model's 4 blocks: they live on the host" in table
    assert "fitted.close() puts them back" in table
    header = next(line for line in table.splitlines() if line.lstrip().startswith("states on the device"))
    assert "parameters" in header and "device memory" in header and "host memory" in header
    rows = [line for line in table.splitlines() if line.rstrip().endswith("<- chosen")]
    assert len(rows) == 1 and " host " in rows[0]
    # Between steps the device no longer holds the blocks' parameters.
    held = stowage.memory_allocated()
    train_and_compare(fitted, model, tokens)
    block = next(model.blocks.parameters())
    assert not stowage.serving.torch_module().cpu_owns(fitted.optimizer.state[block]["exp_avg"])  # host memory
    fitted.close()
    assert not fitted.parameters_on_host
    assert stowage.memory_allocated() >= held + block_bytes(model)
    fitted.close()  # a second close changes nothing


def test_auto_keeps_them_on_the_host_only_where_the_device_holds_no_other_option(capsys: Any) -> None:
    roomy, _, _, _ = fitted_with(capsys, offload_parameters="auto")  # a roomy device: nothing moves
    assert not roomy.parameters_on_host
    assert all(not o.parameters_on_host or o.step_ms >= roomy.chosen.step_ms * 0.97 for o in roomy.options if o.feasible)
    del roomy
    # fit keeps 16 MiB free: 18 MiB usable, below the parameters and their gradients (25 MiB).
    budget = stowage.memory_allocated() + 34 * MiB
    with pytest.raises(torch.OutOfMemoryError, match="does not fit"):  # parameters on the device
        fitted_with(capsys, sgd, budget=budget, offload_parameters=False)
    fitted, model, tokens, table = fitted_with(capsys, sgd, budget=budget, offload_parameters="auto")
    feasible = [o for o in fitted.options if o.feasible]
    assert feasible and all(o.parameters_on_host for o in feasible), table
    assert fitted.parameters_on_host and type(fitted.optimizer) is torch.optim.SGD  # no twin: the factory's
    train_and_compare(fitted, model, tokens, factory=sgd)
    fitted.close()


def test_with_adamw_auto_moves_them_and_their_states_to_the_host_where_the_device_holds_no_other_option(
        capsys: Any) -> None:
    # The offloaded twin keeps the blocks' states in host memory, which CPU mode's device does not count.
    budget = stowage.memory_allocated() + 34 * MiB
    fitted, model, tokens, table = fitted_with(capsys, budget=budget, offload_parameters="auto")
    assert fitted.parameters_on_host and type(fitted.optimizer) is stowage.offload.AdamW, table
    assert fitted.chosen.device_state_bytes < 4 * MiB  # the embeddings' and norms' states alone
    train_and_compare(fitted, model, tokens)
    fitted.close()


def test_by_default_they_move_only_where_no_option_fits_with_them_on_the_device(capsys: Any) -> None:
    roomy, _, _, _ = fitted_with(capsys)  # a roomy device: the host is not even weighed
    assert not roomy.parameters_on_host and not any(o.parameters_on_host for o in roomy.options)
    del roomy
    budget = stowage.memory_allocated() + 34 * MiB  # below the parameters and their gradients, as above
    fitted, model, tokens, table = fitted_with(capsys, budget=budget)
    assert fitted.parameters_on_host and type(fitted.optimizer) is stowage.offload.AdamW, table
    train_and_compare(fitted, model, tokens)
    fitted.close()


def test_a_host_too_small_for_them_is_named_in_the_refusal(capsys: Any) -> None:
    model, tokens = model_and_batch()
    with pytest.raises(torch.OutOfMemoryError) as refused:
        stowage.fit(model, adamw, tokens, loss_fn=loss_fn, cost=COST, offload_parameters=True, host_budget="8MiB")
    said = str(refused.value)
    assert "the blocks' parameters on the host" in said
    assert "the host cannot hold the offloaded parameters, gradients and states" in said
    assert "the host is what bounds the step: it would need" in said


def test_offload_parameters_takes_none_true_false_or_auto() -> None:
    model, tokens = model_and_batch()
    said = r"offload_parameters is None \(the default\), True, False or 'auto', not 'yes'"
    with pytest.raises(ValueError, match=said):
        stowage.fit(model, lambda params: torch.optim.AdamW(params), tokens, loss_fn=loss_fn, cost=COST,
                    offload_parameters="yes")


def test_the_blocks_cross_to_the_host_once_the_trial_s_handle_kept_for_training(monkeypatch: Any,
                                                                               capsys: Any) -> None:
    opened: list[Any] = []

    def counted(model: Any, units: Any = None, prefetch: int = 1) -> Any:
        opened.append(stowage.offload.parameters(model, units, prefetch))
        return opened[-1]

    monkeypatch.setattr(choosing, "offloaded_parameters", counted)
    fitted, model, tokens, _ = fitted_with(capsys, offload_parameters=True)
    assert len(opened) == 1 and fitted.offloaded_parameters is opened[0] and not opened[0].closed
    train_and_compare(fitted, model, tokens)
    fitted.close()


def test_gradients_held_before_fit_are_there_after_it_with_the_blocks_on_the_host(capsys: Any) -> None:
    model, tokens = model_and_batch()
    loss_fn(model, tokens).backward()  # a loop that accumulated before it called fit
    held = {name: p.grad.clone() for name, p in model.named_parameters()}
    fitted = stowage.fit(model, adamw, tokens, loss_fn=loss_fn, cost=COST, offload_parameters=True, verbose=False)
    assert fitted.parameters_on_host
    for name, param in model.named_parameters():
        assert torch.equal(param.grad, held[name]), name
    fitted.close()


def test_fit_raising_after_its_trial_leaves_no_parameter_on_the_host(monkeypatch: Any, capsys: Any) -> None:
    fit_module = importlib.import_module("stowage.fitting.fit")  # (the package's `fit` is the function)

    def refused(*args: Any) -> Any:
        raise RuntimeError("refused after the trial")

    monkeypatch.setattr(fit_module, "_training_optimizer", refused)
    model, tokens = model_and_batch()
    with pytest.raises(RuntimeError, match="refused after the trial"):
        stowage.fit(model, adamw, tokens, loss_fn=loss_fn, cost=COST, offload_parameters=True, verbose=False)
    # the trial's handle was closed: the parameters are the model's again and can be offloaded anew
    home_device = importlib.import_module("stowage.offload.parameters").home_device
    assert all(home_device(p) is None for p in model.parameters())
    stowage.offload.parameters(model).close()
