"""Records the project's own allocation traces: real PyTorch workloads, random weights, on the CPU.

    python bench/traces/record_workloads.py [NAME ...]     # all of them when no name is given

Each workload runs three or more training steps (forward, backward, AdamW, zero_grad) at the
sizes people train on one GPU (peaks of 1 to 10 GiB), and is written to
bench/traces/NAME.pickle.gz in PyTorch's snapshot format (see README.md).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torchvision

from stowage.profiler_snapshot import profiled_snapshot, save_snapshot

HERE = Path(__file__).resolve().parent


def _training_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                   loss: Callable[[], torch.Tensor]) -> None:
    value = loss()
    value.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def resnet50_b32_3steps() -> Callable[[int], None]:
    """torchvision ResNet-50, batch 32 of 3x224x224 images (ImageNet shapes)."""
    model = torchvision.models.resnet50(weights=None)
    optimizer = torch.optim.AdamW(model.parameters())
    labels = torch.randint(0, 1000, (32,))
    return lambda step: _training_step(model, optimizer, lambda: torch.nn.functional.cross_entropy(
        model(torch.randn(32, 3, 224, 224)), labels))


def vit_b16_varbatch_4steps() -> Callable[[int], None]:
    """torchvision ViT-B/16 at 224x224 whose batch size changes each step."""
    model = torchvision.models.vit_b_16(weights=None)
    optimizer = torch.optim.AdamW(model.parameters())
    batches = [12, 20, 8, 16]
    return lambda step: _training_step(model, optimizer, lambda: torch.nn.functional.cross_entropy(
        model(torch.randn(batches[step], 3, 224, 224)), torch.randint(0, 1000, (batches[step],))))


class _CausalLM(torch.nn.Module):
    """A GPT-2-small-shaped decoder (d=768, 12 heads, 6 layers, 50257-token vocabulary)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50257, 768)
        self.position = torch.nn.Embedding(1024, 768)
        layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True, norm_first=True,
                                                 activation="gelu")
        self.blocks = torch.nn.TransformerEncoder(layer, num_layers=6)
        self.head = torch.nn.Linear(768, 50257, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        mask = torch.nn.Transformer.generate_square_subsequent_mask(length)
        hidden = self.embed(tokens) + self.position(torch.arange(length))
        logits = self.head(self.blocks(hidden, mask=mask, is_causal=True))
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                 tokens[:, 1:].reshape(-1))


def gpt2_varlen_4steps() -> Callable[[int], None]:
    """A GPT-2-small-shaped causal LM, batch 4, sequence length 256, 512, 320, 448."""
    model = _CausalLM()
    optimizer = torch.optim.AdamW(model.parameters())
    lengths = [256, 512, 320, 448]
    return lambda step: _training_step(model, optimizer, lambda: model(
        torch.randint(0, 50257, (4, lengths[step]))))


def gpt2_fixed_8steps() -> Callable[[int], None]:
    """The same causal LM, batch 4, sequence length 384 in every one of 8 steps: a steady loop,
    where learned placement has steps to place after it has seen two alike."""
    model = _CausalLM()
    optimizer = torch.optim.AdamW(model.parameters())
    return lambda step: _training_step(model, optimizer, lambda: model(
        torch.randint(0, 50257, (4, 384))))


def lstm_varlen_3steps() -> Callable[[int], None]:
    """A 3-layer LSTM (input 512, hidden 1024), batch 64, sequence length 120, 200, 90."""
    model = torch.nn.LSTM(512, 1024, num_layers=3, batch_first=True)
    optimizer = torch.optim.AdamW(model.parameters())
    lengths = [120, 200, 90]
    return lambda step: _training_step(model, optimizer, lambda: model(
        torch.randn(64, lengths[step], 512))[0].pow(2).mean())


def _image_classifier(model: torch.nn.Module, batch: int, side: int = 224) -> Callable[[int], None]:
    optimizer = torch.optim.AdamW(model.parameters())
    labels = torch.randint(0, 1000, (batch,))
    return lambda step: _training_step(model, optimizer, lambda: torch.nn.functional.cross_entropy(
        model(torch.randn(batch, 3, side, side)), labels))


def swin_t_b16_3steps() -> Callable[[int], None]:
    """torchvision Swin-T (windowed attention, shifted windows) at 224x224, batch 16."""
    return _image_classifier(torchvision.models.swin_t(weights=None), 16)


def vit_b16_b16_3steps() -> Callable[[int], None]:
    """torchvision ViT-B/16 at 224x224 with a fixed batch of 16."""
    return _image_classifier(torchvision.models.vit_b_16(weights=None), 16)


def convnext_tiny_b32_3steps() -> Callable[[int], None]:
    """torchvision ConvNeXt-T at 224x224, batch 32."""
    return _image_classifier(torchvision.models.convnext_tiny(weights=None), 32)


def densenet121_b32_3steps() -> Callable[[int], None]:
    """torchvision DenseNet-121 (concatenated feature maps) at 224x224, batch 32."""
    return _image_classifier(torchvision.models.densenet121(weights=None), 32)


def mobilenet_v3_b96_3steps() -> Callable[[int], None]:
    """torchvision MobileNetV3-Large (depthwise convolutions) at 224x224, batch 96."""
    return _image_classifier(torchvision.models.mobilenet_v3_large(weights=None), 96)


class _MaskedLM(torch.nn.Module):
    """A BERT-base-shaped encoder (d=768, 12 heads, 8 layers, 30,522-token vocabulary) trained
    on masked tokens, with padding masked out of attention."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(30522, 768)
        self.position = torch.nn.Embedding(512, 768)
        layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True, activation="gelu")
        self.blocks = torch.nn.TransformerEncoder(layer, num_layers=8, enable_nested_tensor=False)
        self.head = torch.nn.Linear(768, 30522)

    def forward(self, tokens: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(tokens) + self.position(torch.arange(tokens.shape[1]))
        logits = self.head(self.blocks(hidden, src_key_padding_mask=padding))
        masked = torch.rand(tokens.shape) < 0.15
        return torch.nn.functional.cross_entropy(logits[masked], tokens[masked])


def bert_varlen_4steps() -> Callable[[int], None]:
    """The masked LM with batch and length changing every step: (8, 128), (4, 384), (16, 64),
    (6, 256), the last quarter of each sequence padding."""
    model = _MaskedLM()
    optimizer = torch.optim.AdamW(model.parameters())
    shapes = [(8, 128), (4, 384), (16, 64), (6, 256)]

    def loss(step: int) -> torch.Tensor:
        batch, length = shapes[step]
        padding = torch.zeros(batch, length, dtype=torch.bool)
        padding[:, length - length // 4:] = True
        return model(torch.randint(0, 30522, (batch, length)), padding)

    return lambda step: _training_step(model, optimizer, lambda: loss(step))


def llama_gqa_cycle_6x4() -> Callable[[int], None]:
    """A Llama-style decoder with grouped-query attention (hidden 1024, 8 layers, 16 query and 4
    key/value heads, 32,000-token vocabulary; stowage.models.llama), batch 2, the sequence length
    cycling 512, 256, 384, 128 for six cycles: the variable-length loop of LLM fine-tuning."""
    from stowage.models.llama import Llama, LlamaShape

    model = Llama(LlamaShape(hidden=1024, layers=8, heads=16, kv_heads=4, vocab=32000))
    optimizer = torch.optim.AdamW(model.parameters())
    lengths = [512, 256, 384, 128]
    return lambda step: _training_step(model, optimizer, lambda: model(
        torch.randint(0, 32000, (2, lengths[step % 4]))))


WORKLOADS = {
    "resnet50_b32_3steps": (resnet50_b32_3steps, 3),
    "vit_b16_varbatch_4steps": (vit_b16_varbatch_4steps, 4),
    "gpt2_varlen_4steps": (gpt2_varlen_4steps, 4),
    "lstm_varlen_3steps": (lstm_varlen_3steps, 3),
    "gpt2_fixed_8steps": (gpt2_fixed_8steps, 8),
    "swin_t_b16_3steps": (swin_t_b16_3steps, 3),
    "vit_b16_b16_3steps": (vit_b16_b16_3steps, 3),
    "convnext_tiny_b32_3steps": (convnext_tiny_b32_3steps, 3),
    "densenet121_b32_3steps": (densenet121_b32_3steps, 3),
    "mobilenet_v3_b96_3steps": (mobilenet_v3_b96_3steps, 3),
    "bert_varlen_4steps": (bert_varlen_4steps, 4),
    "llama_gqa_cycle_6x4": (llama_gqa_cycle_6x4, 24),
}


def main(names: list[str]) -> int:
    torch.manual_seed(0)
    for name in names or list(WORKLOADS):
        make, steps = WORKLOADS[name]
        snapshot = profiled_snapshot(make(), steps)
        path = HERE / f"{name}.pickle.gz"
        save_snapshot(snapshot, path)
        events = snapshot["device_traces"][0]
        print(f"{path.name}: {len(events):,} events, {path.stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
