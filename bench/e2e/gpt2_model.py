"""A minimal GPT-2 in plain PyTorch, for stowage's end-to-end tests and benchmarks.

GPT-2 small by default (12 layers, d=768, 12 heads, 50257-token vocabulary, 1024 positions):
pre-norm blocks, causal scaled-dot-product attention, GELU MLP, the token embedding tied to the
output head, and GPT-2's initialisation. No dependency beyond torch.

    from gpt2_model import GPT, GPTConfig, make_optimizer, random_batch, training_step
"""

from __future__ import annotations

import argparse
import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    """The model's shape; the defaults are GPT-2 small (124M parameters)."""

    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    vocab_size: int = 50257
    block_size: int = 1024
    dropout: float = 0.0


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through F.scaled_dot_product_attention."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.c_proj.residual_projection = True  # type: ignore[assignment]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        shape = (batch, length, self.n_head, width // self.n_head)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.c_proj(y.transpose(1, 2).contiguous().view(batch, length, width))


class MLP(nn.Module):
    """The 4x-wide GELU feed-forward layer."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.c_proj.residual_projection = True  # type: ignore[assignment]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    """A pre-norm transformer block."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2: token and position embeddings, n_layer blocks, final norm, tied LM head."""

    def __init__(self, config: GPTConfig = GPTConfig()) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            std = 0.02
            if getattr(module, "residual_projection", False):
                std /= math.sqrt(2 * self.config.n_layer)
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_parameters(self) -> int:
        """Parameters counted once (the tied head is the token embedding)."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Returns the mean next-token cross-entropy when ``targets`` is given, else the logits."""
        length = tokens.shape[1]
        if length > self.config.block_size:
            raise ValueError(f"sequence length {length} exceeds block_size {self.config.block_size}")
        positions = torch.arange(length, device=tokens.device)
        x = self.drop(self.wte(tokens) + self.wpe(positions))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.reshape(-1))


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments the CPU-mode parameter benchmarks share: the device (CPU mode's capacity) and
    the GPT and batch ``seeded_model_and_tokens`` makes from them."""
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--capacity", default="8GiB", help="CPU mode's simulated device")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)


def synchronize(device: str | torch.device) -> None:
    """Waits for the device's queued work (nothing to wait for on a CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def seeded_model_and_tokens(layers: int, width: int, batch: int, seq: int, device: str,
                             vocab_size: int = 8192) -> tuple[GPT, torch.Tensor]:
    """A GPT of ``layers`` blocks of ``width`` (4 heads) made from seed 0 on ``device``, and a
    batch of random tokens for it (the scripts measuring a watch's cost use them as targets too)."""
    torch.manual_seed(0)
    config = GPTConfig(n_layer=layers, n_head=4, n_embd=width, vocab_size=vocab_size, block_size=seq)
    model = GPT(config).to(device)
    return model, torch.randint(0, vocab_size, (batch, seq), device=device)


def make_optimizer(model: nn.Module, lr: float = 6e-4, weight_decay: float = 0.1,
                   fused: bool | None = None) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only, as GPT-2 trainings do."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=fused)


def random_batch(batch: int, length: int, vocab_size: int, device: str | torch.device = "cuda",
                 generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Random tokens and their next-token targets, shape (batch, length) each."""
    data = torch.randint(0, vocab_size, (batch, length + 1), generator=generator)
    data = data.to(device, non_blocking=False)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


def training_step(model: GPT, optimizer: torch.optim.Optimizer, tokens: torch.Tensor,
                  targets: torch.Tensor, dtype: torch.dtype | None = torch.bfloat16) -> torch.Tensor:
    """One step: forward (under autocast to ``dtype`` when given), backward, optimizer step,
    zero_grad(set_to_none=True). Returns the loss, detached, still on the device."""
    autocast = (torch.autocast(device_type=tokens.device.type, dtype=dtype) if dtype is not None
                else contextlib.nullcontext())
    with autocast:
        loss = model(tokens, targets)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()
