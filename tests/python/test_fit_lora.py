"""stowage.fit on a peft LoRA model (a Hugging Face Llama, its base frozen): optimizer states only
for the adapters, on the device or the host as the table says, and the adapters trained as
torch's AdamW trains them."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="tools/bootstrap installs transformers")
peft = pytest.importorskip("peft", reason="tools/bootstrap installs peft")

import stowage  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_mode_module")

COST = {"to_host_bytes_per_ms": 8e6, "to_device_bytes_per_ms": 8e6, "prefetch_depth": 2}
HYPER = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)


def lora_model() -> Any:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=2048, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    base = transformers.LlamaForCausalLM(config)
    lora = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    return peft.get_peft_model(base, lora)


def batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 2048, (4, 128), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}


def trained_adapters(model: Any, optimizer: Any, steps: int, step: Any) -> list[torch.Tensor]:
    for _ in range(steps):
        step(model, optimizer)
    return [p.detach().clone() for p in model.parameters() if p.requires_grad]


def test_a_lora_model_keeps_states_for_its_adapters_only_and_trains_as_torch() -> None:
    model = lora_model()
    trainable = [p for p in model.parameters() if p.requires_grad]
    frozen = [p for p in model.parameters() if not p.requires_grad]
    assert trainable and frozen
    # The base's gradients never exist: a budget that holds the model and a little more.
    budget = stowage.memory_allocated() + (64 << 20)
    fitted = stowage.fit(model, lambda params: torch.optim.AdamW(params, **HYPER), batch(), budget=budget,
                         cost=COST, verbose=False)
    memory = fitted.facts["memory"]
    assert memory.parameter_count == sum(p.numel() for p in trainable)
    assert memory.states == 2 * 4 * memory.parameter_count  # AdamW's two fp32 moments, adapters only
    assert fitted.chosen.host_bytes <= 16 * memory.parameter_count

    def fitted_step(m: Any, optimizer: Any) -> None:
        fitted.step(batch())

    ours = trained_adapters(model, fitted.optimizer, 3, fitted_step)
    optimizer_states = [s for s in fitted.optimizer.state.values() if s]
    assert len(optimizer_states) <= len(trainable)

    reference = lora_model()

    def torch_step(m: Any, optimizer: Any) -> None:
        m(**batch()).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    theirs = trained_adapters(reference, torch.optim.AdamW([p for p in reference.parameters() if p.requires_grad],
                                                            **HYPER), 3, torch_step)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(frozen, [p for p in reference.parameters() if not p.requires_grad]):
        assert torch.equal(a, b)  # the base is untouched
