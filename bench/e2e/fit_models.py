"""stowage.fit beyond decoders: the most rows a step that train under one device, for model kinds
whose batches have no sequence (images through a convolutional net, feature rows through an MLP),
stock PyTorch against stowage.fit. Each point runs in a fresh process (this script with --probe);
each search brackets then bisects (bench/e2e/fit_search.py's search).

    python3 bench/e2e/fit_models.py --capacity 160MiB [--models resnet18 mlp] [--json OUT]

Models (random weights, synthetic inputs, AdamW lr 1e-3, cross entropy over 100 classes):
  resnet18  torchvision's ResNet-18 on 3 x 96 x 96 images (11.2M parameters, BatchNorm)
  mlp       8 Linear+GELU layers 1024 wide on 1024-feature rows (8.4M parameters)
Configurations: torch (stowage's CPU mode alone, torch's AdamW: torch has no capped CPU device) and
fit (stowage.fit with the batch as its example). Prints a table of the most rows a step, the rows
a second there (median after the first two steps) and every step's time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODELS = ("resnet18", "mlp")
CONFIGS = ("torch", "fit")


def build(model_name: str, rows: int) -> tuple[Any, tuple[Any, Any]]:
    import torch

    torch.manual_seed(0)
    if model_name == "resnet18":
        import torchvision

        model = torchvision.models.resnet18(num_classes=100)
        inputs = torch.randn(rows, 3, 96, 96)
    else:
        layers = [m for _ in range(8) for m in (torch.nn.Linear(1024, 1024), torch.nn.GELU())]
        model = torch.nn.Sequential(*layers, torch.nn.Linear(1024, 100))
        inputs = torch.randn(rows, 1024)
    return model, (inputs, torch.randint(0, 100, (rows,)))


def probe(args: argparse.Namespace) -> dict[str, Any]:
    """One point, in this process: does `args.model` train at `args.rows` rows under `args.config`."""
    import torch

    import stowage

    stowage.enable(device="cpu", capacity=args.capacity)
    point: dict[str, Any] = {"model": args.model, "config": args.config, "rows": args.rows, "fits": False}
    try:
        model, batch = build(args.model, args.rows)
        point["parameters"] = sum(p.numel() for p in model.parameters())

        def loss_fn(m: Any, b: Any) -> Any:
            return torch.nn.functional.cross_entropy(m(b[0]), b[1])

        if args.config == "fit":
            fitted = stowage.fit(model, lambda ps: torch.optim.AdamW(ps, lr=1e-3), batch, loss_fn=loss_fn,
                                 verbose=False)
            point["device_fraction"] = fitted.device_fraction

            def step() -> None:
                fitted.step(batch)
        else:
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

            def step() -> None:
                loss_fn(model, batch).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

        times = []
        for _ in range(args.steps):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    except torch.OutOfMemoryError as error:
        point["why"] = str(error).splitlines()[0][:300]
        return point
    point.update(fits=True, step_s=times, rows_per_s=args.rows / statistics.median(times[2:] or times),
                 peak_bytes=stowage.max_memory_allocated())
    return point


def run_point(args: argparse.Namespace, model: str, config: str, rows: int) -> dict[str, Any]:
    from fit_search import probe_in_process

    command = [sys.executable, __file__, "--probe", "--model", model, "--config", config, "--rows", str(rows),
               "--capacity", args.capacity, "--steps", str(args.steps)]
    return probe_in_process(command, args.probe_timeout, {"model": model, "config": config, "rows": rows})


def markdown(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    rows = [f"stowage's CPU mode, {args.capacity}; {args.steps} steps a point, rows/s the median after the first two.",
            "", "| model | configuration | most rows a step | states on the device | rows/s | step times (ms) | "
            "points probed |", "|---|---|---|---|---|---|---|"]
    for result in results:
        found = result["most_rows"]
        if found is None:
            cells = ["none fits", "-", "-", "-"]
        else:
            share = f"{found['device_fraction']:.0%}" if "device_fraction" in found else "all"
            steps = ", ".join(f"{s * 1e3:.0f}" for s in found["step_s"])
            cells = [str(found["rows"]), share, f"{found['rows_per_s']:,.0f}", steps]
        rows.append(f"| {result['model']} | {result['config']} | " + " | ".join(cells) +
                    f" | {len(result['probes'])} |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capacity", default="160MiB")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=MODELS)
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=CONFIGS)
    parser.add_argument("--start", type=int, default=4, help="the first batch each search tries")
    parser.add_argument("--max-rows", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--probe-timeout", type=int, default=600)
    parser.add_argument("--json", help="write every probe and answer here")
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=MODELS, help=argparse.SUPPRESS)
    parser.add_argument("--config", choices=CONFIGS, help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(probe(args)))
        return 0
    sys.path.insert(0, str(HERE))
    from fit_search import search

    results = []
    for model in args.models:
        for config in args.configs:
            print(f"{model}, {config}:", file=sys.stderr, flush=True)
            found, probes = search(lambda n: run_point(args, model, config, n), args.start, args.max_rows)
            results.append({"model": model, "config": config, "most_rows": found, "probes": probes})
    table = markdown(results, args)
    print(table)
    if args.json:
        record = {"date": datetime.date.today().isoformat(), "machine": platform.node(), "arguments": vars(args),
                  "results": results, "table": table}
        Path(args.json).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
