"""The cost of the Python guard of stowage.offload.parameters' device copies per op: an op on a
device copy of the guarded class (its __torch_function__ checks that no argument is a freed copy)
against the same op on a plain nn.Parameter, interleaved, medians of `--rounds` rounds of
`--ops` calls each. With bench/e2e/parameters_step.py --count (guard calls a step) it gives the
guard's cost a step: calls x cost.

    python bench/e2e/parameter_guard_cost.py --rounds 15 --ops 2000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Callable

import torch

import stowage
import stowage.offload

parameter_module = sys.modules["stowage.offload.parameters"]


def per_op_us(op: Callable[[], Any], ops: int) -> float:
    started = time.perf_counter()
    for _ in range(ops):
        op()
    return (time.perf_counter() - started) / ops * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--width", type=int, default=64)
    args = parser.parse_args()
    stowage.enable(device="cpu", capacity="1GiB")
    x = torch.randn(8, args.width)
    guarded = parameter_module._device_copy_type()(torch.randn(args.width, args.width), requires_grad=True)
    plain = torch.nn.Parameter(torch.randn(args.width, args.width))
    ops = {"guarded": lambda: torch.nn.functional.linear(x, guarded), "plain": lambda: torch.nn.functional.linear(x, plain)}
    times: dict[str, list[float]] = {name: [] for name in ops}
    for _ in range(args.rounds):
        for name, op in ops.items():
            times[name].append(per_op_us(op, args.ops))
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(f"linear(8x{args.width}, {args.width}x{args.width}), {args.rounds} rounds of {args.ops}: "
          f"plain {medians['plain']:.2f} us, guarded {medians['guarded']:.2f} us, "
          f"guard {medians['guarded'] - medians['plain']:.2f} us an op")
    return 0


if __name__ == "__main__":
    sys.exit(main())
