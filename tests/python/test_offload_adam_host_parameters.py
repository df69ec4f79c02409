"""stowage.offload.AdamW over parameters that stowage.offload.parameters keeps on the host (CPU
mode): each is updated in place where it lives, from its host gradient, by the host kernel, with
no copy and no staging, bit for bit torch's AdamW (foreach) on a model trained on the device:
weight decay, amsgrad, several param groups, frozen parameters, clipping, a handle closed
mid-training, bf16 parameters with fp32 masters, and the optimizer made before the blocks move
(as fit makes it). Where a parameter lives is read at each step()."""

from __future__ import annotations

from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
import stowage.offload  # noqa: E402
from offload_models import TinyGpt, lm_loss, lora_llama  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_mode_module")

STEPS = 4


def tiny_gpt(dtype: Any = torch.float32) -> Any:
    torch.manual_seed(0)
    return TinyGpt(vocab=256, width=64, heads=4, layers=3, length=32).to(dtype)


def gpt_loss(model: Any, step: int) -> torch.Tensor:
    ids = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(step))
    return lm_loss(model(ids), ids)


def groups_of(model: Any, split: bool, **hyper: Any) -> list[dict[str, Any]]:
    """One group, or two: the blocks' matrices decayed, everything else not (and a lower lr)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not split:
        return [{"params": params, **hyper}]
    decayed = [p for p in model.blocks.parameters() if p.requires_grad and p.dim() == 2]
    ids = {id(p) for p in decayed}
    return [{"params": decayed, **hyper},
            {"params": [p for p in params if id(p) not in ids], **hyper, "weight_decay": 0.0, "lr": 3e-3}]


def train(make_model: Callable[[], Any], make_optimizer: Callable[[Any], Any], offload: bool,
          optimizer_first: bool = True, close_at: int | None = None, clip: float | None = None,
          steps: int = STEPS) -> tuple[list[torch.Tensor], Any, Any]:
    """Trains `steps` steps; the blocks' parameters on the host (a handle made after the optimizer
    where `optimizer_first`, before it otherwise, closed before step `close_at`). Returns the
    parameters, the optimizer and the model."""
    model = make_model()
    handle = None
    if offload and not optimizer_first:
        handle = stowage.offload.parameters(model)
    optimizer = make_optimizer(model)
    if offload and optimizer_first:
        handle = stowage.offload.parameters(model)
    for step in range(steps):
        if handle is not None and step == close_at:
            handle.close()
        gpt_loss(model, step).backward()
        if clip is not None:
            clipping = getattr(optimizer, "clip_grad_norm_", None)
            if clipping is not None:
                clipping(clip)
            else:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=True)
        optimizer.step()
        optimizer.zero_grad()
    params = [p.detach().clone() for p in model.parameters()]
    if handle is not None:
        handle.close()
    return params, optimizer, model


def torch_adamw(split: bool = False, **hyper: Any) -> Callable[[Any], Any]:
    return lambda model: torch.optim.AdamW(groups_of(model, split, **hyper), foreach=True)


def stowage_adamw(split: bool = False, **options: Any) -> Callable[[Any], Any]:
    hyper = {k: v for k, v in options.items() if k in ("lr", "weight_decay", "amsgrad", "betas")}
    rest = {k: v for k, v in options.items() if k not in hyper}
    return lambda model: stowage.offload.AdamW(groups_of(model, split, **hyper), **rest)


def assert_bitwise(ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> None:
    assert len(ours) == len(theirs)
    for index, (a, b) in enumerate(zip(ours, theirs)):
        assert torch.equal(a, b), f"parameter {index} differs"


@pytest.mark.parametrize("device_fraction", [0.0, 0.5, 1.0], ids=["states_offloaded", "half", "device_share"])
@pytest.mark.parametrize("optimizer_first", [True, False], ids=["optimizer_first", "blocks_first"])
def test_host_parameters_update_in_place_as_torch_s_adamw(device_fraction: float, optimizer_first: bool) -> None:
    hyper = dict(lr=1e-2, weight_decay=0.1)
    ours, optimizer, model = train(tiny_gpt, stowage_adamw(**hyper, device_fraction=device_fraction), True,
                                   optimizer_first)
    assert_bitwise(ours, train(tiny_gpt, torch_adamw(**hyper), False)[0])
    # Every trained parameter has torch's state entry, on the host for the blocks' (the handle closed
    # after the last step: the device share's states follow their parameter back).
    assert all(int(optimizer.state[p]["step"]) == STEPS for p in model.parameters())


@pytest.mark.parametrize("amsgrad,split", [(True, False), (False, True), (True, True)],
                         ids=["amsgrad", "param_groups", "amsgrad_param_groups"])
def test_amsgrad_and_param_groups(amsgrad: bool, split: bool) -> None:
    hyper = dict(lr=1e-2, weight_decay=0.05, amsgrad=amsgrad)
    for fraction in (0.0, 1.0):
        ours = train(tiny_gpt, stowage_adamw(split, **hyper, device_fraction=fraction), True)[0]
        assert_bitwise(ours, train(tiny_gpt, torch_adamw(split, **hyper), False)[0])


def copies() -> dict[str, int]:
    """The engine's copy counts (its pinned pool aside: states made at a first step take from it)."""
    return {k: v for k, v in stowage.memory_stats().items() if k.startswith("offload.") and ".pinned." not in k}


@pytest.mark.parametrize("device_fraction", [0.0, 1.0], ids=["states_offloaded", "device_share"])
def test_the_host_update_copies_nothing(device_fraction: float) -> None:
    model = tiny_gpt()
    blocks = list(model.blocks.parameters())
    optimizer = stowage.offload.AdamW(blocks, lr=1e-2, device_fraction=device_fraction)
    with stowage.offload.parameters(model):
        gpt_loss(model, 0).backward()
        moved = copies()
        optimizer.step()
        assert copies() == moved
        # Nothing went through the staged buckets' update queue: the update ran in place.
        assert optimizer.host_stats()["update_seconds"] == 0
        assert all(int(optimizer.state[p]["step"]) == 1 for p in blocks)
        host_param = blocks[0]
        # the state is host memory beside the parameter: not the simulated device's
        module = stowage.serving.torch_module()
        assert not module.cpu_owns(optimizer.state[host_param]["exp_avg"])
        assert not module.cpu_owns(host_param.data)


def test_clipping_through_the_optimizer_or_torch_is_torch_s_clip() -> None:
    hyper = dict(lr=1e-2, weight_decay=0.1)
    reference = train(tiny_gpt, torch_adamw(**hyper), False, clip=0.05)[0]
    for fraction in (0.0, 1.0):
        assert_bitwise(train(tiny_gpt, stowage_adamw(**hyper, device_fraction=fraction), True, clip=0.05)[0],
                       reference)


@pytest.mark.parametrize("device_fraction", [0.0, 1.0], ids=["states_offloaded", "device_share"])
def test_a_handle_closed_mid_training_goes_on_exactly(device_fraction: float) -> None:
    hyper = dict(lr=1e-2, weight_decay=0.1)
    ours, optimizer, model = train(tiny_gpt, stowage_adamw(**hyper, device_fraction=device_fraction), True,
                                   close_at=2)
    assert_bitwise(ours, train(tiny_gpt, torch_adamw(**hyper), False)[0])
    module = stowage.serving.torch_module()
    block = next(model.blocks.parameters())
    assert module.cpu_owns(block.data)  # back on the (simulated) device
    if device_fraction == 1.0:  # the device share's states came back with it
        assert module.cpu_owns(optimizer.state[block]["exp_avg"])
        assert optimizer.state[block] is optimizer._device_optimizer.state[block]


def test_bf16_parameters_with_master_weights_keep_fp32_masters_on_the_host() -> None:
    model = tiny_gpt(torch.bfloat16)
    reference = tiny_gpt(torch.float32).to(torch.bfloat16).float()  # the fp32 masters torch would keep
    optimizer = stowage.offload.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, master_weights=True)
    ref_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.1, foreach=True)
    with stowage.offload.parameters(model):
        for step in range(STEPS):
            gpt_loss(model, step).backward()
            for p, r in zip(model.parameters(), reference.parameters()):
                r.grad = p.grad.float()  # the same gradients: only the update is compared
            optimizer.step()
            ref_optimizer.step()
            optimizer.zero_grad()
            ref_optimizer.zero_grad()
            for p, r in zip(model.parameters(), reference.parameters()):
                assert torch.equal(optimizer.state[p]["master"], r.detach())
                assert torch.equal(p.detach(), r.detach().to(torch.bfloat16))
        block = next(model.blocks.parameters())
        assert block.dtype == torch.bfloat16 and optimizer.state[block]["master"].dtype == torch.float32


def test_a_lora_model_s_frozen_base_has_no_states_and_is_never_updated() -> None:
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")

    def make() -> Any:
        return lora_llama(transformers, peft)

    def run(offload: bool, optimizer_of: Callable[[list[Any]], Any]) -> tuple[list[torch.Tensor], Any, Any]:
        model = make()
        optimizer = optimizer_of(list(model.parameters()))  # the frozen base too: torch skips it
        handle = stowage.offload.parameters(model, model.base_model.model.model.layers) if offload else None
        for step in range(3):
            ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(step))
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        params = [p.detach().clone() for p in model.parameters()]
        if handle is not None:
            handle.close()
        return params, optimizer, model

    initial = [p.detach().clone() for p in make().parameters()]
    ours, optimizer, model = run(True, lambda ps: stowage.offload.AdamW(ps, lr=1e-2, device_fraction=0.5))
    theirs = run(False, lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=True))[0]
    assert_bitwise(ours, theirs)
    for p, before, after in zip(model.parameters(), initial, ours):
        assert (p in optimizer.state) == p.requires_grad
        if not p.requires_grad:
            assert torch.equal(before, after)


def test_updates_in_backward_are_refused_for_host_parameters_before_anything_changes() -> None:
    model = tiny_gpt()
    optimizer = stowage.offload.AdamW(model.parameters(), lr=1e-2, update="delayed")
    with stowage.offload.parameters(model):
        gpt_loss(model, 0).backward()
        before = [p.detach().clone() for p in model.parameters()]
        with pytest.raises(ValueError, match="live on the host.*update='exact'"):
            optimizer.step()
        assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    optimizer.close()
    # Frozen blocks on the host are not updated at all: nothing to refuse.
    model = tiny_gpt()
    model.blocks.requires_grad_(False)
    optimizer = stowage.offload.AdamW(model.parameters(), lr=1e-2, update="delayed")
    with stowage.offload.parameters(model):
        gpt_loss(model, 0).backward()
        optimizer.step()
    optimizer.close()


def test_a_host_parameter_that_cannot_be_updated_in_place_is_refused_with_nothing_applied() -> None:
    model = tiny_gpt()
    optimizer = stowage.offload.AdamW(model.parameters(), lr=1e-2, device_fraction=0.5)
    with stowage.offload.parameters(model):
        gpt_loss(model, 0).backward()
        before = [p.detach().clone() for p in model.parameters()]
        block = model.blocks[1].attn.weight if hasattr(model.blocks[1], "attn") else next(model.blocks[1].parameters())
        block.grad = block.grad.to_sparse()
        with pytest.raises(ValueError, match="lives on the host.*sparse.*Nothing was applied"):
            optimizer.step()
        # the device share was not stepped either
        assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
        assert not optimizer.state


@pytest.mark.parametrize("device_fraction", [0.0, 1.0], ids=["states_offloaded", "device_share"])
def test_a_grad_scaler_unscales_in_the_update_and_an_inf_skips_the_step(device_fraction: float) -> None:
    def run(make_optimizer: Callable[[Any], Any], offload: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        model = tiny_gpt()
        optimizer = make_optimizer(model)
        handle = stowage.offload.parameters(model) if offload else None
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)  # a power of two: unscaling is exact
        skipped = []
        for step in range(3):
            scaler.scale(gpt_loss(model, step)).backward()
            if step == 1:
                next(model.blocks[0].parameters()).grad.view(-1)[0] = float("inf")  # an overflow on the host
                skipped = [p.detach().clone() for p in model.parameters()]
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            if step == 1:
                assert all(torch.equal(p, b) for p, b in zip(model.parameters(), skipped))
        params = [p.detach().clone() for p in model.parameters()]
        if handle is not None:
            handle.close()
        return params, skipped

    ours = run(stowage_adamw(lr=1e-2, weight_decay=0.1, device_fraction=device_fraction), True)
    theirs = run(torch_adamw(lr=1e-2, weight_decay=0.1), False)
    assert_bitwise(ours[0], theirs[0])
    assert_bitwise(ours[1], theirs[1])
