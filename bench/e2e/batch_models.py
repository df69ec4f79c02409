"""The models of bench/e2e/fit_batches.py: third-party architectures (Hugging Face transformers,
torchvision) and two of stowage's own, each built small enough for a CPU-mode device, with a
batch of ``rows`` rows, its loss, and stock PyTorch's full activation checkpointing.

Contract: ``build(name)`` draws weights from torch's global generator (the caller seeds it) and
returns (model, make_batch, loss_fn, kind), ``make_batch(rows)`` the same rows for the same count; ``full_checkpointing(model)`` makes every block
recompute in backward the way a user would: Hugging Face's ``gradient_checkpointing_enable``
(non-reentrant), elsewhere torch's checkpoint wrapper on each item of the model's block lists.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

SEQ = 256
VOCAB = 4096
DECODERS = ("llama", "gpt2", "hf_llama", "mistral", "qwen2", "opt")
OTHERS = ("bert", "t5", "vit", "convnext", "resnet18", "mlp")
MODELS = DECODERS + OTHERS


def _tokens(rows: int, length: int = SEQ, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randint(0, vocab, (rows, length), generator=torch.Generator().manual_seed(rows))


def _hf_loss(model: Any, batch: Any) -> torch.Tensor:
    return model(**batch).loss


def _causal(name: str) -> Any:
    import transformers as hf

    shape = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=6, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=SEQ)
    if name == "gpt2":
        model = hf.GPT2LMHeadModel(hf.GPT2Config(n_layer=6, n_embd=256, n_head=4, vocab_size=VOCAB, n_positions=SEQ,
                                                    bos_token_id=0, eos_token_id=0))
    elif name == "hf_llama":
        model = hf.LlamaForCausalLM(hf.LlamaConfig(**shape))
    elif name == "mistral":  # sliding-window attention: masks that vary inside a block
        model = hf.MistralForCausalLM(hf.MistralConfig(**shape, sliding_window=64))
    elif name == "qwen2":
        model = hf.Qwen2ForCausalLM(hf.Qwen2Config(**shape))
    else:
        model = hf.OPTForCausalLM(hf.OPTConfig(hidden_size=256, ffn_dim=1024, num_hidden_layers=6,
                                               num_attention_heads=4, vocab_size=VOCAB, max_position_embeddings=SEQ,
                                               word_embed_proj_dim=256))
    return model


def _labelled(rows: int) -> dict[str, torch.Tensor]:
    ids = _tokens(rows)
    return {"input_ids": ids, "labels": ids.clone()}


def _images(rows: int, classes: int = 100, size: int = 96) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(rows)
    return torch.randn(rows, 3, size, size, generator=generator), torch.randint(0, classes, (rows,), generator=generator)


def _cross_entropy(model: Any, batch: Any) -> torch.Tensor:
    return F.cross_entropy(model(batch[0]), batch[1])


def _vision(name: str) -> Any:
    import torchvision
    from torchvision.models.convnext import CNBlockConfig

    if name == "vit":
        model = torchvision.models.VisionTransformer(image_size=96, patch_size=8, num_layers=6, num_heads=4,
                                                     hidden_dim=256, mlp_dim=1024, num_classes=100)
    elif name == "convnext":
        stages = [CNBlockConfig(64, 128, 2), CNBlockConfig(128, 256, 2), CNBlockConfig(256, 512, 4),
                  CNBlockConfig(512, None, 2)]
        model = torchvision.models.convnext.ConvNeXt(stages, num_classes=100)
    else:
        model = torchvision.models.resnet18(num_classes=100)
    return model


Batches = Callable[[int], Any]
LossFn = Callable[[Any, Any], torch.Tensor]


def build(name: str) -> tuple[Any, Batches, LossFn, str]:
    """(model, batch of a number of rows, loss_fn, what the model is)."""
    if name == "llama":
        from stowage.models.llama import Llama, LlamaShape

        model = Llama(LlamaShape(hidden=256, layers=6, heads=4, kv_heads=2, vocab=VOCAB, max_sequence=SEQ))
        return model, _tokens, lambda m, tokens: m.chunked_loss(tokens, chunks=8), "decoder (stowage's Llama)"
    if name in DECODERS:
        model = _causal(name)
        return model, _labelled, _hf_loss, f"decoder (transformers {type(model).__name__})"
    if name == "bert":
        import transformers as hf

        model = hf.BertForSequenceClassification(hf.BertConfig(
            hidden_size=256, num_hidden_layers=6, num_attention_heads=4, intermediate_size=1024, vocab_size=VOCAB,
            max_position_embeddings=SEQ, num_labels=4))
        return model, lambda rows: {"input_ids": _tokens(rows), "labels": torch.randint(0, 4, (rows,))}, _hf_loss, \
            "encoder (transformers BertForSequenceClassification)"
    if name == "t5":
        import transformers as hf

        model = hf.T5ForConditionalGeneration(hf.T5Config(d_model=256, d_ff=1024, d_kv=64, num_layers=4,
                                                          num_decoder_layers=4, num_heads=4, vocab_size=VOCAB,
                                                          decoder_start_token_id=0, pad_token_id=0))
        return model, lambda rows: {"input_ids": _tokens(rows), "labels": _tokens(rows, 64)}, _hf_loss, \
            "encoder-decoder (transformers T5ForConditionalGeneration)"
    if name in ("vit", "convnext", "resnet18"):
        model = _vision(name)
        return model, _images, _cross_entropy, f"vision (torchvision {type(model).__name__})"
    blocks = [torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024),
                                  torch.nn.GELU()) for _ in range(4)]
    model = torch.nn.Sequential(torch.nn.Sequential(*blocks), torch.nn.Linear(1024, 100))

    def rows_of_features(rows: int) -> Any:
        generator = torch.Generator().manual_seed(rows)
        return torch.randn(rows, 1024, generator=generator), torch.randint(0, 100, (rows,), generator=generator)

    return model, rows_of_features, _cross_entropy, "MLP (8 Linear+GELU, 1024 wide)"


def _blocks(model: Any) -> list[Any]:
    """The items of the model's block lists: every ModuleList / Sequential of two or more modules
    of one class that have children (layers, stages' blocks), innermost lists left to their block."""
    found: list[Any] = []
    for module in model.modules():
        if not isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
            continue
        items = list(module.children())
        if len(items) >= 2 and len({type(i) for i in items}) == 1 and all(any(True for _ in i.children()) for i in items):
            found += items
    inner = {id(m) for block in found for m in block.modules() if m is not block}
    return [block for block in found if id(block) not in inner]


def full_checkpointing(model: Any) -> int:
    """Every block recomputed in backward; returns how many blocks."""
    if hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return sum(1 for m in model.modules() if getattr(m, "gradient_checkpointing", False))
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

    blocks = {id(block) for block in _blocks(model)}
    apply_activation_checkpointing(model, check_fn=lambda m: id(m) in blocks)
    return len(blocks)
