"""stowage.offload.parameters in CPU mode: each unit's parameters in host memory (not the simulated
device's), brought in before the unit runs in forward and backward, training exactly as torch
trains (bitwise: the same kernels on the same values), with checkpointing, autocast, micro-batches,
tied weights, a peft LoRA model and a transformers model; the device's memory bounded by the
window; refusals named."""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")

import stowage  # noqa: E402
import stowage.offload  # noqa: E402
from offload_models import DecoderBlock, TinyGpt, lm_loss, lora_llama  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_mode_module")

Step = Callable[[Any, int], torch.Tensor]


def tiny_gpt() -> Any:
    torch.manual_seed(0)
    return TinyGpt(vocab=256, width=64, heads=4, layers=4, length=32)


def tokens(step: int) -> torch.Tensor:
    return torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(step))


def gpt_loss(model: Any, step: int) -> torch.Tensor:
    ids = tokens(step)
    return lm_loss(model(ids), ids)


def train(make: Callable[[], Any], loss_of: Step, offload: bool, steps: int = 3, micro: int = 1,
          units: Callable[[Any], Any] | None = None, prefetch: int = 1,
          between: Callable[[Any, int], None] | None = None) -> tuple[list[torch.Tensor], list[Any], Any]:
    """Trains a fresh model `steps` AdamW steps; returns its parameters, each step's gradients
    (as the loop sees them before step()) and the handle (closed)."""
    model = make()
    handle = stowage.offload.parameters(model, units(model) if units else None, prefetch) if offload else None
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-2, foreach=True)
    grads = []
    for step in range(steps):
        if between is not None:
            between(model, step)
        for index in range(micro):
            (loss_of(model, step * micro + index) / micro).backward()
        grads.append([None if p.grad is None else p.grad.clone() for p in trainable])
        optimizer.step()
        optimizer.zero_grad()
    params = [p.detach().clone() for p in model.parameters()]
    if handle is not None:
        handle.close()
    return params, grads, handle


def assert_same(ours: tuple[Any, ...], theirs: tuple[Any, ...]) -> None:
    for a, b in zip(ours[0], theirs[0]):
        assert torch.equal(a, b)
    for step_a, step_b in zip(ours[1], theirs[1]):
        for a, b in zip(step_a, step_b):
            assert (a is None and b is None) or torch.equal(a, b)


def checkpointed(reentrant: bool) -> Step:
    """TinyGpt's forward with each block called under torch.utils.checkpoint."""

    def loss(model: Any, step: int) -> torch.Tensor:
        ids = tokens(step)
        x = model.tokens(ids) + model.positions(torch.arange(ids.shape[1]))
        for block in model.blocks:
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=reentrant)
        return lm_loss(model.norm(x) @ model.tokens.weight.t(), ids)

    return loss


def autocast_loss(model: Any, step: int) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return gpt_loss(model, step)


@pytest.mark.parametrize("loss_of,micro", [(gpt_loss, 1), (gpt_loss, 2), (checkpointed(False), 1),
                                           (checkpointed(True), 1), (autocast_loss, 1)],
                         ids=["plain", "micro_batches", "checkpoint", "checkpoint_reentrant", "autocast_bf16"])
def test_training_with_parameters_off_the_device_is_torch_s_bitwise(loss_of: Step, micro: int) -> None:
    ours = train(tiny_gpt, loss_of, offload=True, micro=micro)
    assert_same(ours, train(tiny_gpt, loss_of, offload=False, micro=micro))
    assert ours[2].peak_resident_bytes > 0


def test_the_parameters_live_in_host_memory_and_the_device_holds_the_window() -> None:
    model = tiny_gpt()
    before = stowage.memory_allocated()
    block_bytes = sum(p.numel() * p.element_size() for p in model.blocks.parameters())
    handle = stowage.offload.parameters(model, prefetch=1)
    try:
        count = sum(1 for _ in model.blocks.parameters())
        # the host copies are not the device's: the device lets go of the blocks' bytes (each rounded up)
        assert block_bytes <= before - stowage.memory_allocated() <= block_bytes + 512 * count
        assert handle.host_bytes == block_bytes
        unit = max(handle._schedule.unit_bytes(u) for u in range(len(handle.units)))
        seen: list[int] = []
        hooks = [b.register_forward_hook(lambda *_: seen.append(handle.resident_bytes)) for b in model.blocks]
        for step in range(2):
            gpt_loss(model, step).backward()
            assert handle.resident_bytes == 0  # every copy freed when backward returns
            for p in model.blocks.parameters():
                assert p.grad is not None and p.grad.untyped_storage().data_ptr() != 0
        for h in hooks:
            h.remove()
        assert max(seen) <= 2 * unit  # forward: the unit and one ahead
        assert handle.peak_resident_bytes <= 2 * unit < block_bytes  # backward too
    finally:
        handle.close()
    assert stowage.memory_allocated() >= before  # back on the device (and their gradients)


def test_device_memory_during_a_step_is_bounded_by_the_window_not_the_model() -> None:
    def peak_of_step(offload: bool) -> tuple[int, int]:
        model = tiny_gpt()
        handle = stowage.offload.parameters(model, prefetch=1) if offload else None
        torch.optim.AdamW(model.parameters(), lr=1e-2)
        peaks = []
        hook = torch.nn.modules.module.register_module_forward_hook(
            lambda *_: peaks.append(stowage.memory_allocated()))
        try:
            gpt_loss(model, 0).backward()
            peaks.append(stowage.memory_allocated())
        finally:
            hook.remove()
        window = 3 * max(handle._schedule.unit_bytes(u) for u in range(len(handle.units))) if handle else 0
        if handle is not None:
            handle.close()
        return max(peaks), window

    plain, _ = peak_of_step(False)
    offloaded, window = peak_of_step(True)
    block_bytes = sum(p.numel() * p.element_size() for p in tiny_gpt().blocks.parameters())
    # the blocks' parameters leave (their gradients too), the window stays
    assert offloaded <= plain - block_bytes + window


class TiedLm(torch.nn.Module):
    """Embedding, blocks and a head whose weight is the embedding's (a module call each)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(256, 64)
        self.blocks = torch.nn.ModuleList(DecoderBlock(64, 4) for _ in range(2))
        self.head = torch.nn.Linear(64, 256, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def tied_loss(model: Any, step: int) -> torch.Tensor:
    ids = tokens(step)
    return lm_loss(model(ids), ids)


def test_tied_weights_have_one_copy_and_one_gradient() -> None:
    units = lambda m: [m.embed, *m.blocks, m.head]  # noqa: E731
    ours = train(TiedLm, tied_loss, offload=True, units=units)
    assert_same(ours, train(TiedLm, tied_loss, offload=False))
    shared = [s for s in ours[2]._slots if len(s.places) == 2]
    assert len(shared) == 1 and shared[0].param is ours[2].units[0].weight  # one host parameter, one copy
    model = TiedLm()
    with pytest.raises(stowage.offload.ParameterOffloadError, match="tied weights"):
        stowage.offload.parameters(model, units=[model.embed])
    assert model.embed.weight.device == torch.device("cpu") and stowage.offload.parameters(model).close() is None


def test_a_parameter_used_outside_its_unit_s_forward_is_refused() -> None:
    model = tiny_gpt()  # its head multiplies by tokens.weight in the model's own forward
    with stowage.offload.parameters(model, units=[model.tokens]):
        with pytest.raises(stowage.offload.ParameterOffloadError, match="outside"):
            gpt_loss(model, 0).backward()


def test_writes_between_steps_are_seen_by_the_next_forward() -> None:
    def write(model: Any, step: int) -> None:
        p = model.blocks[1].attention.qkv.weight if hasattr(model.blocks[1], "attention") else \
            next(model.blocks[1].parameters())
        if step == 1:
            p.data.clamp_(-0.05, 0.05)
        if step == 2:
            p.data = p.data * 0.5  # a new storage, taken into host memory
            model.load_state_dict(model.state_dict())

    assert_same(train(tiny_gpt, gpt_loss, offload=True, between=write),
                train(tiny_gpt, gpt_loss, offload=False, between=write))


def test_eval_and_no_grad_bring_each_unit_in_and_let_it_go() -> None:
    model = tiny_gpt()
    reference = tiny_gpt()
    with stowage.offload.parameters(model) as handle:
        model.eval()
        reference.eval()
        with torch.no_grad():
            assert torch.equal(model(tokens(0)), reference(tokens(0)))
        assert handle.resident_bytes == 0
        assert all(p.device == torch.device("cpu") for p in model.parameters())


def halve(param: Any) -> None:
    param.grad.mul_(0.5)


def test_post_accumulate_and_tensor_hooks_of_the_host_parameter_run_as_torch_runs_them() -> None:
    def hooked(model: Any, step: int) -> None:
        if step == 0:
            for index, p in enumerate(model.blocks.parameters()):
                if index % 2:
                    p.register_post_accumulate_grad_hook(halve)
                else:
                    p.register_hook(lambda g: g.clamp(-1e-3, 1e-3))

    assert_same(train(tiny_gpt, gpt_loss, offload=True, between=hooked, micro=2),
                train(tiny_gpt, gpt_loss, offload=False, between=hooked, micro=2))


def test_close_puts_every_parameter_back_and_training_goes_on_as_torch_s() -> None:
    model, reference = tiny_gpt(), tiny_gpt()
    with stowage.offload.parameters(model):
        gpt_loss(model, 0).backward()
    gpt_loss(reference, 0).backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p.grad, q.grad) and torch.equal(p, q)
    gpt_loss(model, 1).backward()
    gpt_loss(reference, 1).backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), reference.parameters()))


def test_a_transformers_gpt2_from_config_trains_as_torch() -> None:
    transformers = pytest.importorskip("transformers")

    def make() -> Any:
        torch.manual_seed(0)
        config = transformers.GPT2Config(n_layer=3, n_embd=64, n_head=4, vocab_size=256, n_positions=32,
                                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        return transformers.GPT2LMHeadModel(config)

    def loss(model: Any, step: int) -> torch.Tensor:
        ids = tokens(step)
        return model(input_ids=ids, labels=ids).loss

    ours = train(make, loss, offload=True)
    assert_same(ours, train(make, loss, offload=False))
    assert len(ours[2].units) == 3  # the decoder blocks (transformer.h)


def test_a_lora_model_s_frozen_base_is_never_copied_back() -> None:
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")

    def make() -> Any:
        return lora_llama(transformers, peft)

    def loss(model: Any, step: int) -> torch.Tensor:
        ids = tokens(step)
        return model(input_ids=ids, labels=ids).loss

    out_before = stowage.offload.stats().get("offload.to_host.bytes", 0)
    ours = train(make, loss, offload=True)
    copied_out = stowage.offload.stats().get("offload.to_host.bytes", 0) - out_before
    assert_same(ours, train(make, loss, offload=False))
    handle = ours[2]
    adapters = sum(s.host.numel() * s.host.element_size() for s in handle._slots if s.param.requires_grad)
    base = sum(s.host.numel() * s.host.element_size() for s in handle._slots if not s.param.requires_grad)
    assert adapters > 0 and base > 10 * adapters
    assert copied_out == 3 * adapters  # each step's adapter gradients, nothing of the base


def test_refusals_name_what_cannot_be_kept_exact() -> None:
    model = tiny_gpt()
    with stowage.offload.parameters(model):
        loss = gpt_loss(model, 0)
        with pytest.raises(stowage.offload.ParameterOffloadError, match="create_graph"):
            loss.backward(create_graph=True)
    model = tiny_gpt()
    with stowage.offload.parameters(model):
        loss = gpt_loss(model, 0)
        p = next(model.blocks[0].parameters())
        with torch.no_grad():
            p.mul_(2.0)  # a write torch's backward would refuse too
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()
    model = tiny_gpt()
    with stowage.offload.parameters(model):
        loss = gpt_loss(model, 0)
        p = next(model.blocks[0].parameters())
        p.data = p.data * 2.0  # torch's graph would keep the old values
        with pytest.raises(stowage.offload.ParameterOffloadError, match="waits for backward"):
            gpt_loss(model, 1)
    sparse = torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Embedding(10, 4, sparse=True)]))
    with pytest.raises(stowage.offload.ParameterOffloadError, match="sparse"):
        stowage.offload.parameters(sparse)
    elsewhere = tiny_gpt()
    elsewhere.norm.to("meta")
    with pytest.raises(stowage.offload.ParameterOffloadError, match="one device"):
        stowage.offload.parameters(elsewhere)
    model = tiny_gpt()
    with stowage.offload.parameters(model):
        with pytest.raises(stowage.offload.ParameterOffloadError, match="already offloaded"):
            stowage.offload.parameters(model)
    with pytest.raises(ValueError, match="prefetch"):
        stowage.offload.parameters(tiny_gpt(), prefetch=-1)
    with contextlib.suppress(Exception):
        stowage.mark_step()


def test_a_model_trained_with_its_parameters_off_the_device_is_freed_with_its_handle() -> None:
    import gc
    import weakref

    model = tiny_gpt()
    handle = stowage.offload.parameters(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gpt_loss(model, 0).backward()
    optimizer.step()
    handle.close()
    refs = [weakref.ref(model), weakref.ref(handle), weakref.ref(next(model.blocks.parameters()))]
    del model, handle, optimizer
    gc.collect()
    assert [r() for r in refs] == [None, None, None]  # no hook keeps them through a cycle torch holds in C++


def test_stowage_s_offloaded_adamw_steps_the_host_parameters_as_torch_s_does() -> None:
    def run(offload: bool, kind: str) -> list[torch.Tensor]:
        model = tiny_gpt()
        handle = stowage.offload.parameters(model) if offload else None
        optimizer = (stowage.offload.AdamW(model.parameters(), lr=1e-2) if kind == "stowage"
                     else torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True))
        for step in range(3):
            gpt_loss(model, step).backward()
            optimizer.step()
            optimizer.zero_grad()
        params = [p.detach().clone() for p in model.parameters()]
        if handle is not None:
            handle.close()
        getattr(optimizer, "close", lambda: None)()
        return params

    for ours, theirs in zip(run(True, "stowage"), run(False, "torch")):
        assert torch.equal(ours, theirs)  # on a CPU the host kernel is torch's bit for bit


def test_a_device_copy_kept_past_its_unit_is_refused_not_read() -> None:
    model = tiny_gpt()
    kept: list[torch.Tensor] = []
    hook = model.blocks[0].mlp[0].register_forward_hook(lambda module, args, out: kept.append(module.weight))
    with stowage.offload.parameters(model):
        gpt_loss(model, 0).backward()
        hook.remove()
        assert kept and kept[0] is not model.blocks[0].mlp[0].weight  # the copy, freed since
        with pytest.raises(stowage.offload.ParameterOffloadError, match="outside its unit's forward"):
            kept[0].sum()
        with pytest.raises(stowage.offload.ParameterOffloadError, match="freed"):
            torch.nn.functional.linear(torch.ones(1, 64), kept[0])


class CountingTransfers:
    """Stands in for a handle's ParameterTransfers, counting the host's waits for every copy
    (synchronize) and passing every call on."""

    def __init__(self, transfers: Any) -> None:
        self.transfers, self.synchronized = transfers, 0

    def synchronize(self) -> None:
        self.synchronized += 1
        self.transfers.synchronize()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transfers, name)


def test_backward_sends_gradients_without_a_host_wait_for_each() -> None:
    model = tiny_gpt()
    with stowage.offload.parameters(model) as handle:
        counting = CountingTransfers(handle._transfers)
        handle._transfers = counting
        for step in range(2):
            gpt_loss(model, step).backward()
            assert counting.synchronized == 0  # no wait for all the copies issued so far, per gradient or at all
            assert counting.gradients_in_flight == 0 and not handle._sent  # every gradient landed and applied
        assert counting.host_waits == 0  # CPU mode: each copy has landed by the next gradient's hook
        transfers = counting.transfers
        assert 0 < transfers.peak_gradient_bytes_in_flight <= transfers.gradient_bound_bytes
        assert transfers.gradient_bound_bytes == max(handle._schedule.unit_bytes(u) for u in range(len(handle.units)))
    with pytest.raises(ValueError, match="gradient_bytes is a count of bytes"):
        stowage.offload.parameters(tiny_gpt(), gradient_bytes=-1)


def test_the_host_parameters_hooks_run_in_torch_s_order_on_complete_gradients() -> None:
    def seen_by_hooks(offload: bool) -> list[tuple[int, float]]:
        model = tiny_gpt()
        handle = stowage.offload.parameters(model, gradient_bytes=0) if offload else None
        seen: list[tuple[int, float]] = []
        for index, p in enumerate(model.parameters()):
            p.register_post_accumulate_grad_hook(lambda param, index=index: seen.append((index, param.grad.sum().item())))
        for step in range(3):  # micro-batches: the later ones add to the .grad on the host
            gpt_loss(model, step).backward()
        if handle is not None:
            handle.close()
        return seen

    offloaded = {i for i, (name, _) in enumerate(tiny_gpt().named_parameters()) if name.startswith("blocks.")}
    ours, theirs = seen_by_hooks(True), seen_by_hooks(False)
    # the host parameters' hooks run in torch's order among themselves (those of parameters on the
    # device run when torch runs them, and may come before the host ones made just before them)
    assert [s for s in ours if s[0] in offloaded] == [s for s in theirs if s[0] in offloaded]
    assert sorted(ours) == sorted(theirs)  # each hook saw the whole gradient accumulated so far


def test_a_backward_that_raises_leaves_the_gradients_torch_leaves() -> None:
    def raising_loss(model: Any, step: int) -> torch.Tensor:
        ids = tokens(step)
        x = model.tokens(ids) + model.positions(torch.arange(ids.shape[1]))
        for index, block in enumerate(model.blocks):
            x = block(x)
            if index == 1 and step == 0:
                x.register_hook(boom)  # backward raises once blocks 3 and 2 made their gradients
        return lm_loss(model.norm(x) @ model.tokens.weight.t(), ids)

    def run(offload: bool) -> tuple[list[Any], list[torch.Tensor]]:
        model = tiny_gpt()
        handle = stowage.offload.parameters(model) if offload else None
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
        with pytest.raises(RuntimeError, match="boom"):
            raising_loss(model, 0).backward()
        if handle is not None:
            assert not handle._sent  # landed before the exception reached us
        after_failure = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
        optimizer.zero_grad()
        for step in range(1, 3):  # and training goes on
            raising_loss(model, step).backward()
            optimizer.step()
            optimizer.zero_grad()
        params = [p.detach().clone() for p in model.parameters()]
        if handle is not None:
            handle.close()
        return after_failure, params

    (ours_grads, ours), (their_grads, theirs) = run(True), run(False)
    assert [g is None for g in ours_grads] == [g is None for g in their_grads]
    assert any(g is not None for g in ours_grads) and any(g is None for g in ours_grads)
    for a, b in zip(ours_grads, their_grads):
        assert a is None or torch.equal(a, b)
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)


def boom(grad: torch.Tensor) -> None:
    raise RuntimeError("boom")


def test_a_filled_device_copy_is_a_plain_parameter_and_a_freed_one_is_guarded() -> None:
    model = tiny_gpt()
    during: list[type] = []
    hook = model.blocks[0].mlp[0].register_forward_hook(lambda module, args, out: during.append(type(module.weight)))
    with stowage.offload.parameters(model) as handle:
        gpt_loss(model, 0).backward()
        hook.remove()
        assert during == [torch.nn.Parameter]  # no Python guard on the ops of the unit's forward
        for slot in handle._slots:
            assert type(slot.copy) is not torch.nn.Parameter and isinstance(slot.copy, torch.nn.Parameter)


class CountingStore:
    """Stands in for a handle's host store, counting the host buffers it hands out."""

    def __init__(self, store: Any) -> None:
        self.store, self.buffers = store, 0

    def empty(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        self.buffers += 1
        return self.store.empty(numel, dtype)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_micro_batches_add_through_reused_staging_not_a_buffer_a_gradient() -> None:
    model = tiny_gpt()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with stowage.offload.parameters(model) as handle:
        counting = CountingStore(handle._store)
        handle._store = counting
        offloaded = sum(1 for _ in model.blocks.parameters())
        for step in range(2):
            per_micro_batch = []
            for micro in range(4):
                before = counting.buffers
                gpt_loss(model, 4 * step + micro).backward()
                per_micro_batch.append(counting.buffers - before)
            optimizer.step()
            optimizer.zero_grad()  # set_to_none: the next step's first gradients land where the last ones did
            if step == 0:
                assert per_micro_batch[0] == offloaded
            else:  # the .grad buffers and the staging the first step made are reused: nothing pinned
                assert per_micro_batch == [0, 0, 0, 0]
        assert len(handle._spare_staging) <= 2  # no more than were in flight at once


def test_a_gradient_the_loop_kept_past_zero_grad_keeps_its_values() -> None:
    # zero_grad(set_to_none=True) lets .grad go; a loop that kept it (or a view of it) still holds
    # the values, which the next backward must not land in.
    ours, theirs = tiny_gpt(), tiny_gpt()
    with stowage.offload.parameters(ours):
        gpt_loss(ours, 0).backward()
        gpt_loss(theirs, 0).backward()
        block = next(ours.blocks.parameters())
        kept, kept_view = block.grad, block.grad[0]
        values = kept.clone()
        reused = [p.grad for p in ours.blocks.parameters()][1:]  # let go below: their memory may be reused
        del reused
        ours.zero_grad(set_to_none=True)
        theirs.zero_grad(set_to_none=True)
        gpt_loss(ours, 1).backward()
        gpt_loss(theirs, 1).backward()
        assert torch.equal(kept, values) and torch.equal(kept_view, values[0])
        assert block.grad.untyped_storage().data_ptr() != kept.untyped_storage().data_ptr()
        for mine, reference in zip(ours.parameters(), theirs.parameters()):
            assert torch.equal(mine.grad, reference.grad)


def test_the_default_gradient_bound_is_one_unit_s_trained_parameters() -> None:
    # A unit's frozen parameters (a LoRA base) make no gradient: the bytes in flight are bounded by
    # what one unit's gradients take, as fit's window counts them, not by its parameters'.
    model = tiny_gpt()
    for param in model.blocks.parameters():
        param.requires_grad_(param.dim() == 1)  # the biases and norms train, the matrices are frozen
    trained = max(sum(p.numel() * p.element_size() for p in block.parameters() if p.requires_grad)
                  for block in model.blocks)
    with stowage.offload.parameters(model) as handle:
        assert handle._transfers.gradient_bound_bytes == trained
