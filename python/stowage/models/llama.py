"""A Llama-style decoder for the demo, benchmarks and recorded traces: RMSNorm, rotary positions,
grouped-query attention (fewer key/value heads than query heads) through
``scaled_dot_product_attention``, a SwiGLU MLP, untied embedding and head. Random weights; the
shapes are what matter to memory, and they are those of the Llama family at any size.

    model = Llama(LlamaShape(hidden=1024, layers=8, heads=16, kv_heads=4, vocab=32000))
    loss = model(tokens)          # next-token cross-entropy over the whole sequence
    loss = model.chunked_loss(tokens, checkpoint_blocks=True)   # logits a chunk at a time

The parameters are made on the device given, never in host fp32 first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn


@dataclass(frozen=True)
class LlamaShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    intermediate: int = 0  # 0: the Llama rule, 8/3 of hidden rounded up to a multiple of 256
    max_sequence: int = 4096

    @property
    def mlp(self) -> int:
        return self.intermediate or -(-8 * self.hidden // 3 // 256) * 256


class RMSNorm(nn.Module):
    def __init__(self, width: int, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Block(nn.Module):
    def __init__(self, shape: LlamaShape, device: torch.device | str | None) -> None:
        super().__init__()
        self.shape = shape
        head = shape.hidden // shape.heads
        self.attention_norm = RMSNorm(shape.hidden, device)
        self.q = nn.Linear(shape.hidden, shape.heads * head, bias=False, device=device)
        self.kv = nn.Linear(shape.hidden, 2 * shape.kv_heads * head, bias=False, device=device)
        self.o = nn.Linear(shape.heads * head, shape.hidden, bias=False, device=device)
        self.mlp_norm = RMSNorm(shape.hidden, device)
        self.gate_up = nn.Linear(shape.hidden, 2 * shape.mlp, bias=False, device=device)
        self.down = nn.Linear(shape.mlp, shape.hidden, bias=False, device=device)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        shape = self.shape
        head = shape.hidden // shape.heads
        h = self.attention_norm(x)
        q = self.q(h).view(batch, length, shape.heads, head).transpose(1, 2)
        k, v = self.kv(h).view(batch, length, 2, shape.kv_heads, head).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(attended.transpose(1, 2).reshape(batch, length, shape.hidden))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, shape: LlamaShape, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.shape = shape
        self.embed = nn.Embedding(shape.vocab, shape.hidden, device=device)
        self.blocks = nn.ModuleList(Block(shape, device) for _ in range(shape.layers))
        self.norm = RMSNorm(shape.hidden, device)
        self.head = nn.Linear(shape.hidden, shape.vocab, bias=False, device=device)
        head = shape.hidden // shape.heads
        frequencies = 1.0 / (10000 ** (torch.arange(0, head, 2, device=device).float() / head))
        angles = torch.outer(torch.arange(shape.max_sequence, device=device).float(), frequencies)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def hidden_states(self, tokens: torch.Tensor, checkpoint_blocks: bool = False) -> torch.Tensor:
        """The final norm's output; with `checkpoint_blocks`, each block's activations are
        recomputed in backward (torch.utils.checkpoint, non-reentrant): only its input is kept."""
        length = tokens.shape[1]
        cos, sin = self.cos[:length], self.sin[:length]
        x = self.embed(tokens)
        for block in self.blocks:
            if checkpoint_blocks:
                x = torch.utils.checkpoint.checkpoint(block, x, cos, sin, use_reentrant=False)
            else:
                x = block(x, cos, sin)
        return self.norm(x)

    def chunked_loss(self, tokens: torch.Tensor, chunk_tokens: int = 8192,
                     checkpoint_blocks: bool = False, chunks: int | None = None) -> torch.Tensor:
        """The same loss as forward(), with the logits made `chunk_tokens` rows at a time and made
        again in backward: whole logits (tokens x vocab, upcast to fp32 for the loss) would bound
        the tokens a step long before anything else does. `chunks`: instead, that many chunks
        whatever the tokens, so the step runs the same ops at every size (what profiling a step
        at several sizes needs, stowage.plan.sizes)."""
        hidden = self.hidden_states(tokens, checkpoint_blocks)[:, :-1].reshape(-1, self.shape.hidden)
        targets = tokens[:, 1:].reshape(-1)
        if chunks is not None:
            chunk_tokens = max(-(-targets.numel() // chunks), 1)
        total = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, targets.numel(), chunk_tokens):
            part = slice(start, start + chunk_tokens)
            total = total + torch.utils.checkpoint.checkpoint(
                self._loss_sum, hidden[part], targets[part], use_reentrant=False)
        return total / targets.numel()

    def _loss_sum(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.head(hidden).float(), targets, reduction="sum")

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.hidden_states(tokens))
        return F.cross_entropy(logits[:, :-1].reshape(-1, self.shape.vocab),
                               tokens[:, 1:].reshape(-1))
