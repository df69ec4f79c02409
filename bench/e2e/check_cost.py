"""What check mode (stowage.checking) costs a training step that offloads activations and offloads
the optimizer: the same steps with it off and on, interleaved in one process (the switch is
process-wide and may change between steps), every step's time reported.

    python3 bench/e2e/check_cost.py [--device cpu|cuda] [--steps 12] [--json OUT]

The model is bench/e2e/gpt2_model.py's GPT-2 at a small width; every saved activation is offloaded
(stowage.offload.activations(min_bytes=0)) and the optimizer is stowage.offload.AdamW, so check
mode verifies every offloaded storage when it comes back and every parameter written back. In CPU
mode the simulated device runs at memcpy speed; on a GPU, bf16 autocast.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=12, help="measured steps per setting")
    parser.add_argument("--json", type=str, default=None)
    return parser.parse_args()


def main() -> None:
    args = parse()
    import torch

    import stowage
    import stowage.checking
    from gpt2_model import seeded_model_and_tokens

    if args.device == "cuda":
        stowage.enable(device="cuda")
    else:
        stowage.enable(device="cpu", capacity="8GiB")
    model, ids = seeded_model_and_tokens(args.layers, args.width, args.batch, args.seq, args.device)
    optimizer = stowage.offload.AdamW(model.parameters(), lr=1e-4)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if args.device == "cuda" else torch.autocast(
        "cpu", enabled=False)

    def step() -> float:
        start = time.perf_counter()
        with autocast, stowage.offload.activations(min_bytes=0):
            loss = model(ids, ids)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        stowage.mark_step()
        if args.device == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e3

    for _ in range(2):
        step()  # warm-up: pinned pool, caches
    times: dict[str, list[float]] = {"off": [], "on": []}
    for index in range(2 * args.steps):
        setting = "on" if index % 2 else "off"
        stowage.checking.set_enabled(setting == "on")
        times[setting].append(step())
    stowage.checking.set_enabled(False)
    medians = {k: statistics.median(v) for k, v in times.items()}
    result = {"date": str(date.today()), "machine": platform.node(), "device": args.device,
              "command": " ".join(sys.argv), "parameters": sum(p.numel() for p in model.parameters()),
              "step_ms": times, "median_ms": medians, "cost": medians["on"] / medians["off"] - 1}
    print(f"check mode off {medians['off']:.1f} ms, on {medians['on']:.1f} ms a step: "
          f"{100 * result['cost']:+.1f}% (every step: off {[round(t) for t in times['off']]}, "
          f"on {[round(t) for t in times['on']]})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
