"""stowage.offload.AdamW on a real GPU: bf16 parameters against torch's AdamW on fp32 copies,
copies that overlap (no device synchronisation in step's hot path beyond the waits it documents),
and the device memory it saves."""

from __future__ import annotations

import copy

import torch

import stowage
from gpt2_model import GPT, GPTConfig

DEVICE = "cuda"
HYPER = dict(lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def small_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=4, n_head=8, n_embd=512, vocab_size=8192, block_size=256)).to(DEVICE)


def tokens(step: int) -> torch.Tensor:
    return torch.randint(0, 8192, (4, 256), generator=torch.Generator().manual_seed(step)).to(DEVICE)


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
        assert ((p.detach().float() - expected).abs() <= expected.abs() * 2.0 ** -7 + 1e-30).all()


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
    assert stats["pinned_bytes"] >= sum(p.numel() for p in model.parameters()) * 16
    optimizer.close()


def test_in_backward_updates_match_exact() -> None:
    results = []
    for update in ("exact", "in_backward"):
        model = small_gpt()
        optimizer = stowage.offload.AdamW(model.parameters(), **HYPER, update=update, bucket_numel=1 << 20)
        for step in range(3):
            ids = tokens(step)
            model(ids, ids).backward()
            optimizer.step()
            optimizer.zero_grad()
        torch.cuda.synchronize()
        results.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_bf16_parameters_keep_torch_s_bf16_states_within_fused_and_foreach_spread() -> None:
    def run(make: object) -> list[torch.Tensor]:
        model = small_gpt().to(torch.bfloat16)
        optimizer = make(model.parameters())  # type: ignore[operator]
        for step in range(3):
            ids = tokens(step)
            model(ids, ids).backward()
            optimizer.step()
            optimizer.zero_grad()
        torch.cuda.synchronize()
        return [p.detach().float() for p in model.parameters()]

    ours = run(lambda ps: stowage.offload.AdamW(ps, **HYPER, bucket_numel=1 << 20))
    foreach = run(lambda ps: torch.optim.AdamW(ps, **HYPER, foreach=True))
    fused = run(lambda ps: torch.optim.AdamW(ps, **HYPER, fused=True))
    for a, b, c in zip(ours, foreach, fused):
        spread = (b - c).abs().max()
        ulp = c.abs().max() * 2.0 ** -7
        assert (a - c).abs().max() <= 2 * max(spread, ulp)
