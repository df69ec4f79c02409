"""Activation offload on a real GPU: the CPU-mode tests' claims where copies really overlap
compute, plus what only a GPU can show (a producer still running when its output is offloaded, no
device synchronisation under torch's own sync debug mode, torch.compile per block).

conftest.py made stowage torch's CUDA allocator, so the offloader relieves its pressure too.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import stowage
from gpt2_model import GPT, GPTConfig

HARNESS = Path(__file__).resolve().parents[2] / "python"  # tests/python: the exactness package
if str(HARNESS) not in sys.path:
    sys.path.append(str(HARNESS))

from exactness.devices import session  # noqa: E402

DEVICE = "cuda"
SLEEP_CYCLES = 50_000_000  # torch.cuda._sleep: tens of milliseconds on current GPUs


def small_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=4, n_head=8, n_embd=512, vocab_size=8192, block_size=512)).to(DEVICE)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step)
    data = torch.randint(0, 8192, (8, 513), generator=generator).to(DEVICE)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


def train(model: GPT, steps: int, offload: bool, autocast: bool = True) -> list[list[torch.Tensor]]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gradients = []
    for step in range(steps):
        tokens, targets = batch(step)
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=autocast):
            if offload:
                with stowage.offload.activations(min_bytes="64KiB"):
                    loss = model(tokens, targets)
            else:
                loss = model(tokens, targets)
        loss.backward()
        gradients.append([p.grad.clone() for p in model.parameters()])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        stowage.mark_step()
    return gradients


def assert_bitwise(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    for index, (x, y) in enumerate(zip(a, b)):
        assert torch.equal(x, y), f"tensor {index} differs by up to {float((x - y).abs().max())}"


def test_gradients_are_bitwise_those_without_offload() -> None:
    """Under the exactness suite's deterministic session: without it, two runs of the same
    model differ in their last bits (atomic accumulation in backward: 7e-11 on an H200)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    with session(DEVICE):
        plain = train(small_gpt(), 3, offload=False)
        offloaded = train(small_gpt(), 3, offload=True)
    for step_plain, step_offloaded in zip(plain, offloaded):
        assert_bitwise(step_plain, step_offloaded)
    assert stowage.memory_stats()["offload.bytes_offloaded"] > 0


class SlowProducer(torch.autograd.Function):
    """Writes its output after a long sleep on the stream, then saves it: the offload must wait."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        torch.cuda._sleep(SLEEP_CYCLES)
        y = x * 3
        ctx.save_for_backward(y)
        return y.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        torch.cuda._sleep(SLEEP_CYCLES)  # a slow backward node while buffers come back
        return grad * y


def test_a_delayed_producer_and_reused_memory_corrupt_no_offloaded_tensor() -> None:
    x = torch.randn(4096, 1024, device=DEVICE, requires_grad=True)
    expected = (x.detach() * 3).clone()
    with stowage.offload.activations(min_bytes="64KiB"):
        out = SlowProducer.apply(x)
        # Memory freed after offloading is reused at once and written while copies may run.
        for _ in range(4):
            scratch = torch.full((4096, 1024), 7.0, device=DEVICE)
            del scratch
    out.sum().backward()
    torch.testing.assert_close(x.grad, expected, rtol=0, atol=0)


def test_forward_and_backward_never_synchronise_the_device() -> None:
    model = small_gpt()
    train(model, 1, offload=True)  # warm: the pinned arena exists
    tokens, targets = batch(9)
    before = stowage.memory_stats()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            with stowage.offload.activations(min_bytes="64KiB"):
                loss = model(tokens, targets)
        loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    after = stowage.memory_stats()
    assert after["offload.num_syncs"] == before["offload.num_syncs"]
    assert after["num_sync_all_streams"] == before["num_sync_all_streams"]
    assert after["offload.num_offloads"] > before["offload.num_offloads"]
    stowage.mark_step()


def test_once_each_shape_has_run_nothing_more_is_pinned() -> None:
    """Large blocks settle into one arena the size of the longest step's peak; a shorter step
    whose bf16 activations fall to 1 MiB (128 tokens) takes small segments the first time it runs
    (Note [One pinned arena]). After each length has run once, nothing more is pinned."""
    model = small_gpt()
    optimizer = torch.optim.AdamW(model.parameters())
    pinnings = []
    lengths = [256, 512, 128, 384, 512, 128, 384, 256]
    for length in lengths:
        tokens = torch.randint(0, 8192, (8, length), device=DEVICE)
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            with stowage.offload.activations(min_bytes="64KiB"):
                loss = model(tokens, tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        stowage.mark_step()
        pinnings.append(stowage.memory_stats()["offload.pinned.num_pinnings"])
    assert len(set(pinnings[lengths.index(384):])) == 1, pinnings  # every length has run by then
    stats = stowage.memory_stats()
    assert stats["offload.pinned.reserved_bytes.peak"] <= 1.05 * stats["offload.offloaded_bytes.peak"]


def test_parameters_and_autocast_casts_are_never_offloaded() -> None:
    model = small_gpt()
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    offloaded: list[torch.Tensor] = []

    class Spy(stowage.offload.activations):
        def _pack(self, tensor: Any) -> Any:
            packed = super()._pack(tensor)
            if isinstance(packed, stowage._torch.PackedTensor):  # not a tensor kept on the device
                offloaded.append(tensor)
            return packed

    tokens, targets = batch(0)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        with Spy(min_bytes=0) as report:
            loss = model(tokens, targets)
    loss.backward()
    assert offloaded
    assert not [t for t in offloaded if t.untyped_storage().data_ptr() in parameters]
    linear_casts = sum(m.weight.numel() * 2 for m in model.modules() if isinstance(m, nn.Linear))
    assert report.parameter_bytes >= linear_casts - model.lm_head.weight.numel() * 2


def test_blocks_compiled_one_by_one_are_offloaded_at_their_boundaries() -> None:
    reference = small_gpt()
    compiled = small_gpt()
    for index, block in enumerate(compiled.h):
        compiled.h[index] = torch.compile(block)
    tokens, targets = batch(0)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        reference(tokens, targets).backward()
        with stowage.offload.activations(min_bytes="64KiB") as report:
            loss = compiled(tokens, targets)
    loss.backward()
    assert report.offloaded_bytes > 0
    for a, b in zip(reference.parameters(), compiled.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=2e-2, atol=2e-3)


def test_under_a_cap_where_the_model_runs_out_it_trains_with_offload() -> None:
    gc.collect()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    # About 0.6 GB of bf16 activations a layer, 14 GB in all: far over the 6 GiB cap, while one
    # layer's working set and the (small-vocabulary) logits fit under it.
    model = GPT(GPTConfig(n_layer=24, n_head=8, n_embd=512, vocab_size=2048, block_size=2048)).to(DEVICE)
    tokens = torch.randint(0, 2048, (16, 2048), device=DEVICE)
    torch.cuda.set_per_process_memory_fraction(min(1.0, 6 * (1 << 30) / total))
    try:
        with pytest.raises(torch.OutOfMemoryError):
            with torch.autocast(DEVICE, dtype=torch.bfloat16):
                model(tokens, tokens).backward()
        model.zero_grad(set_to_none=True)
        gc.collect()
        for _ in range(2):
            with torch.autocast(DEVICE, dtype=torch.bfloat16):
                with stowage.offload.activations():
                    loss = model(tokens, tokens)
            loss.backward()
            model.zero_grad(set_to_none=True)
            stowage.mark_step()
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
