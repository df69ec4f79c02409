"""Saved tensors changed in place between forward and backward: torch raises its "modified by an
inplace operation" error for the tensors it saves itself; under stowage's saved-tensor hooks
(activation offload, offloaded or kept; a plan; the recorder behind stowage.plan.profile and fit) the
same error comes, and an offloaded tensor's storage is still let go (CPU mode)."""

from __future__ import annotations

from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
import stowage.plan  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_mode_module")

INPLACE = "modified by an inplace operation: \\[torch.FloatTensor \\[64, 512\\]\\], which is output 0 of SigmoidBackward0"


def changed_after_forward(hooks: Callable[[], Any]) -> None:
    """Saves sigmoid's output under `hooks`, changes it in place, runs backward."""
    x = torch.randn(64, 512, requires_grad=True)
    with hooks():
        y = x.sigmoid()
        loss = (y * 3).sum()
    y.mul_(2)
    loss.backward()


FRONT_ENDS: dict[str, Callable[[], Any]] = {
    "torch alone": lambda: _nothing(),
    "offload, offloaded": lambda: stowage.offload.activations(min_bytes=0),
    "offload, kept": lambda: stowage.offload.activations(min_bytes=1 << 30),
    "offload, excluded": lambda: stowage.offload.activations(min_bytes=0, exclude=[torch.nn.Identity()]),
}


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *args: Any) -> None:
        return None


@pytest.mark.parametrize("front_end", sorted(FRONT_ENDS))
def test_a_saved_tensor_changed_in_place_raises_torch_s_error(front_end: str) -> None:
    with pytest.raises(RuntimeError, match=INPLACE + ", is at version 1; expected version 0 instead"):
        changed_after_forward(FRONT_ENDS[front_end])
    stowage.offload.end_step()


def test_unchanged_saved_tensors_give_torch_s_gradients_under_every_front_end() -> None:
    x = torch.randn(64, 512, requires_grad=True)
    (x.sigmoid() * 3).sum().backward()
    expected = x.grad.clone()
    for name, hooks in FRONT_ENDS.items():
        x.grad = None
        with hooks():
            loss = (x.sigmoid() * 3).sum()
        loss.backward()
        assert torch.equal(x.grad, expected), name
    stowage.offload.end_step()


def test_the_recorder_behind_profile_raises_it_too() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Sigmoid())
    x = torch.randn(64, 512)

    def step() -> None:
        out = model(x)
        loss = (out * 3).sum()
        out.mul_(2)
        loss.backward()

    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        stowage.plan.profile(step, cost={"to_host_bytes_per_ms": 1e6, "to_device_bytes_per_ms": 1e6,
                                         "prefetch_depth": 2})


def test_an_offloaded_tensor_is_let_go_while_its_version_is_followed() -> None:
    # The check holds the version counter, not the storage: the offload still frees the device.
    x = torch.randn(1024, 1024, requires_grad=True)
    stowage.mark_step()
    start = stowage.memory_allocated("cpu")
    with stowage.offload.activations(min_bytes=0) as report:
        y = x.exp()
        loss = y.sum()
        del y  # (one still referenced as the region ends stays for backward: test_saved_aliases.py)
    stowage.offload.end_step()
    assert report.offloaded_bytes == 4 << 20
    assert stowage.memory_allocated("cpu") - start < 1 << 20  # exp's output left the device
    loss.backward()
    assert torch.equal(x.grad, x.detach().exp())
