"""Who updates the parameters that stowage.offload.parameters keeps on the host: torch's AdamW
(the factory's optimizer: its CPU for-loop, or foreach, over the host tensors) against
stowage.offload.AdamW (its host kernel, in place; with device_fraction=1.0, as stowage.fit runs
it), on GPT-2-shaped decoders (bench/e2e/gpt2_model.py; fp32 parameters, bf16 autocast), the
blocks' parameters on the host. Per step: the whole step's time and the optimizer.step() time.
Then stowage.fit(offload_parameters=True) on the same model: its predicted update_ms beside the
measured one, and the optimizer it runs.

Runs the modes interleaved in one process, each round a fresh model from seed 0, and checks that
stowage's run ends with the parameters of torch's foreach run bit for bit (CPU mode) or within
torch's own spread (a GPU). Prints a table of medians; --json writes every figure.

    python bench/e2e/host_update_step.py --device cpu --layers 8 --width 512 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import stowage  # noqa: E402
import stowage.offload  # noqa: E402
from gpt2_model import (add_model_arguments, make_optimizer, random_batch, seeded_model_and_tokens,  # noqa: E402
                        synchronize)

MODES = ("torch_forloop", "torch_foreach", "stowage")


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of each mode")
    parser.add_argument("--json", type=Path)
    return parser.parse_args()


def optimizer_of(mode: str, model: Any) -> Any:
    """The mode's optimizer over GPT-2's groups (decay on matrices only)."""
    groups = [dict(g) for g in make_optimizer(model).param_groups]
    hyper = dict(lr=6e-4, betas=(0.9, 0.95))
    if mode == "stowage":
        return stowage.offload.AdamW(groups, **hyper, device_fraction=1.0)
    return torch.optim.AdamW(groups, **hyper, foreach=mode == "torch_foreach")


def run(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    """One run of `mode`: a fresh model (its blocks' parameters on the host), `warmup` + `steps`
    steps; the step's and the update's times, and the parameters."""
    device = "cuda" if args.device == "cuda" else "cpu"
    model, _ = seeded_model_and_tokens(args.layers, args.width, args.batch, args.seq, device, args.vocab)
    optimizer = optimizer_of(mode, model)  # made first, as fit makes it
    handle = stowage.offload.parameters(model)
    generator = torch.Generator().manual_seed(1)
    step_ms, update_ms = [], []
    for step in range(args.warmup + args.steps):
        tokens, targets = random_batch(args.batch, args.seq, args.vocab, device, generator)
        synchronize(device)
        started = time.perf_counter()
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            loss = model(tokens, targets)
        loss.backward()
        synchronize(device)
        updating = time.perf_counter()
        optimizer.step()
        synchronize(device)
        ended = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        if step >= args.warmup:
            step_ms.append((ended - started) * 1e3)
            update_ms.append((ended - updating) * 1e3)
    handle.close()
    getattr(optimizer, "close", lambda: None)()
    return {"mode": mode, "step_ms": step_ms, "update_ms": update_ms,
            "parameters": sum(p.numel() for p in model.parameters()),
            "block_parameters": sum(p.numel() for p in model.h.parameters()),
            # numpy's memory, not the device's (in CPU mode torch's CPU tensors are the simulated device's)
            "final": [p.detach().float().cpu().numpy().copy() for p in model.parameters()]}


def fit_prediction(args: argparse.Namespace) -> dict[str, Any]:
    """stowage.fit with the blocks' parameters on the host: what it runs and its predicted update."""
    device = "cuda" if args.device == "cuda" else "cpu"
    model, _ = seeded_model_and_tokens(args.layers, args.width, args.batch, args.seq, device, args.vocab)
    tokens, targets = random_batch(args.batch, args.seq, args.vocab, device, torch.Generator().manual_seed(1))
    fitted = stowage.fit(model, lambda params: optimizer_of("torch_forloop", model), (tokens, targets),
                         loss_fn=lambda m, batch: m(*batch), offload_parameters=True, verbose=False)
    chosen = fitted.chosen
    result = {"optimizer": type(fitted.optimizer).__module__ + "." + type(fitted.optimizer).__qualname__,
              "update_ms": chosen.update_ms, "parameters_on_host": chosen.parameters_on_host,
              "host_bytes": chosen.host_bytes, "device_bytes": chosen.device_bytes}
    fitted.close()
    return result


def main() -> int:
    args = parse()
    if args.device == "cpu":
        stowage.enable(device="cpu", capacity=args.capacity)
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    load = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        for mode in MODES:
            runs[mode].append(run(args, mode))
            if len(runs[mode]) > 1:
                runs[mode][-1].pop("final")  # the first round's are compared
            if args.device == "cpu":
                stowage.mark_step()
        load.append(os.getloadavg()[0])
    theirs, ours = runs["torch_foreach"][0]["final"], runs["stowage"][0]["final"]
    differs = max(float(abs(a - b).max()) for a, b in zip(theirs, ours))
    fitted = fit_prediction(args)
    first = runs["stowage"][0]
    print(f"{args.layers} layers x {args.width}, batch {args.batch} x {args.seq}, {args.device}; "
          f"{first['parameters'] / 1e6:.1f}M parameters, {first['block_parameters'] / 1e6:.1f}M on the host; "
          f"stowage against torch's foreach: largest difference {differs:g}; load average "
          f"{min(load):.1f}-{max(load):.1f}")
    print(f"{'mode':<16}{'step ms (median)':>18}{'update ms (median)':>20}")
    summary = {}
    for mode in MODES:
        step = statistics.median(t for r in runs[mode] for t in r["step_ms"])
        update = statistics.median(t for r in runs[mode] for t in r["update_ms"])
        summary[mode] = {"step_ms_median": step, "update_ms_median": update}
        print(f"{mode:<16}{step:>18.1f}{update:>20.1f}")
    print(f"stowage.fit(offload_parameters=True) runs {fitted['optimizer']}; predicted update "
          f"{fitted['update_ms']:.1f} ms (measured above: {summary['stowage']['update_ms_median']:.1f} ms)")
    if args.json:
        for mode in MODES:
            runs[mode][0].pop("final")
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "summary": summary,
                                         "largest_difference": differs, "fit": fitted, "load": load,
                                         "runs": runs}, indent=1))
    return 0 if args.device == "cuda" or differs == 0.0 else 1


if __name__ == "__main__":
    sys.exit(main())
