"""How far one ulp travels: plain torch trains the exactness suite's model that updates buffers
(RunningMlp: Linear, BatchNorm, ReLU, a running centre) with AdamW, and again with one ulp added
to a few weights after the first step; prints, per seed of the perturbation, each step's largest
gradient difference. Why the exactness suite needs the host optimizer bit for bit torch's on a CPU
(bench/results/2026-11-26-cpu-exactness.md).

    python3 bench/e2e/rounding_sensitivity.py [--seeds 1 2 3] [--steps 6]
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "python"))

from exactness import models  # noqa: E402


def train(base: torch.nn.Module, spec: models.ModelSpec, steps: int, perturb: int) -> list[dict[str, torch.Tensor]]:
    model = copy.deepcopy(base).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    gradients = []
    for step in range(steps):
        for micro in range(2):
            (spec.loss(model, spec.batch(step * 2 + micro, 2)) / 2).backward()
        gradients.append({n: p.grad.clone() for n, p in model.named_parameters()})
        optimizer.step()
        optimizer.zero_grad()
        if step == 0 and perturb:
            with torch.no_grad():
                weight = dict(model.named_parameters())["blocks.0.0.weight"].view(-1)
                chosen = torch.randperm(weight.numel(), generator=torch.Generator().manual_seed(perturb))[:3]
                weight[chosen] = torch.nextafter(weight[chosen], torch.full_like(weight[chosen], 9.0))
    return gradients


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(1)
    spec = models.spec("running")
    torch.manual_seed(0)
    base = spec.build(2)
    plain = train(base, spec, args.steps, 0)
    for seed in args.seeds:
        perturbed = train(base, spec, args.steps, seed)
        worst = [max(float((a[n] - b[n]).abs().max()) for n in a) for a, b in zip(plain, perturbed)]
        print(f"seed {seed}: largest gradient difference per step {[f'{w:.2g}' for w in worst]}")


if __name__ == "__main__":
    main()
