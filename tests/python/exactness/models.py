"""The exactness suite's models: small, built in the test code (the Llama-style decoder is the
package's), each with its batches, its loss and the one module whose output a later op saves.

Contract: ``ModelSpec.build(scale)`` draws its weights from torch's global CPU generator (the
caller seeds it) and returns the model on ``ModelSpec.device``; ``ModelSpec.batch(step, scale)``
is the same tensors for the same step on that device, drawn on the CPU from a generator of its
own (the global ones are left alone, so dropout's stream is the training's own). A model on a
GPU (``spec(name, "cuda")``) is the CPU model moved there: the same weights and batches on every
device. Every op has a deterministic CUDA kernel under torch.use_deterministic_algorithms (a
mean for adaptive average pooling, a per-pixel loss over flattened pixels: their usual kernels
have none and raise there).
``ModelSpec.units`` counts what a batch's loss is a mean over (rows, unless the loss says
otherwise: BERT's masked tokens, the LSTM's labelled tokens, the ViT's labelled rows, the LoRA
model's per-row weights), for loops that accumulate micro-batches to weight each loss by.
Blocks sit in ``nn.ModuleList`` / ``nn.Sequential`` so a plan can recompute them; no parameter
is mathematically without gradient (a bias before a normalisation), whose rounding noise Adam
would blow up to whole steps and make the measured tolerance meaningless.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch
from torch import nn
from torch.nn import functional as F

from stowage.models.llama import Llama, LlamaShape

VOCAB = 128


@dataclass(frozen=True)
class ModelSpec:
    """A model of the matrix. ``probe``: the path of a module whose output a later op saves for
    backward (the in-place and ``.data`` patterns change it between forward and backward);
    ``block_probe``: one inside a block (an item of the model's block list, which a plan may
    recompute) whose output a later op of that block saves (the LSTM has no block list: its
    blocks are the model's children, and its probe is one of them). ``units``: how many of what
    its loss averages a batch holds (rows by default). ``fit_loss_units``: what the
    fit.micro_batches cell tells fit the loss averages, where fit's own check of a cut must refuse
    (None: fit checks it)."""

    name: str
    build: Callable[[int], nn.Module]
    batch: Callable[[int, int], Any]
    loss: Callable[[nn.Module, Any], torch.Tensor]
    probe: str
    block_probe: str
    device: str = "cpu"
    units: Callable[[Any], float] = lambda batch: float(_first(batch).shape[0])
    fit_loss_units: str | None = None

    def on(self, device: str) -> ModelSpec:
        """This model on `device` ("cpu": itself): built on the CPU and moved there, its batches
        made on the CPU and moved there."""
        if device == self.device:
            return self
        build, batch = self.build, self.batch
        return replace(self, build=lambda scale: build(scale).to(device),
                       batch=lambda step, scale: moved(batch(step, scale), device), device=device)


def _first(batch: Any) -> torch.Tensor:
    return batch if isinstance(batch, torch.Tensor) else batch[0]


def _labelled(labels: torch.Tensor) -> float:
    """The entries a loss with ignore_index=-100 averages over."""
    return float((labels != -100).sum())


def moved(batch: Any, device: str) -> Any:
    """A batch (a tensor or a tuple of tensors) on `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    return tuple(moved(part, device) for part in batch)


def _generator(step: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + step)


def _tokens(step: int, rows: int, length: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (rows, length), generator=_generator(step))


def _next_token_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


# --- a GPT-style decoder with tied embeddings --------------------------------------------------

class GptBlock(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.q = nn.Linear(width, width)
        self.kv = nn.Linear(width, 2 * width, bias=False)  # a key bias has no gradient (softmax)
        self.out = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        h = self.norm1(x)
        shape = (batch, length, self.heads, width // self.heads)
        q = self.q(h).view(shape).transpose(1, 2)
        k, v = (t.reshape(shape).transpose(1, 2) for t in self.kv(h).split(width, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.out(y.transpose(1, 2).reshape(batch, length, width)))
        return x + self.drop(self.mlp(self.norm2(x)))


class Gpt(nn.Module):
    def __init__(self, width: int, heads: int, layers: int, length: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, width)
        self.positions = nn.Embedding(length, width)
        self.blocks = nn.ModuleList(GptBlock(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        for parameter in self.parameters():
            if parameter.dim() > 1:
                nn.init.normal_(parameter, std=1 / math.sqrt(width))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tokens(tokens) + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.tokens.weight.t()  # the head is the embedding


def gpt_spec() -> ModelSpec:
    return ModelSpec("gpt", lambda s: Gpt(64, 4, 2, 32 * s), lambda step, s: _tokens(step, 4, 32 * s),
                     lambda model, tokens: _next_token_loss(model(tokens), tokens), "norm",
                     "blocks.0.mlp.1")


def deep_spec() -> ModelSpec:
    """The GPT decoder six blocks deep (fit.parameters.auto's model: a window of a few blocks'
    parameters is much less than all of them, so a budget can leave room for them on the host alone)."""
    return ModelSpec("deep", lambda s: Gpt(128, 4, 6, 16 * s), lambda step, s: _tokens(step, 4, 16 * s),
                     lambda model, tokens: _next_token_loss(model(tokens), tokens), "norm", "blocks.0.mlp.1")


# --- the package's Llama-style GQA decoder ----------------------------------------------------

def llama_spec() -> ModelSpec:
    def build(scale: int) -> nn.Module:
        return Llama(LlamaShape(hidden=64, layers=2, heads=4, kv_heads=2, vocab=VOCAB, max_sequence=32 * scale))

    return ModelSpec("llama", build, lambda step, s: _tokens(step, 4, 32 * s),
                     lambda model, tokens: model.chunked_loss(tokens, chunks=2), "blocks.1.mlp_norm",
                     "blocks.0.mlp_norm")


# --- a BERT-style encoder with dropout (masked tokens) ---------------------------------------

class Bert(nn.Module):
    def __init__(self, width: int, layers: int, length: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB + 1, width)  # the last id is [MASK]
        self.positions = nn.Parameter(torch.randn(length, width) * 0.02)
        self.drop = nn.Dropout(0.1)
        layer = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.1, batch_first=True, bias=False)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.tokens(tokens) + self.positions[: tokens.shape[1]])
        return self.head(self.norm(self.encoder(x)))


def _masked(step: int, scale: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = _tokens(step, 4, 32 * scale)
    chosen = torch.rand(tokens.shape, generator=_generator(step + 500)) < 0.25
    return tokens.masked_fill(chosen, VOCAB), tokens.masked_fill(~chosen, -100)


def bert_spec() -> ModelSpec:
    def loss(model: nn.Module, batch: Any) -> torch.Tensor:
        inputs, labels = batch
        return F.cross_entropy(model(inputs).reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100)

    return ModelSpec("bert", lambda s: Bert(64, 2, 32 * s), _masked, loss, "norm", "encoder.layers.0.norm1",
                     units=lambda b: _labelled(b[1]))


# --- an encoder-decoder (nn.Transformer) ------------------------------------------------------

class EncoderDecoder(nn.Module):
    def __init__(self, width: int, length: int) -> None:
        super().__init__()
        self.source = nn.Embedding(VOCAB, width)
        self.target = nn.Embedding(VOCAB, width)
        self.positions = nn.Parameter(torch.randn(length, width) * 0.02)
        with warnings.catch_warnings():  # (nested tensors are for inference; these train)
            warnings.simplefilter("ignore")
            self.transformer = nn.Transformer(width, 4, 2, 2, 2 * width, dropout=0.1, batch_first=True, bias=False)
        self.head = nn.Linear(width, VOCAB)

    def forward(self, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(target.shape[1], device=target.device)
        src = self.source(source) + self.positions[: source.shape[1]]
        tgt = self.target(target) + self.positions[: target.shape[1]]
        return self.head(self.transformer(src, tgt, tgt_mask=mask, tgt_is_causal=True))


def encdec_spec() -> ModelSpec:
    def batch(step: int, scale: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _tokens(step, 4, 24 * scale), _tokens(step + 300, 4, 16 * scale)

    return ModelSpec("encdec", lambda s: EncoderDecoder(64, 24 * s), batch,
                     lambda model, b: _next_token_loss(model(*b), b[1]), "transformer.decoder.norm",
                     "transformer.decoder.layers.0.norm1")


# --- a ResNet with BatchNorm and in-place ReLU -----------------------------------------------

class BasicBlock(nn.Module):
    """torchvision's BasicBlock: convolutions without bias before BatchNorm, in-place ReLU."""

    def __init__(self, inputs: int, outputs: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.downsample = None if stride == 1 and inputs == outputs else nn.Sequential(
            nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class GlobalAveragePool(nn.Module):
    """``nn.AdaptiveAvgPool2d(1)`` as a mean over the pixels: adaptive pooling's CUDA backward has
    no deterministic kernel (it raises under torch.use_deterministic_algorithms), a mean's has."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(-2, -1), keepdim=True)


class ResNet(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(inplace=True))
        self.layers = nn.Sequential(BasicBlock(width, width, 1), BasicBlock(width, 2 * width, 2),
                                    BasicBlock(2 * width, 2 * width, 1))
        self.pool = GlobalAveragePool()
        self.fc = nn.Linear(2 * width, 10)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.layers(self.stem(images))), 1))


def _images(step: int, rows: int, side: int, classes: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    generator = _generator(step)
    images = torch.randn(rows, 3, side, side, generator=generator)
    return images, torch.randint(0, classes, (rows,), generator=generator)


def resnet_spec() -> ModelSpec:
    return ModelSpec("resnet", lambda s: ResNet(16 * s), lambda step, s: _images(step, 8, 24 * s),
                     lambda model, b: F.cross_entropy(model(b[0]), b[1]), "pool", "layers.0.bn1")


# --- a ViT ------------------------------------------------------------------------------------

class VitBlock(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, dropout=0.1, batch_first=True, bias=False)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Dropout(0.1), nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attention(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class Vit(nn.Module):
    def __init__(self, width: int, patch: int, side: int) -> None:
        super().__init__()
        self.patches = nn.Conv2d(3, width, patch, patch)
        self.cls = nn.Parameter(torch.randn(1, 1, width) * 0.02)
        self.positions = nn.Parameter(torch.randn(1, (side // patch) ** 2 + 1, width) * 0.02)
        self.blocks = nn.Sequential(VitBlock(width, 4), VitBlock(width, 4))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 10)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patches(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.positions
        return self.head(self.norm(self.blocks(x))[:, 0])


def _padded_images(step: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Images whose last 1-3 rows are padding (the end of an epoch), their labels -100."""
    images, labels = _images(step, 8, side)
    labels[8 - 1 - step % 3:] = -100
    return images, labels


def vit_spec() -> ModelSpec:
    return ModelSpec("vit", lambda s: Vit(64, 4, 16 * s), lambda step, s: _padded_images(step, 16 * s),
                     lambda model, b: F.cross_entropy(model(b[0]), b[1]), "norm", "blocks.0.norm2",
                     units=lambda b: _labelled(b[1]))


# --- a UNet with skip concatenations ----------------------------------------------------------

def _conv_block(inputs: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(inputs, outputs, 3, padding=1), nn.GroupNorm(4, outputs), nn.SiLU(),
                         nn.Conv2d(outputs, outputs, 3, padding=1), nn.SiLU())


class UNet(nn.Module):
    def __init__(self, width: int = 16, classes: int = 4) -> None:
        super().__init__()
        self.down = nn.ModuleList([_conv_block(3, width), _conv_block(width, 2 * width)])
        self.middle = _conv_block(2 * width, 4 * width)
        self.rise = nn.ModuleList([nn.ConvTranspose2d(4 * width, 2 * width, 2, 2),
                                   nn.ConvTranspose2d(2 * width, width, 2, 2)])
        self.up = nn.ModuleList([_conv_block(4 * width, 2 * width), _conv_block(2 * width, width)])
        self.out = nn.Conv2d(width, classes, 1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        skips, x = [], images
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = self.middle(x)
        for rise, block in zip(self.rise, self.up):
            x = block(torch.cat([rise(x), skips.pop()], dim=1))
        return self.out(x)


def _pixel_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy per pixel, the pixels flattened into rows: over (N, C, H, W) torch's CUDA
    loss sums with atomics (no deterministic kernel; it raises under
    torch.use_deterministic_algorithms), over rows it does not."""
    return F.cross_entropy(logits.movedim(1, -1).reshape(-1, logits.shape[1]), labels.reshape(-1))


def unet_spec() -> ModelSpec:
    def batch(step: int, scale: int) -> tuple[torch.Tensor, torch.Tensor]:
        images, _ = _images(step, 4, 16 * scale)
        return images, torch.randint(0, 4, (4, 16 * scale, 16 * scale), generator=_generator(step + 700))

    return ModelSpec("unet", lambda s: UNet(8 * s), batch, lambda model, b: _pixel_loss(model(b[0]), b[1]), "up.1",
                     "down.0.1")


# --- an LSTM language model -------------------------------------------------------------------

class LstmLm(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, width)
        self.lstm = nn.LSTM(width, 2 * width, num_layers=2, batch_first=True, dropout=0.1)
        self.norm = nn.LayerNorm(2 * width)
        self.head = nn.Linear(2 * width, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.lstm(self.tokens(tokens))[0]))


def _padded_tokens(step: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and their labels, rows of different lengths (the labels past a row's end -100)."""
    tokens = _tokens(step, 4, length)
    labels = tokens.clone()
    for row in range(4):
        labels[row, length - (row + step) % 4 * (length // 6):] = -100
    return tokens, labels


def lstm_spec() -> ModelSpec:
    return ModelSpec("lstm", lambda s: LstmLm(32 * s), lambda step, s: _padded_tokens(step, 24 * s),
                     lambda model, b: _next_token_loss(model(b[0]), b[1]), "norm", "norm",
                     units=lambda b: _labelled(b[1][:, 1:]))


# --- LoRA: a frozen base with trainable low-rank adapters --------------------------------------

class LoraLinear(nn.Module):
    def __init__(self, inputs: int, outputs: int, rank: int = 16) -> None:
        super().__init__()
        self.base = nn.Linear(inputs, outputs)
        self.base.requires_grad_(False)
        self.a = nn.Parameter(torch.randn(rank, inputs) / math.sqrt(inputs))
        self.b = nn.Parameter(torch.zeros(outputs, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.a.t()) @ self.b.t() * 2.0


class LoraMlp(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(LoraLinear(width, width), nn.GELU()) for _ in range(3))
        self.head = LoraLinear(width, 10)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            rows = block(rows)
        return self.head(rows)


def _rows(step: int, rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = _generator(step)
    return torch.randn(rows, width, generator=generator), torch.randint(0, 10, (rows,), generator=generator)


def _weighted_rows(step: int, rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    features, labels = _rows(step, rows, width)
    return features, labels, torch.rand(rows, generator=_generator(step + 900))


def _weighted_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    """Cross-entropy averaged with per-row weights: sum(w * loss) / sum(w)."""
    features, labels, weights = batch
    return (F.cross_entropy(model(features), labels, reduction="none") * weights).sum() / weights.sum()


def lora_spec() -> ModelSpec:
    return ModelSpec("lora", lambda s: LoraMlp(128 * s), lambda step, s: _weighted_rows(step, 128 * s, 128 * s),
                     _weighted_loss, "blocks.2", "blocks.0.0", units=lambda b: float(b[2].double().sum()))


# --- buffers updated in forward ---------------------------------------------------------------

class RunningCentre(nn.Module):
    """Subtracts a running mean of its input that forward updates (with a count of the updates)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(width))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            with torch.no_grad():
                self.mean.mul_(0.9).add_(x.mean(0), alpha=0.1)
                self.count += 1
        return x - self.mean


class RunningMlp(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width, bias=False), nn.BatchNorm1d(width, momentum=None), nn.ReLU(),
                          RunningCentre(width)) for _ in range(3))
        self.head = nn.Linear(width, 10)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            rows = block(rows)
        return self.head(rows)


def running_spec() -> ModelSpec:
    return ModelSpec("running", lambda s: RunningMlp(96 * s), lambda step, s: _rows(step, 256 * s, 96 * s),
                     lambda model, b: F.cross_entropy(model(b[0]), b[1]), "blocks.2", "blocks.0.2",
                     fit_loss_units="rows")  # its running centre mixes the rows it sees: fit's check refuses a cut


MODELS: dict[str, Callable[[], ModelSpec]] = {
    "gpt": gpt_spec, "llama": llama_spec, "bert": bert_spec, "encdec": encdec_spec, "resnet": resnet_spec,
    "vit": vit_spec, "unet": unet_spec, "lstm": lstm_spec, "lora": lora_spec, "running": running_spec,
    "deep": deep_spec,
}


def spec(name: str, device: str = "cpu") -> ModelSpec:
    """The model `name` on `device` ("cpu" or "cuda")."""
    return MODELS[name]().on(device)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """The trainable parameters (requires_grad when built) as most loops group them: matrices
    with weight decay, vectors (biases, norms) without; empty groups left out."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in trainable if p.dim() >= 2]
    plain = [p for p in trainable if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]
