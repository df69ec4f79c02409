"""The cost of stowage.offload.AdamW(overlap=True)'s waits to the loop's ops (Note [Overlapped
steps]; stowage/offload/landing.py): a GPT's forward in CPU mode with nothing pending (the mode
and the module hook off) against the same forward while a step is pending whose buckets have all
landed (the step held at its end: every op's tensors looked up, none waits), interleaved round by
round; the median of the rounds' differences over the forward's op count (counted by a
TorchFunctionMode) is the cost an op pays while anything is pending. Beside it, the same in
isolation: one small op (a linear layer on a parameter) `--ops` times, with nothing pending, under
an empty TorchFunctionMode (what any Python mode costs), and with a step pending. A small model
(the ops' own time short) shows it best on a busy machine.

    python bench/optimizer/overlap_wait_cost.py --rounds 21 --forwards 20 --layers 8 --width 64 --batch 1 --seq 16
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

import stowage

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from gpt2_model import add_model_arguments, seeded_model_and_tokens  # noqa: E402


class OpCount(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops += 1
        return func(*args, **(kwargs or {}))


class Empty(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def per_op_us(op: Any, ops: int) -> float:
    started = time.perf_counter()
    for _ in range(ops):
        op()
    return (time.perf_counter() - started) / ops * 1e6


def forward_ms(model: Any, tokens: torch.Tensor, forwards: int) -> float:
    started = time.perf_counter()
    for _ in range(forwards):
        model(tokens, tokens)
    return (time.perf_counter() - started) / forwards * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--forwards", type=int, default=5)
    parser.add_argument("--ops", type=int, default=2000)
    args = parser.parse_args()
    stowage.enable(device="cpu", capacity=args.capacity)
    model, tokens = seeded_model_and_tokens(args.layers, args.width, args.batch, args.seq, "cpu", args.vocab)
    optimizer = stowage.offload.AdamW(model.parameters(), overlap=True)
    counter = OpCount()
    with counter:
        model(tokens, tokens)
    plain: list[float] = []
    pending: list[float] = []
    op_plain: list[float] = []
    op_empty: list[float] = []
    op_pending: list[float] = []
    weight = next(model.parameters())
    x = torch.randn(4, weight.shape[-1])

    def op() -> Any:
        return torch.nn.functional.linear(x, weight)

    for _ in range(args.rounds):
        op_plain.append(per_op_us(op, args.ops))
        with Empty():
            op_empty.append(per_op_us(op, args.ops))
        plain.append(forward_ms(model, tokens, args.forwards))
        model(tokens, tokens).backward()
        held = threading.Event()
        optimizer._at_step_point = lambda name, held=held: held.wait(600) if name == "end" else None
        optimizer.step()
        model.zero_grad(set_to_none=True)
        model(tokens, tokens)  # (every bucket landed: from here on each op only looks)
        pending.append(forward_ms(model, tokens, args.forwards))
        op_pending.append(per_op_us(op, args.ops))
        held.set()
        optimizer.flush()
    a, b = statistics.median(plain), statistics.median(pending)
    paired = statistics.median(y - x for x, y in zip(plain, pending))
    print(f"GPT {args.layers}x{args.width}, batch {args.batch}x{args.seq}, CPU mode, {counter.ops} ops a forward, "
          f"{args.rounds} rounds of {args.forwards} forwards")
    for name, values, middle in (("nothing pending", plain, a), ("a step pending: ", pending, b)):
        print(f"forward, {name}: median {middle:.2f} ms, least {min(values):.2f} ms  "
              f"(rounds: {' '.join(f'{x:.1f}' for x in values)})")
    print(f"per op while pending (median of the rounds' differences): {paired / counter.ops * 1e3:.2f} us "
          f"({paired / a * 100:+.1f}% of the forward)")
    for name, values in (("nothing pending", op_plain), ("an empty TorchFunctionMode", op_empty),
                         ("a step pending", op_pending)):
        print(f"one op ({args.ops} a round), {name}: median {statistics.median(values):.2f} us, "
              f"least {min(values):.2f} us (rounds: {' '.join(f'{v:.1f}' for v in values)})")
    print(f"one op, a step pending minus nothing pending (median of the rounds' differences): "
          f"{statistics.median(b - a for a, b in zip(op_plain, op_pending)):.2f} us; minus the empty mode: "
          f"{statistics.median(b - a for a, b in zip(op_empty, op_pending)):.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
