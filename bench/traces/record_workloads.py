"""Records the project's own allocation traces: real PyTorch workloads, random weights, on the CPU.

    python bench/traces/record_workloads.py [NAME ...]     # all four when no name is given

Each workload runs three or more training steps (forward, backward, AdamW, zero_grad) and is
written to bench/traces/NAME.pickle.gz in PyTorch's snapshot format (see README.md).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torchvision

from stowage.recorder import record, save_snapshot

HERE = Path(__file__).resolve().parent


def _training_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                   loss: Callable[[], torch.Tensor]) -> None:
    value = loss()
    value.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def resnet18_b8_3steps() -> Callable[[int], None]:
    """torchvision ResNet-18, batch 8 of 3x128x128 images."""
    model = torchvision.models.resnet18(weights=None)
    optimizer = torch.optim.AdamW(model.parameters())
    labels = torch.randint(0, 1000, (8,))
    return lambda step: _training_step(model, optimizer, lambda: torch.nn.functional.cross_entropy(
        model(torch.randn(8, 3, 128, 128)), labels))


def transformer_varlen_4steps() -> Callable[[int], None]:
    """A 4-layer Transformer encoder (d=256, 8 heads) whose sequence length changes each step."""
    model = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(256, 8, 1024, batch_first=True), num_layers=4)
    optimizer = torch.optim.AdamW(model.parameters())
    lengths = [64, 128, 96, 112]
    return lambda step: _training_step(model, optimizer, lambda: model(
        torch.randn(8, lengths[step], 256)).pow(2).mean())


def mlp_varbatch_4steps() -> Callable[[int], None]:
    """A 4-layer MLP (1024 wide) whose batch size changes each step."""
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024), torch.nn.GELU(),
        torch.nn.Linear(1024, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 10))
    optimizer = torch.optim.AdamW(model.parameters())
    batches = [64, 256, 32, 160]
    return lambda step: _training_step(model, optimizer, lambda: torch.nn.functional.cross_entropy(
        model(torch.randn(batches[step], 512)), torch.randint(0, 10, (batches[step],))))


def lstm_varlen_3steps() -> Callable[[int], None]:
    """A 2-layer LSTM (hidden 256) over sequences of changing length, batch 16."""
    model = torch.nn.LSTM(128, 256, num_layers=2, batch_first=True)
    optimizer = torch.optim.AdamW(model.parameters())
    lengths = [50, 80, 35]
    return lambda step: _training_step(model, optimizer, lambda: model(
        torch.randn(16, lengths[step], 128))[0].pow(2).mean())


WORKLOADS = {
    "resnet18_b8_3steps": (resnet18_b8_3steps, 3),
    "transformer_varlen_4steps": (transformer_varlen_4steps, 4),
    "mlp_varbatch_4steps": (mlp_varbatch_4steps, 4),
    "lstm_varlen_3steps": (lstm_varlen_3steps, 3),
}


def main(names: list[str]) -> int:
    torch.manual_seed(0)
    for name in names or list(WORKLOADS):
        make, steps = WORKLOADS[name]
        snapshot = record(make(), steps)
        path = HERE / f"{name}.pickle.gz"
        save_snapshot(snapshot, path)
        events = snapshot["device_traces"][0]
        print(f"{path.name}: {len(events):,} events, {path.stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
