"""The headline on one device, checked at bracketing points instead of searched: the largest
Llama-style model that trains with AdamW in bf16 autocast (stock PyTorch against stowage.fit), and
at a fixed 1.1B model (hidden 2048, 16 layers, GQA 16/4, sequence 2048) the most tokens a step of
stock PyTorch with every block checkpointed against stowage.fit, with tokens a second.

    python3 bench/e2e/gpu_headline.py --device cuda --budget-s 270 --json OUT.json
    python3 bench/e2e/gpu_headline.py --device cpu --capacity 2GiB --small     # a dry run

A search probes about 2 log2(answer) points, minutes each at these sizes. Instead:
  1. stock's peak reserved at two small points (two batches of the 1.1B model with checkpointing,
     two depths of the large model), each a fresh process, and the straight line through them
     extrapolated to the device's memory: the predicted answer;
  2. fresh processes (bench/e2e/fit_probe.py) train at the prediction and one step past it
     (10% more tokens, one more layer): the first should fit and the second not; where the
     prediction fails, the point below it is tried instead;
  3. stowage.fit trains at twice stock's verified tokens, and at the largest model the host
     allows (stowage's offloaded optimizer's host bytes a parameter, 16 for fp32: masters,
     moments and a gradient buffer, within 85% of the host memory available; the issue's 12 B
     figure reported beside) or at twice stock's layers where that is less; its host bytes a
     parameter are measured there and reported.
Every point is printed as it finishes and kept in --json, with each step's time. The whole run
stays inside --budget-s: a probe gets what is left, and what did not run is marked so.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from probe_runs import Clock, bracket, host_available_bytes, run_point  # noqa: E402

FIXED = dict(hidden=2048, heads=16, kv_heads=4, layers=16, vocab=32000, seq=2048)  # the 1.1B model
LARGE = dict(hidden=4096, heads=32, kv_heads=8, vocab=32000, seq=2048, batch=2)    # the largest-model search
SMALL_FIXED = dict(hidden=128, heads=4, kv_heads=2, layers=4, vocab=1024, seq=128)  # the dry run's sizes
SMALL_LARGE = dict(hidden=256, heads=4, kv_heads=2, vocab=1024, seq=128, batch=2)
# The issue's host figure: fp32 masters, exp_avg and exp_avg_sq (12 B a parameter). stowage's
# offloaded optimizer also stages each gradient on the host (16 B for fp32 parameters: measured on
# an H200, bench/results/2026-11-26-h200-gpu.md); the fit probe is placed by stowage's own figure.
ISSUE_HOST_BYTES_PER_PARAMETER = 12
HOST_SHARE = 0.85
DEVICE_SHARE = 0.95  # allocated bytes the caching allocator can place before its reserve is full


def parameters_of(shape: dict[str, int], layers: int) -> int:
    """The parameter count of stowage.models.llama's decoder (untied head)."""
    hidden, head = shape["hidden"], shape["hidden"] // shape["heads"]
    mlp = -(-8 * hidden // 3 // 256) * 256
    attention = 2 * hidden * hidden + 2 * hidden * head * shape["kv_heads"]
    block = attention + 3 * hidden * mlp + 2 * hidden
    return layers * block + 2 * shape["vocab"] * hidden + hidden


def host_bytes_per_parameter() -> int:
    """What stowage's offloaded optimizer takes on the host for an fp32 parameter."""
    import torch

    from stowage.serving import torch_module

    return int(torch_module().bytes_per_parameter(torch.float32, 1))


def probe(args: argparse.Namespace, clock: Clock, config: str, shape: dict[str, int], layers: int, batch: int,
          steps: int) -> dict[str, Any]:
    """One fresh-process point of fit_probe.py, under what is left of the run's budget."""
    point: dict[str, Any] = {"config": config, "layers": layers, "batch": batch, "seq": shape["seq"],
                             "tokens_per_step": batch * shape["seq"], "parameters": parameters_of(shape, layers)}
    command = [sys.executable, str(HERE / "fit_probe.py"), "--config", config, "--device", args.device,
               "--capacity", args.capacity, "--hidden", str(shape["hidden"]), "--heads", str(shape["heads"]),
               "--kv-heads", str(shape["kv_heads"]), "--vocab", str(shape["vocab"]), "--layers", str(layers),
               "--batch", str(batch), "--seq", str(shape["seq"]), "--steps", str(steps)]
    result = run_point(command, clock, point)
    if "wall_s" not in result:  # not run
        return result
    print(describe(result), flush=True)
    return result


def describe(result: dict[str, Any]) -> str:
    head = (f"{result['config']:<24} layers {result['layers']:>3} batch {result['batch']:>4} "
            f"({result['parameters'] / 1e9:.2f}B parameters, {result['tokens_per_step']} tokens): ")
    if result.get("fits"):
        steps = ", ".join(f"{s:.2f}" for s in result.get("step_s", []))
        return (head + f"fits, {result.get('tokens_per_s', 0):,.0f} tokens/s, peak reserved "
                f"{result.get('peak_reserved_bytes', 0) / 2**30:.1f} GiB, steps [{steps}] s, {result['wall_s']} s")
    return head + f"does not fit: {result.get('why', '')}"


def extrapolate(peaks: list[dict[str, Any]], key: str, total: int, measure: str) -> int:
    """The largest `key` whose `measure` (a peak in bytes), on the line through the two measured
    points, stays within `total` bytes."""
    (x0, y0), (x1, y1) = ((p[key], p[measure]) for p in peaks)
    slope = (y1 - y0) / (x1 - x0)
    return max(int(x1 + (total - y1) // max(slope, 1)), 1)


def bracket_points(args: argparse.Namespace, clock: Clock, config: str, shape: dict[str, int], predicted: int,
                   step_up: int, make: Any) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """probe_runs.bracket over `make(n)`'s (layers, batch) points of one configuration."""
    return bracket(lambda n: probe(args, clock, config, shape, *make(n), steps=3), predicted, step_up)


def tokens_part(args: argparse.Namespace, clock: Clock, fixed: dict[str, int]) -> dict[str, Any]:
    """At the fixed model: stock with checkpointing's most tokens a step, then fit at twice them."""
    layers = fixed["layers"]
    calibration = [probe(args, clock, "torch+checkpoint", fixed, layers, b, steps=2) for b in (4, 8)]
    part: dict[str, Any] = {"calibration": calibration}
    if not all(p.get("fits") for p in calibration):
        return {**part, "why": "stock with checkpointing did not train at the calibration's batches"}
    # Forward and backward's peak, not the step's: at a small batch the optimizer's step (its
    # foreach temporaries) sets the step's peak and hides what a sample adds (on an H200 the
    # reserved peak was 16.4 GiB at both 2 and 4 samples, and the line ran to 21,065 samples).
    total = int(calibration[-1]["device_total_bytes"] * DEVICE_SHARE)
    predicted = extrapolate(calibration, "batch", total, "backward_peak_bytes")
    step_up = max(predicted // 10, 1)
    best, probes = bracket_points(args, clock, "torch+checkpoint", fixed, predicted, step_up, lambda b: (layers, b))
    part.update(predicted_batch=predicted, stock_checkpoint_probes=probes, stock_checkpoint_best=best)
    if best is None:
        return {**part, "why": "no batch of stock with checkpointing trained near the prediction"}
    part["fit"] = probe(args, clock, "stowage+plan+optimizer", fixed, layers, 2 * best["batch"], steps=3)
    return part


def model_part(args: argparse.Namespace, clock: Clock, large: dict[str, int]) -> dict[str, Any]:
    """Stock's largest model (layers of the large shape), then fit's at the host's limit or twice
    stock's, whichever is less."""
    batch = large["batch"]
    calibration = [probe(args, clock, "torch", large, layers, batch, steps=2) for layers in (2, 4)]
    part: dict[str, Any] = {"calibration": calibration}
    if not all(p.get("fits") for p in calibration):
        return {**part, "why": "stock did not train at the calibration's depths"}
    total = int(calibration[-1]["device_total_bytes"])
    predicted = extrapolate(calibration, "layers", total, "peak_reserved_bytes")
    best, probes = bracket_points(args, clock, "torch", large, predicted, 1, lambda n: (n, batch))
    part.update(predicted_layers=predicted, stock_probes=probes, stock_best=best)
    if best is None:
        return {**part, "why": "no depth of stock trained near the prediction"}
    per_layer = parameters_of(large, 2) - parameters_of(large, 1)
    host = host_available_bytes()
    host_limited = int((HOST_SHARE * host / host_bytes_per_parameter() - parameters_of(large, 0)) // per_layer)
    part["issue_host_limited_parameters"] = parameters_of(
        large, int((host / ISSUE_HOST_BYTES_PER_PARAMETER - parameters_of(large, 0)) // per_layer))
    layers = min(2 * best["layers"], host_limited)
    part.update(host_available_bytes=host, host_limited_layers=host_limited,
                host_limited_parameters=parameters_of(large, host_limited), twice_stock_layers=2 * best["layers"])
    fitted = probe(args, clock, "stowage+plan+optimizer", large, layers, batch, steps=2)
    if fitted.get("fits") and fitted.get("host_rss_bytes"):
        grown = fitted["host_rss_bytes"] - fitted.get("host_rss_before_bytes", 0)
        fitted["host_bytes_per_parameter"] = round(grown / fitted["parameters"], 2)
    part["fit"] = fitted
    return part


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--capacity", default="2GiB", help="CPU mode's simulated device (the dry run)")
    parser.add_argument("--small", action="store_true", help="the dry run's small shapes")
    parser.add_argument("--parts", nargs="+", choices=("tokens", "model"), default=("tokens", "model"))
    parser.add_argument("--budget-s", type=float, default=270.0)
    parser.add_argument("--json", help="write every probe here")
    args = parser.parse_args()
    clock = Clock(args.budget_s)
    fixed, large = (SMALL_FIXED, SMALL_LARGE) if args.small else (FIXED, LARGE)
    result: dict[str, Any] = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                              "machine": platform.node(), "command": " ".join(sys.argv), "fixed_model": fixed,
                              "large_model": large}
    for name in args.parts:
        print(f"-- {name}", flush=True)
        result[name] = tokens_part(args, clock, fixed) if name == "tokens" else model_part(args, clock, large)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
    print(summary(result))
    return 0


def summary(result: dict[str, Any]) -> str:
    lines = []
    tokens = result.get("tokens", {})
    stock, fitted = tokens.get("stock_checkpoint_best"), tokens.get("fit")
    if stock:
        lines.append(f"tokens a step, stock + checkpointing: {stock['tokens_per_step']} at "
                     f"{stock.get('tokens_per_s', 0):,.0f} tokens/s")
    if stock and fitted and fitted.get("fits"):
        lines.append(f"tokens a step, fit: {fitted['tokens_per_step']} ({fitted['tokens_per_step'] / stock['tokens_per_step']:.2f}x) "
                     f"at {fitted.get('tokens_per_s', 0):,.0f} tokens/s "
                     f"({fitted.get('tokens_per_s', 0) / max(stock.get('tokens_per_s', 1), 1):.0%} of stock's)")
    model = result.get("model", {})
    stock, fitted = model.get("stock_best"), model.get("fit")
    if stock:
        lines.append(f"largest model, stock: {stock['parameters'] / 1e9:.2f}B ({stock['layers']} layers)")
    if "host_limited_parameters" in model:
        lines.append(f"host-limited largest at {host_bytes_per_parameter()} B a parameter (the issue's "
                     f"{ISSUE_HOST_BYTES_PER_PARAMETER} B: {model['issue_host_limited_parameters'] / 1e9:.2f}B): "
                     f"{model['host_limited_parameters'] / 1e9:.2f}B ({model['host_limited_layers']} layers, "
                     f"{model['host_available_bytes'] / 2**30:.0f} GiB available)")
    if fitted:
        state = "trains" if fitted.get("fits") else f"does not train ({fitted.get('why')})"
        lines.append(f"largest model, fit: {fitted['parameters'] / 1e9:.2f}B ({fitted['layers']} layers) {state}"
                     + (f", {fitted['host_bytes_per_parameter']} host bytes a parameter"
                        if "host_bytes_per_parameter" in fitted else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
