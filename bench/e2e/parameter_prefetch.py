"""How far ahead the blocks' parameters come in where they live on the host (Note [Parameter
prefetch depth] in planner/parameter_prefetch.hpp): for bench/e2e/parameters_step.py's
GPT-2-shaped decoder, one step recorded (stowage.plan.profile, the copy rates measured), then
the planner's predicted wait for the copies in (forward and backward) and its window at each
depth, and the depth it chooses, at the measured host-to-device rate and at rates where a block's
copy takes a set multiple of its mean compute (the copies slower or faster beside the compute).

    python bench/e2e/parameter_prefetch.py --device cpu --layers 8 --width 512 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import stowage  # noqa: E402
import stowage.plan  # noqa: E402
from stowage import _core  # noqa: E402
from stowage.offload.parameters import block_units  # noqa: E402
from gpt2_model import add_model_arguments, random_batch, seeded_model_and_tokens  # noqa: E402

COPY_OVER_COMPUTE = (0.25, 1.0, 4.0)  # a block's copy over its mean forward-and-backward compute


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--rounds", type=int, default=3, help="steps recorded, each weighed alone")
    parser.add_argument("--json", type=Path)
    return parser.parse_args()


def record(model: Any, tokens: torch.Tensor, targets: torch.Tensor, device: str) -> Any:
    def step() -> None:
        with torch.autocast(device_type=tokens.device.type, dtype=torch.bfloat16):
            loss = model(tokens, targets)
        loss.backward()
        model.zero_grad(set_to_none=True)

    return stowage.plan.profile(step, device=device, model=model)


def weighed(trace: Any, paths: list[str], sizes: list[int], rate: float) -> dict[str, Any]:
    """The planner's figures at `rate`, and beside them the estimate fit made before it chose the
    depth (one block ahead always): one block's copy, plus what the step's compute does not cover
    of every block's copy twice."""
    found = _core.parameter_prefetch(trace, paths, sizes, rate, 1 << 62)
    compute = sum(op.duration_ms for op in trace.ops if op.phase != _core.TracePhase.optimizer)
    fixed_estimate = max(sizes) / rate + max(2 * sum(sizes) / rate - compute, 0.0)
    return {"rate_bytes_per_ms": rate, "depth": found.depth, "exposed_ms": list(found.exposed_ms),
            "window_bytes": list(found.window_bytes), "fixed_one_ahead_estimate_ms": fixed_estimate}


def main() -> int:
    options = parse()
    if options.device == "cpu":
        stowage.enable(device="cpu", capacity=options.capacity)
    model, _ = seeded_model_and_tokens(options.layers, options.width, options.batch, options.seq, options.device,
                                       options.vocab)
    names = {id(m): n for n, m in model.named_modules()}
    units = block_units(model)
    paths = [names[id(u)] for u in units]
    sizes = [sum(p.numel() * p.element_size() for p in u.parameters()) for u in units]
    rounds = []
    for index in range(options.rounds):
        tokens, targets = random_batch(options.batch, options.seq, options.vocab, options.device,
                                       torch.Generator().manual_seed(index))
        trace = record(model, tokens, targets, options.device)
        measured = trace.cost.to_device_bytes_per_ms
        per_block = sum(op.duration_ms for op in trace.ops if op.phase != _core.TracePhase.optimizer) / len(units)
        results = [dict(weighed(trace, paths, sizes, measured), label="measured")]
        for multiple in COPY_OVER_COMPUTE:
            rate = sizes[0] / (multiple * per_block)
            results.append(dict(weighed(trace, paths, sizes, rate), label=f"copy = {multiple}x a block's compute"))
        rounds.append({"step_compute_ms": sum(op.duration_ms for op in trace.ops), "results": results})
    print(f"{options.layers} blocks of {sizes[0] / 2**20:.2f} MiB; step compute (median) "
          f"{statistics.median(r['step_compute_ms'] for r in rounds):.1f} ms over {options.rounds} recordings")
    for column, first in enumerate(rounds[0]["results"]):
        exposed = [statistics.median(r["results"][column]["exposed_ms"][d] for r in rounds)
                   for d in range(len(first["exposed_ms"]))]
        depths = [r["results"][column]["depth"] for r in rounds]
        rate = statistics.median(r["results"][column]["rate_bytes_per_ms"] for r in rounds)
        fixed = statistics.median(r["results"][column]["fixed_one_ahead_estimate_ms"] for r in rounds)
        print(f"{first['label']} ({rate / 1e6:.2f} MB/ms): depths chosen {depths}; exposed ms by depth "
              + ", ".join(f"{d}: {ms:.2f}" for d, ms in enumerate(exposed))
              + f"; the fixed one-ahead estimate {fixed:.2f}")
    if options.json:
        options.json.write_text(json.dumps({"options": vars(options) | {"json": str(options.json)},
                                            "blocks": paths, "block_bytes": sizes, "rounds": rounds}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
