"""A plain PyTorch training loop on stowage.fit: a Llama-style decoder trained on a device it does
not fit as it is. With a GPU, stowage is torch's CUDA allocator (enabled before the first CUDA
tensor); without one, CPU mode's simulated device of --capacity bytes stands in for it.

    python3 examples/plain_loop.py [--capacity 128MiB] [--steps 10]
"""

from __future__ import annotations

import argparse

import torch

import stowage
from stowage.models.llama import Llama, LlamaShape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capacity", default="128MiB", help="CPU mode's device size, without a GPU")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()

    if torch.cuda.is_available():
        stowage.enable()                      # before the first CUDA tensor
        device = "cuda"
    else:
        stowage.enable(device="cpu", capacity=args.capacity)
        device = "cpu"

    torch.manual_seed(0)
    model = Llama(LlamaShape(hidden=256, layers=6, heads=4, kv_heads=2, vocab=4096, max_sequence=256),
                  device=device)                                    # built on the device, never on the host first
    batches = (torch.randint(0, 4096, (4, 256), device=device) for _ in range(args.steps))
    example = torch.randint(0, 4096, (4, 256), device=device)      # the largest batch the loop trains on

    fitted = stowage.fit(model, lambda params: torch.optim.AdamW(params, lr=3e-4, weight_decay=0.1), example,
                         loss_fn=lambda m, tokens: m.chunked_loss(tokens, chunks=8))
    for step, tokens in enumerate(batches):
        loss = fitted.step(tokens)                                  # forward, backward, AdamW, zero_grad
        print(f"step {step}: loss {loss.item():.3f}, peak {stowage.format_bytes(stowage.max_memory_allocated())}")


if __name__ == "__main__":
    main()
