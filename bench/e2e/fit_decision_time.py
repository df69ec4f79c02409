"""How long stowage.fit takes to decide (record the step, measure the update rates, weigh every
share of optimizer states with its plan), for Llama-style decoders of about 20M parameters under a
budget that makes it plan, and one fitted step's time beside it, in CPU mode.

    python3 bench/e2e/fit_decision_time.py [--capacity 2GiB]

Each model runs in this process one after the other (CPU mode's device is per process); the
budget is what the model holds plus the room given, so fit must offload or plan.
"""

from __future__ import annotations

import argparse
import time

import torch

import stowage
from stowage.models.llama import Llama, LlamaShape

# (hidden, layers, vocabulary, MiB of room beside the model): about 20-30M parameters each
MODELS = ((512, 6, 8192, 200), (384, 8, 16384, 220), (256, 12, 32000, 260))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--capacity", default="2GiB")
    args = parser.parse_args()
    stowage.enable(device="cpu", capacity=args.capacity)
    print("| parameters | shape | batch | decided in | share on the device | plan | one step |")
    print("| ---: | --- | --- | ---: | ---: | --- | ---: |")
    for hidden, layers, vocab, room in MODELS:
        torch.manual_seed(0)
        model = Llama(LlamaShape(hidden=hidden, layers=layers, heads=8, kv_heads=4, vocab=vocab, max_sequence=256))
        tokens = torch.randint(0, vocab, (8, 256))
        budget = stowage.memory_allocated() + (room << 20)
        start = time.perf_counter()
        fitted = stowage.fit(model, lambda params: torch.optim.AdamW(params, lr=1e-4), tokens, budget=budget,
                             loss_fn=lambda m, batch: m.chunked_loss(batch, chunks=4), verbose=False)
        decided = time.perf_counter() - start
        start = time.perf_counter()
        fitted.step(tokens)
        step = time.perf_counter() - start
        count = sum(p.numel() for p in model.parameters())
        print(f"| {count / 1e6:.1f}M | hidden {hidden}, {layers} layers, vocabulary {vocab} | 8 x 256 | {decided:.1f} s "
              f"| {fitted.device_fraction:.0%} | {'yes' if fitted.plan is not None else 'no'} | {step:.2f} s |")
        del fitted, model


if __name__ == "__main__":
    main()
