"""stowage.offload.Adam / AdamW do what torch's would in the loops people write: every option
of torch's update, writes through ``.data``, replaced and dropped gradients, frozen and unfrozen
parameters, a backward that raises, sparse gradients and bad state_dicts (CPU mode)."""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
from test_offload_adamw import batch, loss_of, make_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_mode_module")

HYPER = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
MODES = ["exact", "in_backward", "delayed"]


def pair(torch_class: Any = torch.optim.AdamW, ours: Any = None, update: str = "exact",
         **options: Any) -> tuple[Any, Any, Any, Any]:
    """(model, offloaded optimizer, reference model, torch's optimizer) from one seed."""
    ours = ours or getattr(stowage.offload, torch_class.__name__)
    model, reference = make_model(), make_model()
    hyper = {**HYPER, **options}
    return (model, ours(model.parameters(), **hyper, update=update, bucket_numel=1000),
            reference, torch_class(reference.parameters(), **hyper))


def one_step(model: Any, optimizer: Any, step: int, before_step: Callable[[Any], None] | None = None) -> None:
    loss_of(model, batch(step)).backward()
    if before_step is not None:
        before_step(model)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def assert_same(model: Any, reference: Any, optimizer: Any = None, ref_optimizer: Any = None) -> None:
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=2e-6, atol=2e-7)
    if optimizer is None:
        return
    ours, theirs = optimizer.state_dict()["state"], ref_optimizer.state_dict()["state"]
    assert sorted(ours) == sorted(theirs)
    for index in theirs:
        for key, value in theirs[index].items():
            torch.testing.assert_close(ours[index][key].float(), value.float(), rtol=2e-6, atol=2e-7)


@pytest.mark.parametrize("options", [dict(maximize=True), dict(amsgrad=True), dict(maximize=True, amsgrad=True)])
@pytest.mark.parametrize("update", ["exact", "in_backward"])
def test_maximize_and_amsgrad_follow_torch(options: dict[str, Any], update: str) -> None:
    model, optimizer, reference, ref_optimizer = pair(update=update, **options)
    for step in range(5):
        one_step(model, optimizer, step)
        one_step(reference, ref_optimizer, step)
    assert_same(model, reference, optimizer, ref_optimizer)


@pytest.mark.parametrize("options", [dict(), dict(decoupled_weight_decay=True), dict(amsgrad=True)])
def test_adam_with_its_l2_penalty_follows_torch_adam(options: dict[str, Any]) -> None:
    model, optimizer, reference, ref_optimizer = pair(torch.optim.Adam, **options)
    for step in range(5):
        one_step(model, optimizer, step)
        one_step(reference, ref_optimizer, step)
    assert_same(model, reference, optimizer, ref_optimizer)
    into_torch = torch.optim.Adam(copy.deepcopy(model).parameters(), **HYPER, **options)
    into_torch.load_state_dict(optimizer.state_dict())  # the same format both ways


WRITES: dict[str, Callable[[Any], None]] = {
    "fill_": lambda p: p.data.fill_(0.01),
    "clamp_": lambda p: p.data.clamp_(-0.02, 0.02),
    "assigned": lambda p: setattr(p, "data", p.data * 0.5),
    "copy_": lambda p: p.data.copy_(torch.full_like(p, 0.003)),
    "one ulp": lambda p: p.data.view(-1)[:1].copy_(torch.nextafter(p.data.view(-1)[:1], torch.ones(1))),
}


@pytest.mark.parametrize("write", sorted(WRITES))
@pytest.mark.parametrize("update", ["exact", "in_backward"])
def test_a_write_through_data_between_steps_wins(write: str, update: str) -> None:
    model, optimizer, reference, ref_optimizer = pair(update=update)
    for step in range(4):
        for m, o in ((model, optimizer), (reference, ref_optimizer)):
            one_step(m, o, step)
            if step % 2 == 0:
                for p in m.parameters():
                    WRITES[write](p)
    assert_same(model, reference, optimizer, ref_optimizer)


def test_delayed_updates_drop_the_pending_update_of_a_written_parameter() -> None:
    weight = torch.nn.Parameter(torch.ones(3000))
    optimizer = stowage.offload.AdamW([weight], **HYPER, update="delayed", bucket_numel=1000)
    (weight * 2).sum().backward()
    optimizer.step()  # update 1 pending, the weight still ones
    optimizer.zero_grad()
    weight.data.fill_(0.25)  # the write wins over the pending update
    (weight * 2).sum().backward()
    optimizer.step()
    assert torch.equal(weight.detach(), torch.full_like(weight, 0.25))
    optimizer.flush()  # update 2, from the written value
    assert (weight.detach() < 0.25).all() and (weight.detach() > 0.2).all()
    assert int(optimizer.state[weight]["step"]) == 2


GRADIENT_EDITS: dict[str, Callable[[Any], None]] = {
    "replaced": lambda m: [setattr(p, "grad", p.grad * 0.5) for p in m.parameters()],
    "zeroed in place": lambda m: [p.grad.zero_() for p in list(m.parameters())[:2]],
    "written through .data": lambda m: [p.grad.data.clamp_(-1e-3, 1e-3) for p in m.parameters()],
    "dropped": lambda m: [setattr(p, "grad", None) for p in list(m.parameters())[:3]],
}


@pytest.mark.parametrize("edit", sorted(GRADIENT_EDITS))
def test_the_gradient_present_at_step_is_the_one_used(edit: str) -> None:
    model, optimizer, reference, ref_optimizer = pair()
    for step in range(3):
        one_step(model, optimizer, step, GRADIENT_EDITS[edit])
        one_step(reference, ref_optimizer, step, GRADIENT_EDITS[edit])
    assert_same(model, reference, optimizer, ref_optimizer)


@pytest.mark.parametrize("edit", sorted(GRADIENT_EDITS))
def test_in_backward_refuses_a_gradient_edited_after_backward_and_applies_nothing(edit: str) -> None:
    model, optimizer, reference, ref_optimizer = pair(update="in_backward")
    one_step(model, optimizer, 0)
    one_step(reference, ref_optimizer, 0)
    with pytest.raises(RuntimeError, match="in_backward"):
        one_step(model, optimizer, 1, GRADIENT_EDITS[edit])
    optimizer.zero_grad()
    assert_same(model, reference, optimizer, ref_optimizer)  # the refused step changed nothing
    one_step(model, optimizer, 2)
    one_step(reference, ref_optimizer, 2)
    assert_same(model, reference, optimizer, ref_optimizer)


def _noise(p: Any) -> torch.Tensor:
    generator = torch.Generator().manual_seed(p.numel())
    return torch.randn(p.shape, generator=generator) * 1e-3


def _in_place(edit: Callable[[Any], Any]) -> Callable[[Any], None]:
    def hook(p: Any) -> None:
        edit(p)
    return hook


HOOKS_AFTER: dict[str, Callable[[Any], None]] = {
    "scaled in place": _in_place(lambda p: p.grad.mul_(0.5)),
    "zeroed in place": _in_place(lambda p: p.grad.mul_(0)),
    "noise added": _in_place(lambda p: p.grad.add_(_noise(p))),
    "replaced": _in_place(lambda p: setattr(p, "grad", p.grad.clamp(-1e-3, 1e-3))),
    "written through .data": _in_place(lambda p: p.grad.data.mul_(2.0)),
    "dropped": _in_place(lambda p: setattr(p, "grad", None) if p.dim() == 1 else None),
}


@pytest.mark.parametrize("hook", sorted(HOOKS_AFTER))
@pytest.mark.parametrize("update", ["exact", "in_backward"])
def test_a_gradient_changed_by_a_hook_registered_after_the_optimizer_is_the_one_used(hook: str, update: str) -> None:
    """The post-accumulate hooks registered after the optimizer's run before its copy: in_backward
    too updates from the gradient they leave, with no copy again and no refusal."""
    model, optimizer, reference, ref_optimizer = pair(update=update)
    for m in (model, reference):
        for p in m.parameters():
            p.register_post_accumulate_grad_hook(HOOKS_AFTER[hook])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "copies them out again", no redone update
        for step in range(3):
            one_step(model, optimizer, step)
            one_step(reference, ref_optimizer, step)
    assert_same(model, reference, optimizer, ref_optimizer)


@pytest.mark.parametrize("hook_after", [False, True])
def test_in_backward_updates_a_bucket_as_its_gradients_arrive_unless_hooks_follow_the_optimizer_s(
        hook_after: bool) -> None:
    """Without a hook after the optimizer's, the last layer's bucket is updated from its own
    hook, before the first layer's gradient is made; with one, once that hook has run (at the
    next parameter's arrival), and the update is the same."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8, bias=False), torch.nn.Linear(8, 8, bias=False))
    reference = copy.deepcopy(model)
    optimizer = stowage.offload.AdamW(model.parameters(), **HYPER, update="in_backward", bucket_numel=64)
    assert optimizer._slots.bucket_count == 2
    if hook_after:
        model[1].weight.register_post_accumulate_grad_hook(_in_place(lambda p: p.grad.mul_(2.0)))
    last_layer = optimizer._index[model[1].weight]  # its slot, and its bucket: one parameter a bucket
    seen: list[bool] = []
    model[0].weight.register_hook(lambda grad: seen.append(optimizer._slots.updated(last_layer)))
    ref_optimizer = torch.optim.AdamW(reference.parameters(), **HYPER)
    for m, o in ((model, optimizer), (reference, ref_optimizer)):
        m(torch.ones(2, 8)).square().sum().backward()
        if o is ref_optimizer and hook_after:
            m[1].weight.grad.mul_(2.0)
        o.step()
    assert seen == [not hook_after]
    assert_same(model, reference, optimizer, ref_optimizer)


@pytest.mark.parametrize("update", ["exact", "in_backward", "delayed"])
def test_a_gradient_changed_after_its_copy_by_another_parameter_s_hook_is_seen_at_step(update: str) -> None:
    """The first layer's weight, last in backward, has a hook shifting the last layer's bias's
    gradient, copied out long before: exact and delayed copy it again at step() (held to the
    same edit made after backward); in_backward, whose update already read it, refuses with
    nothing applied."""
    model, optimizer, reference, ref_optimizer = pair(update=update)
    model[0].weight.register_post_accumulate_grad_hook(_in_place(lambda p: model[5].bias.grad.add_(1e-2)))
    if update == "in_backward":
        with pytest.raises(RuntimeError, match="in_backward.*changed afterwards"):
            one_step(model, optimizer, 0)
        optimizer.zero_grad()
        assert_same(model, reference)
        return
    if update == "delayed":
        ref_optimizer = stowage.offload.AdamW(reference.parameters(), **HYPER, update=update, bucket_numel=1000)
    for step in range(3):
        one_step(model, optimizer, step)
        one_step(reference, ref_optimizer, step, lambda m: m[5].bias.grad.add_(1e-2))
    for o in (optimizer, ref_optimizer):
        o.state_dict()  # (delayed: the pending update written back)
    assert_same(model, reference)


def test_options_changed_between_backward_and_step_are_the_ones_used_in_backward_redoing_its_updates() -> None:
    model, optimizer, reference, ref_optimizer = pair(update="in_backward")
    schedulers = [torch.optim.lr_scheduler.OneCycleLR(o, max_lr=1e-2, total_steps=6, cycle_momentum=True,
                                                      base_momentum=0.85, max_momentum=0.95)
                  for o in (optimizer, ref_optimizer)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(4):
            for m, o, scheduler in ((model, optimizer, schedulers[0]), (reference, ref_optimizer, schedulers[1])):
                loss_of(m, batch(step)).backward()
                scheduler.step()  # lr and beta1 change after backward, before step()
                if step == 2:
                    o.param_groups[0]["weight_decay"] = 0.05
                    o.param_groups[0]["eps"] = 1e-6
                o.step()
                o.zero_grad()
            assert_same(model, reference, optimizer, ref_optimizer)
    redone = [w for w in caught if "changed between backward and step()" in str(w.message)]
    assert len(redone) == 1, [str(w.message) for w in caught]


def test_frozen_parameters_take_no_hook_no_state_and_join_when_unfrozen() -> None:
    model, reference = make_model(), make_model()
    for m in (model, reference):
        for p in m[0].parameters():
            p.requires_grad_(False)
    optimizer = stowage.offload.AdamW(model.parameters(), **HYPER, bucket_numel=1000)
    ref_optimizer = torch.optim.AdamW(reference.parameters(), **HYPER)
    frozen_numel = sum(p.numel() for p in model[0].parameters())
    trainable_numel = sum(p.numel() for p in model.parameters()) - frozen_numel
    stats = optimizer.host_stats()  # 8 B a parameter of states (update="exact"), besides the staging ring
    assert stats["allocated_bytes"] - stats["staging_bytes"] < (trainable_numel + frozen_numel // 2) * 8
    for step in range(4):
        if step == 2:
            for m in (model, reference):
                m[0].weight.requires_grad_(True)
        one_step(model, optimizer, step)
        one_step(reference, ref_optimizer, step)
        assert_same(model, reference, optimizer, ref_optimizer)
    assert model[0].bias not in optimizer.state


@pytest.mark.parametrize("update", MODES)
@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_step_that_raises_leaves_every_mode_ready_for_the_next(update: str, where: str) -> None:
    model, optimizer, reference, ref_optimizer = pair(update=update)
    if update == "delayed":
        ref_optimizer = None  # compared with the same run without the failure

    def failing_run(m: Any, o: Any) -> None:
        for step in range(4):
            if step == 1:
                handle = _raise_once(m, where)
                with pytest.raises(RuntimeError, match="planned failure"):
                    loss_of(m, batch(step)).backward()
                handle.remove()
                o.zero_grad()
                continue
            one_step(m, o, step)

    failing_run(model, optimizer)
    if ref_optimizer is None:
        reference_optimizer = stowage.offload.AdamW(reference.parameters(), **HYPER, update=update, bucket_numel=1000)
        for step in (0, 2, 3):
            one_step(reference, reference_optimizer, step)
        optimizer.flush()
        reference_optimizer.flush()
        assert_same(model, reference)
        return
    failing_run(reference, ref_optimizer)
    assert_same(model, reference, optimizer, ref_optimizer)


def _raise_once(model: Any, where: str) -> Any:
    """A hook on the model's middle layer that raises in forward or in backward."""
    layer = model[3]

    def fail(*args: Any) -> None:
        raise RuntimeError("planned failure")

    if where == "forward":
        return layer.register_forward_hook(fail)
    return layer.register_full_backward_hook(fail)


@pytest.mark.parametrize("update", ["exact", "in_backward"])
def test_zero_grad_without_step_skips_the_step_as_torch_does(update: str) -> None:
    model, optimizer, reference, ref_optimizer = pair(update=update)
    for m, o in ((model, optimizer), (reference, ref_optimizer)):
        one_step(m, o, 0)
        loss_of(m, batch(1)).backward()  # a step thrown away (a NaN loss, say)
        o.zero_grad()
        one_step(m, o, 2)
    assert_same(model, reference, optimizer, ref_optimizer)


@pytest.mark.parametrize("update", ["exact", "in_backward"])
def test_a_sparse_gradient_is_refused_naming_the_parameter(update: str) -> None:
    """As torch's Adam refuses one: at step() with update="exact" (nothing is read before it),
    as the gradient arrives in the modes that copy it out in backward."""
    embedding = torch.nn.Embedding(100, 8, sparse=True)
    optimizer = stowage.offload.AdamW(embedding.parameters(), update=update)
    with pytest.raises(RuntimeError, match=r"parameter 0 \(group 0, shape \[100, 8\]\) has a sparse gradient"):
        embedding(torch.tensor([1, 2, 3])).sum().backward()
        optimizer.step()
    assert embedding.weight not in optimizer.state  # nothing applied
    embedding.weight.grad = None
    dense = torch.nn.Embedding(100, 8)
    dense_optimizer = stowage.offload.AdamW(dense.parameters())
    dense(torch.tensor([1, 2])).sum().backward()
    dense_optimizer.step()
    assert int(dense_optimizer.state[dense.weight]["step"]) == 1


BAD_ENTRIES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "nan step": (lambda e: e.update(step=torch.tensor(float("nan"))), "'step' is nan"),
    "huge step": (lambda e: e.update(step=torch.tensor(1e30)), "'step' is 1.0000000150474662e\\+30"),
    "2**63 step": (lambda e: e.update(step=2 ** 63), "'step' is 9223372036854775808"),
    "negative step": (lambda e: e.update(step=-1), "'step' is -1"),
    "fractional step": (lambda e: e.update(step=1.5), "'step' is 1.5"),
    "negative second moment": (lambda e: e["exp_avg_sq"].fill_(-1.0), "'exp_avg_sq' holds negative values"),
    "wrong shape": (lambda e: e.update(exp_avg=torch.zeros(3)), "'exp_avg' has 3 elements"),
    "not a tensor": (lambda e: e.update(exp_avg_sq="zeros"), "no tensor 'exp_avg_sq'"),
}


@pytest.mark.parametrize("bad", sorted(BAD_ENTRIES))
def test_a_bad_state_dict_is_refused_whole_naming_the_field(bad: str) -> None:
    model, optimizer, _, _ = pair()
    one_step(model, optimizer, 0)
    saved = copy.deepcopy(optimizer.state_dict())
    before = copy.deepcopy(optimizer.state_dict())
    damage, message = BAD_ENTRIES[bad]
    damage(saved["state"][2])
    saved["state"][0]["step"] = torch.tensor(7.0)  # an earlier entry, good: must not be taken either
    with pytest.raises(ValueError, match=r"parameter 2 \(group 0, shape \[64\]\): " + message):
        optimizer.load_state_dict(saved)
    after = optimizer.state_dict()
    for index, entry in before["state"].items():
        for key, value in entry.items():
            assert torch.equal(after["state"][index][key], value), (index, key)
    one_step(model, optimizer, 1)  # and it trains on
    assert all(math.isfinite(float(p.detach().abs().max())) for p in model.parameters())


@pytest.mark.parametrize("options", [dict(), dict(amsgrad=True, maximize=True)])
@pytest.mark.parametrize("torch_class", [torch.optim.AdamW, torch.optim.Adam])
def test_the_host_update_is_bit_for_bit_torch_s_on_this_cpu(torch_class: Any, options: dict[str, Any]) -> None:
    # Note [torch's roundings]: every op rounded where torch's CPU AdamW rounds, its own sqrt too.
    if not stowage._torch.adamw_takes_torch_sqrt():
        pytest.skip("torch here has no MKL: its sqrt is std::sqrt's, and so is the kernel's")
    model, optimizer, reference, ref_optimizer = pair(torch_class, **options)
    for step in range(5):
        one_step(model, optimizer, step)
        one_step(reference, ref_optimizer, step)
    for a, b in zip(model.parameters(), reference.parameters()):
        assert torch.equal(a, b)
    ours, theirs = optimizer.state_dict()["state"], ref_optimizer.state_dict()["state"]
    for index in theirs:
        for key in theirs[index]:
            assert torch.equal(ours[index][key], theirs[index][key]), (index, key)
