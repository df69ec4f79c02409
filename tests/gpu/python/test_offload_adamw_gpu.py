"""stowage.offload.AdamW on a real GPU: bf16 parameters against torch's AdamW on fp32 copies,
copies that overlap (no device synchronisation in step's hot path beyond the waits it documents),
and the device memory it saves."""

from __future__ import annotations

import copy
from typing import Any

import torch

import stowage
from small_gpt import HYPER, small_gpt, tokens


def test_bf16_parameters_with_master_weights_follow_fp32_adamw_rounded() -> None:
    model = small_gpt().to(torch.bfloat16)
    reference = copy.deepcopy(model).float()
    optimizer = stowage.offload.AdamW(model.parameters(), **HYPER, bucket_numel=1 << 20, master_weights=True)
    ref_optimizer = torch.optim.AdamW(reference.parameters(), **HYPER)
    for step in range(3):
        ids = tokens(step)
        model(ids, ids).backward()
        for p, r in zip(model.parameters(), reference.parameters()):
            r.grad = p.grad.float()
        optimizer.step()
        ref_optimizer.step()
        optimizer.zero_grad()
        ref_optimizer.zero_grad()
    torch.cuda.synchronize()
    for p, r in zip(model.parameters(), reference.parameters()):
        expected = r.detach().to(torch.bfloat16).float()
        # One bf16 rounding (2^-8 of the value) apart, plus the few fp32 ulps of the update by
        # which the host's arithmetic and the GPU's differ: where a parameter crosses zero, those
        # are all of its value (lr 1e-3: ulps of 1e-10)
        assert ((p.detach().float() - expected).abs() <= expected.abs() * 2.0 ** -7 + 1e-8).all()


def test_states_take_no_device_memory_and_live_pinned() -> None:
    model = small_gpt().to(torch.bfloat16)
    before = torch.cuda.memory_allocated()
    optimizer = stowage.offload.AdamW(model.parameters(), **HYPER, master_weights=True)
    ids = tokens(0)
    model(ids, ids).backward()
    optimizer.step()
    optimizer.zero_grad()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - before < 64 << 20  # no fp32 states on the device
    stats = optimizer.host_stats()
    # update="exact": fp32 masters and moments, 12 B a parameter, and the staging ring (Note [Staged buckets])
    assert stats["pinned_bytes"] >= stats["allocated_bytes"] - stats["staging_bytes"] >= \
        sum(p.numel() for p in model.parameters()) * 12
    optimizer.close()


def test_the_optimizer_s_copies_run_on_the_offload_engine_and_are_counted() -> None:
    model = small_gpt()
    optimizer = stowage.offload.AdamW(model.parameters(), **HYPER, bucket_numel=1 << 20)
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    before = stowage.memory_stats()
    ids = tokens(0)
    model(ids, ids).backward()
    optimizer.step()
    optimizer.zero_grad()
    torch.cuda.synchronize()
    after = stowage.memory_stats()
    # update="exact" copies each parameter and its gradient out at step(), and the parameter back
    assert after["offload.to_host.bytes"] - before.get("offload.to_host.bytes", 0) == 2 * parameter_bytes
    assert after["offload.to_device.bytes"] - before.get("offload.to_device.bytes", 0) == parameter_bytes
    optimizer.close()


def trained(make_optimizer: Any, dtype: torch.dtype = torch.float32, steps: int = 3) -> list[torch.Tensor]:
    """small_gpt's parameters after `steps` steps with the optimizer make_optimizer(parameters)."""
    model = small_gpt().to(dtype)
    optimizer = make_optimizer(model.parameters())
    for step in range(steps):
        ids = tokens(step)
        model(ids, ids).backward()
        optimizer.step()
        optimizer.zero_grad()
    torch.cuda.synchronize()
    return [p.detach().float() for p in model.parameters()]


def test_in_backward_updates_match_exact() -> None:
    exact, in_backward = (trained(lambda ps, u=update: stowage.offload.AdamW(ps, **HYPER, update=u,
                                                                            bucket_numel=1 << 20))
                          for update in ("exact", "in_backward"))
    for a, b in zip(exact, in_backward):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_bf16_parameters_keep_torch_s_bf16_states_within_fused_and_foreach_spread() -> None:
    ours = trained(lambda ps: stowage.offload.AdamW(ps, **HYPER, bucket_numel=1 << 20), torch.bfloat16)
    foreach = trained(lambda ps: torch.optim.AdamW(ps, **HYPER, foreach=True), torch.bfloat16)
    fused = trained(lambda ps: torch.optim.AdamW(ps, **HYPER, fused=True), torch.bfloat16)
    for a, b, c in zip(ours, foreach, fused):
        spread = (b - c).abs().max()
        ulp = c.abs().max() * 2.0 ** -7
        assert (a - c).abs().max() <= 2 * max(spread, ulp)
