"""A Hugging Face Trainer on stowage.fit: GPT-2's shapes (random weights) trained with the
Trainer's own loop, its forward and backward under the fit's plan and its optimizer the fit's.
Needs ``pip install transformers accelerate`` (tools/bootstrap installs them).

    STOWAGE_ALLOC_CONF= python3 examples/hf_trainer.py            # on a GPU: stowage from the start
    python3 examples/hf_trainer.py                               # without one: CPU mode, a 2 GiB device

At its defaults (6 layers, width 512, 4 x 512 tokens) the plain step needs 2.6 GiB of a 2 GiB
device (its logits alone are 4 x 512 x 50,257 floats) and fit trains it there; at 1 GiB no plan
fits (the lowest step peak is 1.15 GiB: the whole logits and their gradient). --layers, --seq and
--capacity make it smaller (the test suite runs it so).
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import stowage


class FittedTrainer(Trainer):
    """The Trainer's loop, each training step's forward and backward under ``with fitted:``."""

    def __init__(self, *args: Any, fitted: Any, **kwargs: Any) -> None:
        super().__init__(*args, optimizers=(fitted.optimizer, None), **kwargs)
        self.fitted = fitted

    def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        with self.fitted:
            return super().training_step(*args, **kwargs)


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, count: int, length: int, vocab: int) -> None:
        self.ids = torch.randint(0, vocab, (count, length), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capacity", default="2GiB", help="CPU mode's device size, without a GPU")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--seq", type=int, default=512)
    args = parser.parse_args()
    on_gpu = torch.cuda.is_available()
    if on_gpu:
        stowage.enable()
    else:
        stowage.enable(device="cpu", capacity=args.capacity)
    device = "cuda" if on_gpu else "cpu"
    config = GPT2Config(n_layer=args.layers, n_embd=512, n_head=8, n_positions=args.seq)
    model = GPT2LMHeadModel(config).to(device)
    data = RandomTokens(64, args.seq, config.vocab_size)
    example = {name: torch.stack([data[i][name] for i in range(4)]).to(device) for name in ("input_ids", "labels")}
    fitted = stowage.fit(model, lambda params: torch.optim.AdamW(params, lr=3e-4), example)
    training = TrainingArguments(output_dir="/tmp/stowage-hf-trainer", per_device_train_batch_size=4,
                                 max_steps=args.steps, logging_steps=1, report_to=[], save_strategy="no",
                                 use_cpu=not on_gpu)
    FittedTrainer(model=model, args=training, train_dataset=data, fitted=fitted).train()


if __name__ == "__main__":
    main()
