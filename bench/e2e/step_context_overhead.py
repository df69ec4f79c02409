"""What following module calls costs a training step: forward and backward of a 24-block MLP in
CPU mode, plain and with stowage following its module calls the way a plan does
(``ModuleFrames``), and recording history with tags beside a plan's frames against recording
it without tags (tagging's hooks), the variants interleaved, each step timed, medians reported.

    python bench/e2e/step_context_overhead.py --rounds 30 [--json out.json]

The overhead per module call is (median step with - median step of its baseline) / module calls
a step.
Run it from two installs (or two checkouts' packages on PYTHONPATH) to compare them; each run
prints one JSON line.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from typing import Any, Callable

import torch

import stowage
from stowage.plan.module_frames import ModuleFrames


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(width, 2 * width)
        self.act = torch.nn.GELU()
        self.down = torch.nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.act(self.up(x)))


class Model(torch.nn.Module):
    def __init__(self, blocks: int, width: int) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(width) for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def timed_step(model: Model, x: torch.Tensor) -> float:
    start = time.perf_counter()
    model(x).square().mean().backward()
    elapsed = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    return elapsed * 1e3


def plain(model: Model, x: torch.Tensor) -> float:
    return timed_step(model, x)


def frames(model: Model, x: torch.Tensor) -> float:
    followed = ModuleFrames(root=model)
    followed.install()
    try:
        return timed_step(model, x)
    finally:
        followed.remove()


def history(model: Model, x: torch.Tensor) -> float:
    stowage.record_history(True, tags=False)
    try:
        return timed_step(model, x)
    finally:
        stowage.record_history(False)


def history_tags_and_frames(model: Model, x: torch.Tensor) -> float:
    stowage.record_history(True)
    try:
        return frames(model, x)
    finally:
        stowage.record_history(False)


VARIANTS: dict[str, Callable[[Model, torch.Tensor], float]] = {
    "plain": plain, "frames": frames, "history": history, "history+tags+frames": history_tags_and_frames}
BASELINE = {"frames": "plain", "history+tags+frames": "history"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--blocks", type=int, default=24)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--json", default=None)
    options = parser.parse_args()
    stowage.enable(device="cpu", capacity="1GiB")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Model(options.blocks, options.width)
    x = torch.randn(options.rows, options.width)
    calls = 1 + 4 * options.blocks  # the model, each block and its three layers
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for name, run in VARIANTS.items():  # warm-up
        run(model, x)
    gc.disable()
    for _ in range(options.rounds):
        for name, run in VARIANTS.items():
            times[name].append(run(model, x))
    gc.enable()
    medians = {name: statistics.median(values) for name, values in times.items()}
    result: dict[str, Any] = {"module_calls_per_step": calls, "median_step_ms": medians,
                              "overhead_us_per_call": {name: (medians[name] - medians[base]) * 1e3 / calls
                                                       for name, base in BASELINE.items()}}
    print(json.dumps(result))
    if options.json:
        with open(options.json, "w") as out:
            json.dump(result, out)


if __name__ == "__main__":
    main()
