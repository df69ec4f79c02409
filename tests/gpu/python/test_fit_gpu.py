"""stowage.fit on a real GPU: a step over its budget trains under it (the optimizer's states on the
host where the table says, activations planned), its peak within the budget, its parameters those
of torch's AdamW; and a roomy budget changes nothing. The cost model is measured on this GPU
(no cost override): the copy rates fit plans with are the device's own.
conftest.py made stowage torch's CUDA allocator, so its peak statistics are the step's. Every
test runs under the exactness suite's deterministic CUDA session (tests/python/exactness/devices.py):
what stays on the device is compared bit for bit.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS first runs in this process

import pytest  # noqa: E402
import torch  # noqa: E402

import stowage  # noqa: E402
from stowage.models.llama import Llama, LlamaShape  # noqa: E402

HARNESS = Path(__file__).resolve().parents[2] / "python"  # tests/python: the exactness package
if str(HARNESS) not in sys.path:
    sys.path.append(str(HARNESS))

from exactness.devices import session  # noqa: E402

DEVICE = "cuda"
# Embeddings and head large beside the activations: AdamW's two moments cannot stay on the device
# beside half the step, whatever the plan recomputes.
SHAPE = LlamaShape(hidden=512, layers=4, heads=8, kv_heads=2, vocab=32768, max_sequence=512)
HYPER = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


@pytest.fixture(autouse=True)
def deterministic() -> Iterator[None]:
    with session(DEVICE):
        yield


def loss_fn(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        return model.chunked_loss(tokens, chunks=4)


def model_and_batch() -> tuple[Any, torch.Tensor]:
    torch.manual_seed(0)
    tokens = torch.randint(0, SHAPE.vocab, (8, 512), generator=torch.Generator().manual_seed(1))
    return Llama(SHAPE, device=DEVICE), tokens.to(DEVICE)


def reference_parameters(steps: int) -> list[torch.Tensor]:
    model, tokens = model_and_batch()
    optimizer = torch.optim.AdamW(model.parameters(), **HYPER)  # type: ignore[arg-type]
    for _ in range(steps):
        loss_fn(model, tokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return [p.detach().clone() for p in model.parameters()]


def unplanned_step_bytes() -> tuple[int, int, int]:
    """(in use before a step, what the step adds, the parameters' bytes), measured."""
    model, tokens = model_and_batch()
    gc.collect()
    before = stowage.memory_allocated(DEVICE)
    stowage.reset_peak_stats(DEVICE)
    loss_fn(model, tokens).backward()
    added = stowage.max_memory_allocated(DEVICE) - before
    return before, added, sum(p.numel() * p.element_size() for p in model.parameters())


def test_a_step_over_its_budget_trains_under_it_with_adamw_s_numerics() -> None:
    in_use, step_bytes, parameters = unplanned_step_bytes()
    gc.collect()
    # Room for parameters, gradients, half the step and fit's margin: torch's AdamW (2 x
    # parameters more) cannot fit.
    budget = in_use + parameters + step_bytes // 2 + (64 << 20)
    model, tokens = model_and_batch()
    fitted = stowage.fit(model, lambda params: torch.optim.AdamW(params, **HYPER), tokens,  # type: ignore[arg-type]
                         loss_fn=loss_fn, budget=budget, verbose=False)
    assert fitted.device_fraction < 1.0 and isinstance(fitted.optimizer, stowage.offload.AdamW), str(fitted)
    start = stowage.memory_allocated(DEVICE)
    for step in range(3):
        stowage.reset_peak_stats(DEVICE)
        fitted.step(tokens)
        torch.cuda.synchronize()
        assert stowage.max_memory_allocated(DEVICE) <= budget, str(fitted)
        if step == 0:
            # One step: the same gradients (deterministic session), then the host's AdamW against
            # torch's CUDA AdamW, a few fp32 roundings apart. Later steps are not compared here:
            # those roundings change the next gradients' last bits, and Adam turns a near-zero
            # gradient's sign into a whole lr (the exactness suite holds them to the spread
            # between torch's own fused and foreach AdamW).
            for ours, theirs in zip(model.parameters(), reference_parameters(1)):
                torch.testing.assert_close(ours.detach(), theirs, rtol=2e-6, atol=1e-9)
            del ours, theirs
    kept_states = fitted.facts["memory"].states_on_device(fitted.device_fraction)
    assert stowage.memory_allocated(DEVICE) <= start + kept_states + (4 << 20)  # nothing else left behind


def test_a_roomy_budget_changes_nothing() -> None:
    model, tokens = model_and_batch()
    fitted = stowage.fit(model, lambda params: torch.optim.AdamW(params, **HYPER), tokens,  # type: ignore[arg-type]
                         loss_fn=loss_fn, verbose=False)
    assert fitted.device_fraction == 1.0 and fitted.plan is None and type(fitted.optimizer) is torch.optim.AdamW
    for _ in range(2):
        fitted.step(tokens)
    for ours, theirs in zip(model.parameters(), reference_parameters(2)):
        torch.testing.assert_close(ours.detach(), theirs, rtol=0, atol=0)
