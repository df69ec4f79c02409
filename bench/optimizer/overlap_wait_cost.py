"""The cost of stowage.offload.AdamW(overlap=True)'s waits to the loop's ops (Note [Overlapped
steps]; stowage/offload/landing.py): a GPT's forward in CPU mode with nothing pending (the mode
and the module hook off) against the same forward while a step is pending whose buckets have all
landed (the step held at its end: every op's tensors looked up, none waits), interleaved round by
round, medians; the difference over the forward's op count (counted by a TorchFunctionMode) is the
cost an op pays while anything is pending.

    python bench/optimizer/overlap_wait_cost.py --rounds 9 --forwards 5 [--layers 8 --width 512]
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
    args = parser.parse_args()
    stowage.enable(device="cpu", capacity=args.capacity)
    model, tokens = seeded_model_and_tokens(args.layers, args.width, args.batch, args.seq, "cpu", args.vocab)
    optimizer = stowage.offload.AdamW(model.parameters(), overlap=True)
    counter = OpCount()
    with counter:
        model(tokens, tokens)
    plain: list[float] = []
    pending: list[float] = []
    for _ in range(args.rounds):
        plain.append(forward_ms(model, tokens, args.forwards))
        model(tokens, tokens).backward()
        held = threading.Event()
        optimizer._at_step_point = lambda name, held=held: held.wait(600) if name == "end" else None
        optimizer.step()
        model.zero_grad(set_to_none=True)
        model(tokens, tokens)  # (every bucket landed: from here on each op only looks)
        pending.append(forward_ms(model, tokens, args.forwards))
        held.set()
        optimizer.flush()
    a, b = statistics.median(plain), statistics.median(pending)
    print(f"GPT {args.layers}x{args.width}, batch {args.batch}x{args.seq}, CPU mode, {counter.ops} ops a forward, "
          f"{args.rounds} rounds of {args.forwards} forwards")
    print(f"forward, nothing pending: median {a:.2f} ms  (rounds: {' '.join(f'{x:.1f}' for x in plain)})")
    print(f"forward, a step pending:  median {b:.2f} ms  (rounds: {' '.join(f'{x:.1f}' for x in pending)})")
    print(f"per op while pending: {(b - a) / counter.ops * 1e3:.2f} us ({(b - a) / a * 100:+.1f}% of the forward)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
