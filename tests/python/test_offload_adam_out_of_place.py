"""update="in_backward"'s provisional updates are written out of place (Note [Provisional updates
out of place] in python/tensors/host_bucket.hpp): the states torch's optimizer.state shows are the
last step()'s until step() takes the update, the same tensor objects (and views of them) then
showing its results; nothing is copied between the two sets of states but the elements of
parameters without a gradient; random sequences of steps, undone backwards, redone updates and
state_dicts taken between backward and step() stay bit for bit torch's (CPU mode)."""

from __future__ import annotations

import random
import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
from test_offload_adamw import batch, loss_of, make_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_mode_module")

HYPER = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def pair(**options: Any) -> tuple[Any, Any, Any, Any]:
    model, reference = make_model(), make_model()
    hyper = {**HYPER, **options}
    return (model, stowage.offload.AdamW(model.parameters(), **hyper, update="in_backward", bucket_numel=1000),
            reference, torch.optim.AdamW(reference.parameters(), **hyper))


def step_both(pairs: list[tuple[Any, Any]], step: int) -> None:
    for model, optimizer in pairs:
        loss_of(model, batch(step)).backward()
        optimizer.step()
        optimizer.zero_grad()


def assert_bitwise(model: Any, reference: Any, optimizer: Any, ref_optimizer: Any) -> None:
    for a, b in zip(model.parameters(), reference.parameters()):
        assert torch.equal(a, b)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert (p in optimizer.state) == (q in ref_optimizer.state)
        for key, value in ref_optimizer.state.get(q, {}).items():
            assert torch.equal(optimizer.state[p][key], value), key


def test_the_state_shows_the_last_step_until_step_takes_the_update_then_the_same_tensors_show_it() -> None:
    """torch's optimizer changes its states in step() alone, in the tensors it already holds:
    between backward and step() they are the last step's, the updates made in backward notwithstanding."""
    model, optimizer, reference, ref_optimizer = pair(amsgrad=True)
    step_both([(model, optimizer), (reference, ref_optimizer)], 0)
    held = {p: dict(optimizer.state[p]) for p in model.parameters()}  # the tensors, not copies
    before = {p: {k: v.clone() for k, v in entry.items()} for p, entry in held.items()}
    views = {p: held[p]["exp_avg"].view(-1)[:5] for p in model.parameters()}  # a view taken before
    loss_of(model, batch(1)).backward()  # every bucket is updated here, provisionally
    for p in model.parameters():
        for key, value in before[p].items():
            assert torch.equal(optimizer.state[p][key], value), key
    optimizer.step()
    optimizer.zero_grad()
    step_both([(reference, ref_optimizer)], 1)
    assert_bitwise(model, reference, optimizer, ref_optimizer)
    for p, q in zip(model.parameters(), reference.parameters()):
        for key in ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            assert optimizer.state[p][key] is held[p][key], key
        assert torch.equal(views[p], ref_optimizer.state[q]["exp_avg"].view(-1)[:5])


def test_a_provisional_update_copies_nothing_but_parameters_without_a_gradient() -> None:
    model, optimizer, reference, ref_optimizer = pair()
    for step in range(3):
        step_both([(model, optimizer), (reference, ref_optimizer)], step)
    assert optimizer.host_stats()["copied_bytes"] == 0
    assert_bitwise(model, reference, optimizer, ref_optimizer)
    # The first layer's bias without a gradient (frozen for a step): its bucket's update writes the
    # rest, and its elements (fp32 master and two moments) are copied into the second set, unchanged.
    for step in range(3, 5):
        for m, o in ((model, optimizer), (reference, ref_optimizer)):
            m[0].bias.requires_grad_(False)
            loss_of(m, batch(step)).backward()
            o.step()
            o.zero_grad()
            m[0].bias.requires_grad_(True)
        assert_bitwise(model, reference, optimizer, ref_optimizer)
    assert optimizer.host_stats()["copied_bytes"] == 2 * 3 * 4 * model[0].bias.numel()


def test_the_second_set_is_counted_in_the_host_bytes() -> None:
    torch.manual_seed(0)  # parameters of 2^18 elements: every block a multiple of the pool's rounding
    model = torch.nn.Sequential(torch.nn.Linear(512, 512, bias=False), torch.nn.Linear(512, 512, bias=False))
    numel = sum(p.numel() for p in model.parameters())
    per_parameter = stowage.offload.adam.torch_module().bytes_per_parameter(torch.float32, 1, state_sets=2)
    assert per_parameter == 28  # master and moments twice, one gradient buffer
    optimizer = stowage.offload.AdamW(model.parameters(), **HYPER, update="in_backward")
    assert optimizer.host_stats()["allocated_bytes"] == per_parameter * numel
    optimizer.close()


def _raise_in_backward(model: Any) -> Any:
    def fail(*args: Any) -> None:
        raise RuntimeError("planned failure")

    return model[3].register_full_backward_hook(fail)


@pytest.mark.parametrize("seed", range(4))
def test_random_sequences_of_stood_and_undone_updates_stay_torch_s_bit_for_bit(seed: int) -> None:
    """After every event, parameters and states are torch's: a step; a backward thrown away by
    zero_grad(); a backward that raises (the buckets updated before it undone); lr changed between
    backward and step() (the updates redone); a state_dict between backward and step() (undone,
    then made again by step()); a step where a parameter has no gradient."""
    if not stowage._torch.adamw_takes_torch_sqrt():
        pytest.skip("torch here has no MKL: its sqrt is std::sqrt's, and so is the kernel's")
    rng = random.Random(seed)
    model, optimizer, reference, ref_optimizer = pair(amsgrad=seed % 2 == 1)
    both = [(model, optimizer), (reference, ref_optimizer)]
    events = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the redo's warning, once)
        for step in range(14):
            event = rng.choice(["step", "step", "discard", "raise", "lr", "state_dict", "no_grad"])
            events.append(event)
            if event == "discard":
                for m, o in both:
                    loss_of(m, batch(step)).backward()
                    o.zero_grad()
            elif event == "raise":
                handle = _raise_in_backward(model)
                with pytest.raises(RuntimeError, match="planned failure"):
                    loss_of(model, batch(step)).backward()
                handle.remove()
                optimizer.zero_grad()
            else:
                for m, o in both:
                    m[0].bias.requires_grad_(event != "no_grad")
                    loss_of(m, batch(step)).backward()
                    m[0].bias.requires_grad_(True)
                    if event == "lr":
                        o.param_groups[0]["lr"] = HYPER["lr"] * (1 + step % 3)
                    if event == "state_dict" and o is optimizer:
                        saved = o.state_dict()
                        assert all(torch.isfinite(v).all() for entry in saved["state"].values() for v in entry.values())
                    o.step()
                    o.zero_grad()
            assert_bitwise(model, reference, optimizer, ref_optimizer), (seed, events)
