"""``stowage demo``: a small model trained for three steps on stowage's CPU mode.

A torchvision ResNet-18 (random weights, batch 8 of 3x64x64) runs forward, backward and AdamW
on a simulated 1 GiB device; the memory summary and the peak are printed. Every CPU tensor of
the model comes from stowage, as it would from stowage's allocator on a GPU.
"""

from __future__ import annotations

import argparse
from typing import Any

import stowage


def add_parser(commands: Any, name: str) -> None:
    parser = commands.add_parser(name, help="train a small model on stowage's CPU mode",
                                 description=__doc__)
    parser.add_argument("--capacity", default="1GiB", help="simulated device size (default 1GiB)")


def run(args: argparse.Namespace) -> int:
    import torch
    import torchvision

    stowage.enable(device="cpu", capacity=args.capacity)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    optimizer = torch.optim.AdamW(model.parameters())
    for step in range(3):
        images, labels = torch.randn(8, 3, 64, 64), torch.randint(0, 10, (8,))
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step}: {stowage.format_bytes(stowage.memory_allocated())} allocated, "
              f"{stowage.format_bytes(stowage.memory_reserved())} reserved")
    print(stowage.memory_summary(abbreviated=True))
    return 0
