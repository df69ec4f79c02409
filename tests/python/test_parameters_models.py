"""stowage.offload.parameters and fit(offload_parameters="auto") on models stowage did not write
(bench/e2e/zoo_models.py: transformers, torchvision and peft at tiny sizes), in CPU mode: the units
found are the models' repeated blocks, the device lets go of their parameters' bytes, and two
AdamW steps equal plain torch's bit for bit (losses, the gradients the loop sees, parameters,
buffers such as BatchNorm's running statistics). bench/e2e/parameters_models.py runs the whole list
with step times and fit's budgets."""

from __future__ import annotations

import sys
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("torchvision")
pytest.importorskip("peft")

import stowage  # noqa: E402
import stowage.offload  # noqa: E402
from conftest import REPO  # noqa: E402
from stowage import step_context  # noqa: E402

sys.path.insert(0, str(REPO / "bench" / "e2e"))
from parameters_models import differences, fit_trace, sgd, trace  # noqa: E402
from zoo_models import CASES  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_mode_module")

# The units each model's blocks make: the module lists that hold them, with counts.
UNITS = {
    "gpt2": "transformer.h x3",
    "gpt2_checkpointing": "transformer.h x3",
    "llama_checkpointing_bf16": "model.layers x3",
    "qwen2_tied": "model.layers x3",
    "mixtral": "model.layers x3",
    "bert_mlm": "bert.encoder.layer x3",
    "t5_checkpointing": "encoder.block x2, decoder.block x2",
    "switch": "encoder.block x2, decoder.block x2",
    "vit_hf": "vit.layers x3",
    "resnet18": "layer1 x2, layer2 x2, layer3 x2, layer4 x2",
    "vit_b_16": "encoder.layers x4, heads x1",
    "llama_lora": "base_model.model.model.layers x3",
    "llama_lora_reentrant": "base_model.model.model.layers x3",
    "albert": "albert.encoder.albert_layer_groups x1",
}


@pytest.mark.parametrize("name", sorted(UNITS))
def test_the_blocks_leave_the_device_and_two_steps_are_torch_s_bitwise(name: str) -> None:
    case = CASES[name]
    theirs = trace(case, offload=False, steps=2)
    ours = trace(case, offload=True, steps=2)
    assert ours["units"] == UNITS[name]
    # The device lets go of the units' parameters' bytes (each rounded up to the allocator's 512 B).
    assert ours["unit_bytes"] <= ours["saved"] <= ours["unit_bytes"] + 512 * len(ours["names"])
    assert differences(ours, theirs) == []


def test_the_comparison_sees_a_one_step_difference() -> None:
    """The check above can fail: a trace with one step's update scaled differs from torch's."""
    case = CASES["gpt2"]
    theirs = trace(case, offload=False, steps=2)
    ours = trace(case, offload=True, steps=2)
    ours["params"][1][0] = ours["params"][1][0] * 1.0001
    assert differences(ours, theirs) == [f"step 1: parameter {ours['names'][0]}"]


def test_some_experts_have_no_gradient_in_a_step_and_keep_torch_s_none() -> None:
    """Switch Transformers' experts are modules of their own: with six tokens a step some see
    none; their .grad stays None as torch leaves it (and AdamW skips them), step after step."""
    ours = trace(CASES["switch"], offload=True, steps=2)
    without = [[n for n, g in step.items() if g is None] for step in ours["grads"]]
    assert all(any("experts" in n for n in names) for names in without)
    assert without[0] != without[1]


def test_a_recomputation_that_runs_a_block_s_forward_without_its_hooks_reads_the_device_copies() -> None:
    """transformers checkpoints a layer's forward, not its call, so the recomputation in backward
    runs without the unit's hooks: it reads the device copies all the same (the host parameters,
    on a GPU, are on another device)."""
    model = CASES["gpt2_checkpointing"].build()
    handle = stowage.offload.parameters(model)
    host = {id(p) for p in model.parameters()}
    seen: list[tuple[bool, bool]] = []
    mlp = model.transformer.h[1].mlp.c_fc
    mlp.register_forward_pre_hook(lambda m, _: seen.append((step_context.in_backward(), id(m.weight) in host)))
    try:
        CASES["gpt2_checkpointing"].step_loss(model, 0).backward()
    finally:
        handle.close()
    assert seen == [(False, False), (True, False)]


def test_auto_puts_the_blocks_on_the_host_where_the_device_option_cannot_fit_and_trains_bitwise() -> None:
    """At a room below the device option's need (torch's SGD: no states to move), fit's default
    refuses and offload_parameters="auto" keeps the blocks' parameters on the host, torch's steps."""
    case = CASES["gpt2"]
    room = int(17.2 * (1 << 20))  # (bench/e2e/parameters_models.py --fit: the device option needs 17.38 MiB)
    with pytest.raises(torch.OutOfMemoryError, match="does not fit"):
        fit_trace(case, 1, room, False)
    ours = fit_trace(case, 2, room, "auto")
    assert ours["on_host"]
    assert differences(ours, {**trace(case, offload=False, steps=2, factory=sgd), "grads": []}) == []


def test_a_forward_without_backward_does_not_keep_the_blocks_held_through_later_backwards() -> None:
    """A forward with grad that is never backpropagated (a validation loss outside no_grad, its
    graph dropped) must not make every block look called twice in the next forward: backward lets
    each block go once it has passed it, the device holding the window, not every block."""
    case = CASES["gpt2"]
    model = case.build()
    handle = stowage.offload.parameters(model, prefetch=1)
    seen: list[int] = []
    for p in model.transformer.h.parameters():
        p.register_post_accumulate_grad_hook(lambda _: seen.append(handle.resident_bytes))
    unit = max(handle._schedule.unit_bytes(u) for u in range(len(handle.units)))
    try:
        case.step_loss(model, 0)  # dropped
        for step in range(3):
            seen.clear()
            case.step_loss(model, step).backward()
            model.zero_grad()
            assert max(seen) <= 2 * unit, step  # every step, the first too: the block and the one ahead
    finally:
        handle.close()
