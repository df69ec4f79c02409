"""Check mode (stowage.checking): an offloaded tensor, a parameter written back and a gradient
copied out, corrupted on purpose by the simulated device's link (or changed where the content
watch cannot see it), are caught with the tensor, its module and the step named; with nothing
corrupted, training is unchanged (CPU mode, in a fresh process each: the device and the switch
are per process)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent

PRELUDE = """
import os, torch, stowage
stowage.enable(device="cpu", capacity="1GiB", check=True)
from stowage import _torch
class Square(torch.nn.Module):
    def forward(self, x):
        return x.square()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256), Square())
batch = torch.randn(64, 256)
def step(optimizer):
    with stowage.offload.activations(min_bytes=0):
        loss = model(batch).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    stowage.mark_step()
"""


def run(body: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body)], capture_output=True, text=True,
                          timeout=240, cwd=HERE, env={**os.environ, **(env or {})})


def test_an_offloaded_tensor_corrupted_on_the_link_is_caught_naming_it_its_module_and_step() -> None:
    result = run("""
        optimizer = torch.optim.AdamW(model.parameters())
        step(optimizer)
        step(optimizer)
        with stowage.offload.activations(min_bytes=0):
            loss = model(batch).mean()
        stowage.offload.end_step()          # the offloads done; the next copy is a reload
        _torch.cpu_corrupt_copy(1)
        loss.backward()
    """)
    assert result.returncode != 0
    message = result.stderr.strip().splitlines()[-1]
    assert "stowage check: an offloaded tensor came back changed" in message, result.stderr
    assert "saved in module '3' at step 2" in message, message  # Square's input, the first back


# update="exact" copies each parameter and gradient out at step() (4 parameters: 8 copies), then
# writes back; the other modes copy the gradients out in backward.
@pytest.mark.parametrize("update, nth", [("exact", 9), ("in_backward", 1)])
def test_a_parameter_corrupted_on_its_way_back_is_caught_naming_it_and_the_step(update: str, nth: int) -> None:
    result = run(f"""
        optimizer = stowage.offload.AdamW(model.parameters(), update="{update}")
        step(optimizer)
        model(batch).mean().backward()  # (in_backward: the gradients' copies out)
        _torch.cpu_corrupt_copy({nth})  # a parameter's way back
        optimizer.step()
    """)
    assert result.returncode != 0
    message = result.stderr.strip().splitlines()[-1]
    assert "stowage check: parameter '" in message and "arrived changed at step 1" in message, result.stderr


def test_a_gradient_corrupted_on_its_way_out_at_step_is_caught_naming_it_and_copied_again() -> None:
    """update="exact" copies gradients out in step(): a copy that differs from the device's bytes is
    copied again, the step finishes from the good copy (Note [Whole steps]) and the error follows."""
    result = run("""
        import copy
        twin = copy.deepcopy(model)
        optimizer = stowage.offload.AdamW(model.parameters())
        twin_optimizer = stowage.offload.AdamW(twin.parameters())
        for m, o, corrupt in ((twin, twin_optimizer, None), (model, optimizer, 2)):
            m(batch).mean().backward()
            if corrupt:
                _torch.cpu_corrupt_copy(corrupt)  # the first parameter's gradient on its way out
            try:
                o.step()
            except RuntimeError as error:
                print(error)
        assert all(torch.equal(a, b) for a, b in zip(twin.parameters(), model.parameters())), "not the clean step"
    """)
    assert result.returncode == 0, result.stderr
    assert "stowage check: the gradient of parameter '" in result.stdout, result.stdout
    assert "is not, bit for bit, what the device holds" in result.stdout, result.stdout


def test_a_gradient_corrupted_on_its_way_out_is_caught_naming_it_with_nothing_applied() -> None:
    result = run("""
        optimizer = stowage.offload.AdamW(model.parameters(), update="in_backward")
        step(optimizer)
        before = [p.detach().clone() for p in model.parameters()]
        _torch.cpu_corrupt_copy(1)  # the next copy: a gradient's way out
        model(batch).mean().backward()
        try:
            optimizer.step()
        except RuntimeError as error:
            print(error)
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())), "a parameter moved"
    """)
    assert result.returncode == 0, result.stderr
    assert "stowage check: the gradient of parameter '" in result.stdout, result.stdout
    assert "copied out at step 1 is not, bit for bit," in result.stdout, result.stdout


def test_check_mode_turned_off_checks_nothing_more() -> None:
    """set_enabled(False) reaches the engines too, with no new optimizer or activations() to hand
    it over: a gradient changed where only check mode's comparison would see it is not compared."""
    result = run("""
        optimizer = stowage.offload.AdamW(model.parameters(), update="in_backward")
        step(optimizer)
        stowage.checking.set_enabled(False)
        model(batch).mean().backward()
        words = model[2].weight.grad.view(-1).view(torch.int32)
        for index, delta in ((0, 1), (1, -1), (1024, -1), (1025, 1)):
            words[index] += delta
        optimizer.step()
        print("not checked")
    """)
    assert result.returncode == 0 and "not checked" in result.stdout, result.stderr


def test_a_gradient_change_the_content_watch_cannot_see_is_caught() -> None:
    """+1 and -1 on the corners of a rectangle of 32-bit words leave every sum of the checksum as
    it was, so only check mode's comparison of the bytes sees the change."""
    result = run("""
        optimizer = stowage.offload.AdamW(model.parameters(), update="in_backward")
        step(optimizer)
        before = [p.detach().clone() for p in model.parameters()]
        model(batch).mean().backward()
        grad = model[2].weight.grad
        sums = _torch.content_checksums([grad]).clone()
        words = grad.view(-1).view(torch.int32)
        for index, delta in ((0, 1), (1, -1), (1024, -1), (1025, 1)):
            words[index] += delta
        assert torch.equal(_torch.content_checksums([grad]), sums)
        try:
            optimizer.step()
        except RuntimeError as error:
            print(error)
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())), "a parameter moved"
        optimizer.zero_grad()
        step(optimizer)  # and it trains on
    """)
    assert result.returncode == 0, result.stderr
    assert "stowage check: the gradient of parameter '2.weight'" in result.stdout, result.stdout


def test_with_nothing_corrupted_check_mode_changes_nothing() -> None:
    result = run("""
        reference = [p.detach().clone() for p in model.parameters()]
        optimizer = stowage.offload.AdamW(model.parameters())
        for _ in range(3):
            step(optimizer)
        checked = [p.detach().clone() for p in model.parameters()]
        stowage.checking.set_enabled(False)
        with torch.no_grad():
            for p, r in zip(model.parameters(), reference):
                p.copy_(r)
        optimizer = stowage.offload.AdamW(model.parameters())
        for _ in range(3):
            step(optimizer)
        assert all(torch.equal(a, b) for a, b in zip(checked, model.parameters()))
        print("same")
    """)
    assert result.returncode == 0 and "same" in result.stdout, result.stderr


def test_the_environment_variable_turns_it_on() -> None:
    result = subprocess.run([sys.executable, "-c", "import stowage.checking as c; print(c.enabled())"],
                            capture_output=True, text=True, env={**__import__("os").environ, "STOWAGE_CHECK": "1"})
    assert result.stdout.strip() == "True", result.stderr
