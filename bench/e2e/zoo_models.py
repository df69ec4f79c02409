"""Models stowage did not write, at tiny sizes from their configurations (no download), each with
its batches and its loss: transformers' decoders (GPT-2, Llama, Qwen2 with tied embeddings,
Mixtral's experts as one tensor a layer), Switch Transformers (experts as modules of their own:
some without a gradient in a step), BERT's masked LM, ALBERT (one layer shared by every depth), T5
(encoder and decoder, shared embeddings, a relative attention bias in each stack's first block),
ViT; torchvision's resnet18 (BatchNorm), convnext_tiny's layout at a quarter width, vit_b_16's at
a small image; peft's LoRA on Llama, also under reentrant checkpointing.
bench/e2e/parameters_models.py and tests/python/test_parameters_models.py train them.

A case's `build()` seeds and returns a fresh model in training mode, made on the CPU (CPU mode's
device where stowage is enabled with device="cpu"); `batch(step)` the same inputs for the same
step; `run(model, batch)` the scalar to differentiate, under bf16 autocast where `autocast`.
Names with _checkpointing turn on transformers' (non-reentrant) gradient checkpointing.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable

import torch

SEQ = 16
VOCAB = 128


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], Any]
    batch: Callable[[int], dict[str, torch.Tensor]]
    loss: Callable[[Any, dict[str, torch.Tensor]], torch.Tensor]
    autocast: bool = False

    def run(self, model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The loss of `batch` (under bf16 autocast where the case says so)."""
        with torch.autocast("cpu", dtype=torch.bfloat16) if self.autocast else contextlib.nullcontext():
            return self.loss(model, batch)

    def step_loss(self, model: Any, step: int) -> torch.Tensor:
        return self.run(model, self.batch(step))


def _generator(step: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + step)


def token_batch(step: int, rows: int = 2) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(0, VOCAB, (rows, SEQ), generator=_generator(step))}


def few_token_batch(step: int) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(0, VOCAB, (1, 6), generator=_generator(step))}


def image_batch(step: int, size: int = 32, rows: int = 2, classes: int = 10) -> dict[str, torch.Tensor]:
    g = _generator(step)
    return {"images": torch.randn(rows, 3, size, size, generator=g),
            "labels": torch.randint(0, classes, (rows,), generator=g)}


def causal_lm_loss(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss


def masked_lm_loss(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    ids = batch["input_ids"]
    labels = torch.where(torch.arange(ids.numel()).view_as(ids) % 4 == 0, ids, torch.full_like(ids, -100))
    return model(input_ids=ids, labels=labels).loss


def seq2seq_loss(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    ids = batch["input_ids"]
    return model(input_ids=ids, labels=ids.flip(1)).loss


def image_classifier_loss(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = model(batch["images"])
    logits = getattr(logits, "logits", logits)
    return torch.nn.functional.cross_entropy(logits, batch["labels"])


def _seeded(make: Callable[[], Any], checkpointing: bool = False) -> Callable[[], Any]:
    """`make` from seed 0, in training mode; `checkpointing`: transformers' (non-reentrant)."""

    def build() -> Any:
        torch.manual_seed(0)
        model = make()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return model.train()

    return build


_DECODER = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def gpt2() -> Any:
    import transformers

    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=3, n_head=4)
    return transformers.GPT2LMHeadModel(config)


def llama() -> Any:
    import transformers

    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**_DECODER))


def qwen2_tied() -> Any:
    import transformers

    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**_DECODER, tie_word_embeddings=True))


def mixtral() -> Any:
    """Four experts, two a token (transformers holds a layer's experts as one tensor each)."""
    import transformers

    config = transformers.MixtralConfig(**_DECODER, num_local_experts=4, num_experts_per_tok=2)
    return transformers.MixtralForCausalLM(config)


def bert_mlm() -> Any:
    import transformers

    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0)
    return transformers.BertForMaskedLM(config)


def t5() -> Any:
    import transformers

    config = transformers.T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                   num_decoder_layers=2, num_heads=4, dropout_rate=0.0, decoder_start_token_id=0)
    return transformers.T5ForConditionalGeneration(config)


def switch() -> Any:
    """Switch Transformers: T5's layout with every other feed-forward eight experts, each its own
    module, one a token. With a few tokens a step (few_token_batch) some experts see none: their
    parameters have no gradient that step, some that had one the step before."""
    import transformers

    config = transformers.SwitchTransformersConfig(
        vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, expert_capacity=8, num_layers=2, num_sparse_encoder_layers=1,
        num_decoder_layers=2, num_sparse_decoder_layers=1, num_heads=4, num_experts=8, dropout_rate=0.0,
        router_jitter_noise=0.0, decoder_start_token_id=0)
    return transformers.SwitchTransformersForConditionalGeneration(config)


def vit_hf() -> Any:
    import transformers

    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=3,
                                    num_attention_heads=4, intermediate_size=128, num_labels=10,
                                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return transformers.ViTForImageClassification(config)


def resnet18() -> Any:
    import torchvision

    return torchvision.models.resnet18(num_classes=10)


def convnext_small_width() -> Any:
    """convnext_tiny's layout (3, 3, 9, 3 blocks; layer scale, stochastic depth off) at a quarter of
    its width."""
    import torchvision
    from torchvision.models.convnext import CNBlockConfig

    settings = [CNBlockConfig(24, 48, 3), CNBlockConfig(48, 96, 3), CNBlockConfig(96, 192, 9), CNBlockConfig(192, None, 3)]
    return torchvision.models.convnext.ConvNeXt(settings, stochastic_depth_prob=0.0, num_classes=10)


def vit_b_16_small() -> Any:
    """vit_b_16's patch and layout at 4 layers, width 64, on 32 x 32 images."""
    import torchvision

    return torchvision.models.VisionTransformer(image_size=32, patch_size=16, num_layers=4, num_heads=4,
                                                hidden_dim=64, mlp_dim=128, num_classes=10)


def llama_lora() -> Any:
    import peft

    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    return peft.get_peft_model(llama(), config)


def albert() -> Any:
    """ALBERT: one layer's parameters shared by every depth (its one block runs four times a forward)."""
    import transformers

    config = transformers.AlbertConfig(vocab_size=VOCAB, embedding_size=32, hidden_size=64, num_hidden_layers=4,
                                       num_attention_heads=4, intermediate_size=128, max_position_embeddings=64,
                                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return transformers.AlbertForMaskedLM(config)


def llama_lora_reentrant() -> Any:
    """peft's usual recipe for LoRA under checkpointing: reentrant checkpoints, the embeddings'
    output made to require grad (enable_input_require_grads) so the frozen blocks pass gradients."""
    import peft

    model = llama()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.enable_input_require_grads()
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    return peft.get_peft_model(model, config)


CASES: dict[str, Case] = {case.name: case for case in (
    Case("gpt2", _seeded(gpt2), token_batch, causal_lm_loss),
    Case("gpt2_checkpointing", _seeded(gpt2, checkpointing=True), token_batch, causal_lm_loss),
    Case("llama", _seeded(llama), token_batch, causal_lm_loss),
    Case("llama_checkpointing_bf16", _seeded(llama, checkpointing=True), token_batch, causal_lm_loss, autocast=True),
    Case("qwen2_tied", _seeded(qwen2_tied), token_batch, causal_lm_loss),
    Case("mixtral", _seeded(mixtral), token_batch, causal_lm_loss),
    Case("bert_mlm", _seeded(bert_mlm), token_batch, masked_lm_loss),
    Case("t5", _seeded(t5), token_batch, seq2seq_loss),
    Case("t5_checkpointing", _seeded(t5, checkpointing=True), token_batch, seq2seq_loss),
    Case("switch", _seeded(switch), few_token_batch, seq2seq_loss),
    Case("vit_hf", _seeded(vit_hf), image_batch, image_classifier_loss),
    Case("resnet18", _seeded(resnet18), image_batch, image_classifier_loss),
    Case("convnext", _seeded(convnext_small_width), image_batch, image_classifier_loss),
    Case("vit_b_16", _seeded(vit_b_16_small), image_batch, image_classifier_loss),
    Case("llama_lora", _seeded(llama_lora), token_batch, causal_lm_loss),
    Case("llama_lora_reentrant", _seeded(llama_lora_reentrant), token_batch, causal_lm_loss),
    Case("albert", _seeded(albert), token_batch, masked_lm_loss),
)}
