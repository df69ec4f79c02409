"""The small GPT and the token batches the offloaded optimizer's GPU tests train (the plain and the
overlapped step alike), with the hyper-parameters they share."""

from __future__ import annotations

import torch

from gpt2_model import GPT, GPTConfig

DEVICE = "cuda"
HYPER = dict(lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def small_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=4, n_head=8, n_embd=512, vocab_size=8192, block_size=256)).to(DEVICE)


def tokens(step: int) -> torch.Tensor:
    return torch.randint(0, 8192, (4, 256), generator=torch.Generator().manual_seed(step)).to(DEVICE)
