"""Parameters off the device on a real GPU: the host parameters pinned, the device's memory down
by the blocks' parameters and held to the window during a step, gradients on the host equal to
plain torch's (the same device kernels made them) and sent there without a host wait each (the
copies follow the compute by events; the host waits only past the bound of bytes in flight and
at the end of backward), a failed backward's gradients as torch leaves them, the model freed with
its handle.

conftest.py made stowage torch's CUDA allocator; the exactness matrix (test_exactness_gpu.py) holds
the `parameters` cells to torch over every pattern."""

from __future__ import annotations

import gc
import weakref

import torch

import stowage
import stowage.offload
from gpt2_model import GPT, GPTConfig

DEVICE = "cuda"


def small_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=6, n_head=8, n_embd=512, vocab_size=8192, block_size=256)).to(DEVICE)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    data = torch.randint(0, 8192, (4, 257), generator=torch.Generator().manual_seed(step)).to(DEVICE)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


def gradients_of(model: GPT, offload: bool) -> tuple[list[torch.Tensor], int, int]:
    handle = stowage.offload.parameters(model) if offload else None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    between = torch.cuda.memory_allocated()
    tokens, targets = batch(0)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        loss = model(tokens, targets)
    loss.backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    grads = [p.grad.detach().to("cpu") for p in model.parameters()]
    if handle is not None:
        assert all(p.is_pinned() for p in model.h.parameters())
        assert all(p.grad.device.type == "cpu" for p in model.h.parameters())
        handle.close()
    return grads, between, peak


def test_gradients_equal_torch_s_and_the_device_holds_the_window() -> None:
    ours, between_ours, peak_ours = gradients_of(small_gpt(), offload=True)
    theirs, between_theirs, peak_theirs = gradients_of(small_gpt(), offload=False)
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)
    block_bytes = sum(p.numel() * p.element_size() for p in small_gpt().h.parameters())
    assert between_theirs - between_ours >= block_bytes
    assert peak_ours < peak_theirs


def test_a_closed_handle_and_its_model_are_freed() -> None:
    model = small_gpt()
    handle = stowage.offload.parameters(model)
    tokens, targets = batch(1)
    model(tokens, targets).backward()
    handle.close()
    refs = [weakref.ref(model), weakref.ref(handle)]
    del model, handle
    gc.collect()
    assert [r() for r in refs] == [None, None]


def test_backward_waits_on_the_host_only_past_the_bound_not_per_gradient() -> None:
    model = small_gpt()
    blocks_bytes = sum(p.numel() * p.element_size() for p in model.h.parameters())
    largest = max(p.numel() * p.element_size() for p in model.h.parameters())
    tokens, targets = batch(0)
    for bound in (None, blocks_bytes):  # the default (the largest unit's bytes), then every gradient
        with stowage.offload.parameters(model, gradient_bytes=bound) as handle:
            for step in range(2):
                waits_before = handle._transfers.host_waits
                with torch.autocast(DEVICE, dtype=torch.bfloat16):
                    loss = model(tokens, targets)
                loss.backward()
                waits = handle._transfers.host_waits - waits_before
                assert handle._transfers.gradients_in_flight == 0 and not handle._sent
                assert all(p.grad.is_pinned() for p in model.h.parameters())
                if bound == blocks_bytes:
                    assert waits <= 1  # the copies follow the compute by events; one wait, for the last ones
            transfers = handle._transfers
            assert transfers.peak_gradient_bytes_in_flight <= transfers.gradient_bound_bytes + largest
        model.zero_grad(set_to_none=True)


def test_a_backward_that_raises_leaves_torch_s_gradients_by_the_next_forward() -> None:
    def run(offload: bool) -> list[torch.Tensor | None]:
        model = small_gpt()
        handle = stowage.offload.parameters(model) if offload else None
        tokens, targets = batch(2)
        hook = model.h[1].register_forward_hook(lambda m, a, out: out.register_hook(_raise))
        try:
            model(tokens, targets).backward()
        except RuntimeError as error:
            assert "stop" in str(error)
        hook.remove()
        if handle is not None:
            with torch.no_grad():
                model(tokens, targets)  # the next forward: any gradient still in flight has landed
            assert not handle._sent
        grads = [None if p.grad is None else p.grad.detach().to("cpu") for p in model.parameters()]
        if handle is not None:
            handle.close()
        return grads

    ours, theirs = run(True), run(False)
    assert any(g is not None for g in theirs)
    for a, b in zip(ours, theirs):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b))


def _raise(grad: torch.Tensor) -> None:
    raise RuntimeError("stop")


def test_the_offloaded_adamw_updates_the_host_blocks_in_place_as_torch_does() -> None:
    # The blocks' parameters live on the host (pinned), the embeddings and the head on the GPU: one
    # stowage.offload.AdamW takes both (its whole share, as fit runs it), the blocks' updated in place
    # by the host kernel with their states in host memory, the rest by torch's step on the device. A mirror of every parameter on
    # the GPU, stepped by torch's AdamW from the same gradients (what plain torch runs), agrees: the
    # device's parameters bit for bit, the blocks' within torch's fused/foreach spread (the host
    # kernel rounds as CUDA's sqrt does; the GPU's foreach may contract to fused multiply-adds).
    model = small_gpt()
    handle = stowage.offload.parameters(model)
    hyper = dict(lr=1e-3, weight_decay=0.1, foreach=True)
    optimizer = stowage.offload.AdamW(model.parameters(), **hyper, device_fraction=1.0)  # as fit runs it
    mirror = [p.detach().to(DEVICE).clone() for p in model.parameters()]
    reference = torch.optim.AdamW(mirror, **hyper)
    in_blocks = {id(p) for p in model.h.parameters()}
    for step in range(3):
        tokens, targets = batch(step)
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            loss = model(tokens, targets)
        loss.backward()
        for copy, param in zip(mirror, model.parameters()):
            copy.grad = param.grad.detach().to(DEVICE)
        optimizer.step()
        reference.step()
        optimizer.zero_grad(set_to_none=True)
        for copy, param in zip(mirror, model.parameters()):
            if id(param) in in_blocks:
                assert param.device.type == "cpu"
                torch.testing.assert_close(param.detach().to(DEVICE), copy, rtol=2e-6, atol=1e-9)
            else:
                assert param.device == copy.device and torch.equal(param.detach(), copy)
    for param in model.h.parameters():
        assert param.is_pinned() and optimizer.state[param]["exp_avg"].device.type == "cpu"
    handle.close()
    assert all(p.device.type == "cuda" for p in model.parameters())


def test_a_fused_device_share_steps_on_once_its_parameters_come_back() -> None:
    # The blocks' first steps run on the host (their states made there); back on the device after
    # close(), torch's fused step wants each step count on the parameter's device, where it goes.
    model = small_gpt()
    optimizer = stowage.offload.AdamW(model.parameters(), lr=1e-3, fused=True, device_fraction=1.0)
    handle = stowage.offload.parameters(model)
    for step in range(2):
        if step == 1:
            handle.close()
        tokens, targets = batch(step)
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            loss = model(tokens, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    for param in model.h.parameters():
        assert optimizer.state[param]["step"].device.type == "cuda"
        assert optimizer.state[param]["exp_avg"].device.type == "cuda"
