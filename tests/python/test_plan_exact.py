"""A plan's recomputation computes what the step computes without it (Note [Selective recompute]):
BatchNorm's statistics and counter are updated once, a block that adds to its input in place is
recomputed from the input it saw, several backwards through one graph each recompute, and a
tensor a recomputed block reads, changed in place before backward, raises torch's error
(CPU mode)."""

from __future__ import annotations

import copy
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import stowage  # noqa: E402
import stowage.plan  # noqa: E402
from stowage.plan import Decision, Plan  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_mode_module")

COST = {"to_host_bytes_per_ms": 1e6, "to_device_bytes_per_ms": 1e6, "prefetch_depth": 2}


class Block(nn.Module):
    def __init__(self, channels: int, momentum: float | None, in_place_input: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn = nn.BatchNorm2d(channels, momentum=momentum)
        self.relu = nn.ReLU(inplace=True)
        self.in_place_input = in_place_input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.in_place_input:
            x.mul_(0.5)  # the input written in place: the replay must see it as the forward did
        out = self.bn(self.conv(x))
        out += x
        # (scaled: the next block writes its input, which nothing before it may have saved)
        return self.relu(out) * 1.0 if self.in_place_input else self.relu(out)


class Net(nn.Module):
    def __init__(self, in_place_input: bool = False) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.blocks = nn.Sequential(*[Block(16, None if i % 2 else 0.1, in_place_input) for i in range(4)])
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


def recomputing_plan(model: Any, step: Callable[[Any], None], profiled: Any = None) -> Plan:
    """Every block that can be recomputed recomputed (full checkpointing), from a profile of a copy
    of the model (or of `profiled`)."""
    probe = copy.deepcopy(profiled if profiled is not None else model)
    profile = stowage.plan.profile(lambda: step(probe), cost=COST, model=probe)
    full = [Decision.recompute if t.recomputable else Decision.keep for t in profile.tensors]  # full checkpointing
    plan = Plan(profile, full, profile.unconstrained_peak_bytes)
    plan.model = model
    return plan


def make(in_place_input: bool = False) -> tuple[Any, Any, Callable[[Any], None]]:
    torch.manual_seed(0)
    model = Net(in_place_input)
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    return model, copy.deepcopy(model), lambda m: nn.functional.cross_entropy(m(images), labels).backward()


def assert_equal(model: Any, reference: Any) -> None:
    for (name, a), b in zip(model.named_buffers(), reference.buffers()):
        assert torch.equal(a, b), name
    for (name, a), b in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(a.grad, b.grad), name


@pytest.mark.parametrize("in_place_input", [False, True], ids=["plain", "input written in place"])
def test_recomputed_blocks_update_batchnorm_once_and_give_torch_s_gradients(in_place_input: bool) -> None:
    model, reference, step = make(in_place_input)
    plan = recomputing_plan(model, step)
    # A block writing its input in place is left out of recomputation (the profile sees it).
    assert plan.decisions.count(Decision.recompute) == (0 if in_place_input else 5)
    for _ in range(3):
        with plan:
            step(model)
        step(reference)
        assert_equal(model, reference)
    assert not plan.mismatches
    assert int(model.blocks[1].bn.num_batches_tracked) == 3


def planned_loss(model: Any, plan: Plan) -> tuple[torch.Tensor, Callable[[Any], torch.Tensor]]:
    """A loss whose forward ran under `plan`, and the same loss for another model."""
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    loss_of = lambda m: nn.functional.cross_entropy(m(images), labels)  # noqa: E731
    with plan:
        loss = loss_of(model)
    return loss, loss_of


def test_each_of_several_backwards_through_one_graph_recomputes() -> None:
    model, reference, step = make()
    loss, loss_of = planned_loss(model, recomputing_plan(model, step))
    loss.backward(retain_graph=True)
    loss.backward()
    expected = loss_of(reference)
    expected.backward(retain_graph=True)
    expected.backward()
    assert_equal(model, reference)


def test_a_parameter_changed_in_place_before_the_recompute_raises_torch_s_error() -> None:
    model, _, step = make()
    loss, _ = planned_loss(model, recomputing_plan(model, step))
    with torch.no_grad():
        model.blocks[2].conv.weight.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation.*block 'blocks.2'"):
        loss.backward()


def test_a_block_that_writes_its_input_only_when_planned_is_refused_as_it_leaves() -> None:
    model, _, step = make(in_place_input=True)
    plan = recomputing_plan(model, step, profiled=make()[0])  # profiled without the write
    with pytest.raises(RuntimeError, match="block 'blocks.0' wrote its input in place"):
        with plan:
            step(model)
    assert not plan._active


def test_a_tensor_a_recomputed_block_made_and_took_changed_after_it_raises_torch_s_error() -> None:
    model, reference, step = make()
    plan = recomputing_plan(model, step)
    for m in (reference, model):  # the conv's output, which the block's BatchNorm took (and saved)
        captured: list[torch.Tensor] = []
        handle = m.blocks[1].conv.register_forward_hook(lambda mod, args, out: captured.append(out))
        loss, _ = planned_loss(m, plan) if m is model else (
            nn.functional.cross_entropy(m(torch.randn(8, 3, 32, 32)), torch.randint(0, 10, (8,))), None)
        handle.remove()
        with torch.no_grad():
            captured[0].add_(1.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()
