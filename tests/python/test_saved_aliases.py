"""Saved activations written through ``.data`` (an alias whose writes bump no version) between
forward and backward. torch's saved tensor aliases the storage, so its backward reads the written
bytes; stowage's offload reads a storage still alive in place (and keeps those still referenced as
an activations region ends), and a plan refuses to recompute a block from what was written since
its forward (Note [Saved tensors written through an alias] in
python/tensors/saved_storage.hpp; Note [Selective recompute] in
stowage/plan/recompute_modes.py). CPU mode; check mode in fresh processes."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
import time
import warnings
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
import stowage.plan  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_mode_module")

COST = {"to_host_bytes_per_ms": 8e6, "to_device_bytes_per_ms": 8e6, "prefetch_depth": 2}


class Block(torch.nn.Module):
    """Linear, GELU, Linear: the GELU's output is saved by the second Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.act, self.down = torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 256)

    def forward(self, x: Any) -> Any:
        return self.down(self.act(self.up(x)))


class Blocks(torch.nn.Module):
    """Two blocks, which a plan may recompute, and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(2))
        self.head = torch.nn.Linear(256, 8)

    def forward(self, x: Any) -> Any:
        for block in self.blocks:
            x = block(x)
        return self.head(x).square().mean()


def make_model() -> tuple[Blocks, Any]:
    torch.manual_seed(0)
    return Blocks(), torch.randn(128, 256)


def gradients(model: Blocks, batch: Any, region: Callable[[], Any], written: str, *, inside: bool = False,
              let_go: bool = False) -> dict[str, Any]:
    """One step under `region` (around forward, or around forward and backward with `inside`),
    the output of module `written` kept by a forward hook and written through .data after
    forward (then let go of before backward with `let_go`); the gradients."""
    model.zero_grad(set_to_none=True)
    captured: list[Any] = []
    handle = model.get_submodule(written).register_forward_hook(lambda m, a, out: captured.append(out))
    try:
        with region():
            loss = model(batch)
            handle.remove()
            if inside:
                captured[0].data.add_(0.5)
                if let_go:
                    captured.clear()
                loss.backward()
        if not inside:
            captured[0].data.add_(0.5)
            if let_go:
                captured.clear()
            loss.backward()
    finally:
        handle.remove()
        stowage.mark_step()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def plain() -> Any:
    return contextlib.nullcontext()


def offloading() -> Any:
    return stowage.offload.activations(min_bytes=0)


def assert_same(expected: dict[str, Any], got: dict[str, Any]) -> None:
    differing = [name for name in expected if not torch.equal(expected[name], got[name])]
    assert not differing, f"gradients differ from torch's: {differing}"


@pytest.mark.parametrize("let_go", [False, True], ids=["kept", "let go after the region"])
def test_a_write_after_the_offload_region_is_what_backward_reads(let_go: bool) -> None:
    model, batch = make_model()
    expected = gradients(model, batch, plain, "blocks.0.act", let_go=let_go)
    regions: list[Any] = []

    def region() -> Any:
        regions.append(offloading())
        return regions[-1]

    assert_same(expected, gradients(model, batch, region, "blocks.0.act", let_go=let_go))
    report = regions[0].report
    assert report.offloaded_bytes > 0
    # referenced as the region ended, so kept for backward: the batch and the hook's tensor
    assert report.held_elsewhere_bytes == 2 * 128 * 256 * 4


def test_a_write_inside_a_region_around_backward_is_read_while_the_reference_lives() -> None:
    model, batch = make_model()
    expected = gradients(model, batch, plain, "blocks.1.act", inside=True)
    assert_same(expected, gradients(model, batch, offloading, "blocks.1.act", inside=True))


def test_a_storage_still_alive_is_read_in_place_without_copying_it_back() -> None:
    model, batch = make_model()

    def reloads(hooked: str | None) -> int:
        before = stowage.offload.stats().get("offload.num_reloads", 0)
        with stowage.offload.activations(min_bytes=0, prefetch=0):  # each comes back when used
            captured: list[Any] = []
            module = model.get_submodule(hooked) if hooked else None
            handle = module.register_forward_hook(lambda m, a, out: captured.append(out)) if module else None
            loss = model(batch)
            if handle is not None:
                handle.remove()
            time.sleep(1.0)  # the copies complete: a storage nobody holds then comes back from its copy
            loss.backward()
        stowage.mark_step()
        return int(stowage.offload.stats()["offload.num_reloads"] - before)

    # the GELU's output, held by the hook through backward, is read where it is; the first Linear's
    # output (GELU's input) and the head's (the square's input) are held the same way, so the runs
    # differ by nothing else; with nothing held, every saved storage comes back from its copy
    held = reloads("blocks.0.up")
    assert reloads("blocks.0.act") == held
    assert reloads("head") == held
    assert reloads(None) == held + 1


def recorded_plans(model: Blocks, batch: Any) -> dict[str, stowage.plan.Plan]:
    def step() -> None:
        model(batch).backward()
        model.zero_grad(set_to_none=True)

    trace = stowage.plan.profile(step, cost=COST, model=model)
    stowage.mark_step()
    keep, offload, recompute = stowage.plan.Decision.keep, stowage.plan.Decision.offload, stowage.plan.Decision.recompute
    recompute = [recompute if t.recomputable else offload if t.offloadable else keep for t in trace.tensors]
    offload = [offload if t.offloadable else keep for t in trace.tensors]
    plans = {"recompute": stowage.plan.Plan(trace, recompute, trace.unconstrained_peak_bytes),
             "offload": stowage.plan.Plan(trace, offload, trace.unconstrained_peak_bytes)}
    for plan in plans.values():
        plan.model = model
    return plans


def test_a_plan_offloading_everything_gives_torch_s_gradients_after_the_write() -> None:
    model, batch = make_model()
    plan = recorded_plans(model, batch)["offload"]
    for written in ("blocks.0.act", "blocks.0"):
        expected = gradients(model, batch, plain, written, inside=True)
        assert_same(expected, gradients(model, batch, lambda: plan, written, inside=True))


@pytest.mark.parametrize("written, what", [
    ("blocks.1.act", "the storage of [torch.FloatTensor [128, 256]], which its forward made"),
    ("blocks.0", "[torch.FloatTensor [128, 256]], which its forward read,"),
], ids=["made in the block", "the next block's input"])
def test_a_plan_refuses_to_recompute_a_block_from_what_was_written_since(written: str, what: str) -> None:
    model, batch = make_model()
    plan = recorded_plans(model, batch)["recompute"]
    with pytest.raises(RuntimeError) as raised:
        gradients(model, batch, lambda: plan, written, inside=True)
    message = str(raised.value)
    # (the first block is not recomputed: its input needs no gradient)
    assert message.startswith(f"stowage.plan: block 'blocks.1' is recomputed in backward, and {what}"), message
    assert "written after the block's forward through .data" in message


def test_a_plan_recomputing_gives_torch_s_gradients_when_nothing_is_written() -> None:
    model, batch = make_model()
    plan = recorded_plans(model, batch)["recompute"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.zero_grad(set_to_none=True)
        model(batch).backward()
        expected = {name: p.grad.clone() for name, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        with plan:
            model(batch).backward()
        stowage.mark_step()
    assert_same(expected, {name: p.grad for name, p in model.named_parameters()})


def test_a_plan_refuses_a_parameter_given_another_storage_between_forward_and_backward() -> None:
    model, batch = make_model()
    plan = recorded_plans(model, batch)["recompute"]
    weight = model.blocks[1].up.weight
    kept = weight.data
    with pytest.raises(RuntimeError, match="block 'blocks.1' is recomputed in backward, and "
                                           r"\[torch.FloatTensor \[256, 256\]\], which its forward read, was given "
                                           "another storage after it"):
        with plan:
            loss = model(batch)
            weight.data = weight.data * 0.5
            loss.backward()
    weight.data = kept
    model.zero_grad(set_to_none=True)
    stowage.mark_step()


CHECKED = """
import time
import torch, stowage
stowage.enable(device="cpu", capacity="1GiB", check=True)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 256), torch.nn.Tanh(),
                            torch.nn.Linear(256, 8))
batch = torch.randn(128, 256)
def step(offload, let_go):
    captured = []
    handle = model[1].register_forward_hook(lambda m, a, out: captured.append(out))
    # The copies of what forward saved complete before it returns, so that the storage let go of
    # comes back from its copy (read in place while the offloader still holds it, as torch reads it).
    settle = model[4].register_forward_hook(lambda m, a, out: time.sleep(0.5 if let_go else 0))
    with (stowage.offload.activations(min_bytes=0) if offload else torch.enable_grad()):
        loss = model(batch).square().mean()
        handle.remove()
        settle.remove()
        captured[0].data.add_(0.5)  # saved by the Linear after it
        if let_go:
            captured.clear()
        loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    stowage.mark_step()
    return grads
"""


def checked(body: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CHECKED + textwrap.dedent(body)], capture_output=True, text=True,
                          timeout=240)


def test_check_mode_names_a_write_after_forward_to_a_tensor_let_go_of_before_backward() -> None:
    result = checked("""
        step(True, let_go=True)
    """)
    assert result.returncode != 0
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("RuntimeError: stowage check: a saved tensor was written after it was saved: "
                              "[torch.FloatTensor [128, 256]] saved in module '2' at step 0"), result.stderr
    assert "through .data or another alias" in message and "link" not in message, message


def test_check_mode_lets_a_write_to_a_tensor_still_referenced_through_as_torch_reads_it() -> None:
    result = checked("""
        expected = step(False, let_go=False)
        got = step(True, let_go=False)
        assert all(torch.equal(a, b) for a, b in zip(expected, got))
        print("same")
    """)
    assert result.returncode == 0 and "same" in result.stdout, result.stderr
