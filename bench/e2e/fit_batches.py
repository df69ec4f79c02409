"""stowage.fit's batch arithmetic against stock PyTorch with full activation checkpointing, on
twelve models (bench/e2e/batch_models.py: six decoders, four of them Hugging Face's, an encoder,
an encoder-decoder, three torchvision nets, an MLP), in CPU mode on one simulated device.

    python3 bench/e2e/fit_batches.py [--bytes-per-parameter 24] [--models gpt2 vit] [--json OUT]

The device of each model holds BYTES_PER_PARAMETER bytes a parameter (rounded up to MiB): room
for torch's AdamW (16 B a parameter: parameters, gradients, two moments) and a little more, the
regime of a model that barely trains on its device. Per model, each in a fresh process:
1. stock + checkpointing: torch's AdamW, every block recomputed; the most rows ``m`` a
   micro-batch trains at, running the global batch ``4 m`` (held on the device) as 4
   micro-batches (as many steps as a timed run; doubling, then bisecting);
2. at the global batch ``G = 4 m``: stock + checkpointing runs 4 micro-batches of ``m`` (each loss
   times its rows' share); stowage.fit(micro_batches="auto", split_batchnorm=True: BatchNorm sees
   micro-batches in stock's accumulation too) is given ``G`` and chooses; each
   runs 1 warm-up and STEPS timed steps, the two interleaved (stock, fit, stock, fit).
Reported: fit's micro-batch against ``m``, samples/s of each at ``G`` (median of all timed steps,
every step's time listed), fit's measured peak against the device, the plan's departed steps,
fit's decision time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from batch_models import DECODERS, MODELS  # noqa: E402

STEPS = 3
ACCUMULATION = 4  # stock's micro-batches a global batch


def _setup(args: argparse.Namespace) -> tuple[Any, Any, Any, Any, str]:
    import torch

    import stowage
    from batch_models import build

    torch.set_num_threads(2)
    stowage.enable(device="cpu", capacity=args.capacity)
    torch.manual_seed(0)
    model, batches, loss_fn, kind = build(args.model)
    model.train()
    return torch, model, batches, loss_fn, kind


def _stock_step(torch: Any, model: Any, optimizer: Any, loss_fn: Any, pieces: list[Any], rows: int) -> None:
    for piece in pieces:
        share = _rows(piece) / rows
        (loss_fn(model, piece) * share).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def split(batch: Any, micro_rows: int) -> list[Any]:
    """`batch` cut into the fewest near-equal micro-batches of at most `micro_rows` rows (MicroCut)."""
    from stowage._core import MicroCut
    from stowage.fitting.batches import BatchLayout

    layout = BatchLayout.of(batch)
    return layout.pieces(batch, MicroCut(layout.rows, 1, micro_rows).bounds(layout.rows))


def _rows(batch: Any) -> int:
    from stowage.fitting.batches import BatchLayout

    return BatchLayout.of(batch).rows


def point(args: argparse.Namespace) -> dict[str, Any]:
    """Whether a checkpointed stock step trains at micro-batches of args.micro rows (a global batch
    of ACCUMULATION of them, as many steps as a timed run takes), in this fresh process."""
    torch, model, batches, loss_fn, kind = _setup(args)
    from batch_models import full_checkpointing

    blocks = full_checkpointing(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = batches(ACCUMULATION * args.micro)
    result = {"kind": kind, "parameters": sum(p.numel() for p in model.parameters()), "blocks": blocks}
    try:
        for _ in range(STEPS + 1):
            _stock_step(torch, model, optimizer, loss_fn, split(batch, args.micro), ACCUMULATION * args.micro)
    except torch.OutOfMemoryError:
        return {**result, "fits": False}
    return {**result, "fits": True}


def search(args: argparse.Namespace) -> dict[str, Any]:
    """The most rows a checkpointed stock micro-batch trains at: doubling, then bisecting, each
    point in a fresh process."""
    tried: dict[int, bool] = {}
    facts: dict[str, Any] = {}

    def fits(rows: int) -> bool:
        answer = _child(args, "point", micro=rows)
        if "error" in answer:
            raise RuntimeError(answer["error"])
        facts.update({k: v for k, v in answer.items() if k != "fits"})
        tried[rows] = answer["fits"]
        return tried[rows]

    low, high = 0, 1
    while high <= args.max_rows and fits(high):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return {**facts, "most_rows": low, "tried": tried}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """STEPS timed steps at args.rows (the global batch) as stock + checkpointing (micro-batches of
    args.micro) or as stowage.fit chose."""
    import io
    import contextlib

    torch, model, batches, loss_fn, kind = _setup(args)
    import stowage
    from stowage.serving import device_index, torch_module

    batch = batches(args.rows)
    result: dict[str, Any] = {"config": args.config, "rows": args.rows}
    if args.config == "stock":
        from batch_models import full_checkpointing

        full_checkpointing(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        pieces = split(batch, args.micro)
        result["micro_rows"] = max(_rows(p) for p in pieces)

        def step() -> None:
            _stock_step(torch, model, optimizer, loss_fn, pieces, args.rows)
    else:
        started = time.perf_counter()
        table = io.StringIO()
        with contextlib.redirect_stdout(table):
            fitted = stowage.fit(model, lambda ps: torch.optim.AdamW(ps, lr=1e-4), batch, loss_fn=loss_fn,
                                 micro_batches="auto", split_batchnorm=True)
        result.update(decision_s=time.perf_counter() - started, table=table.getvalue(),
                      micro_rows=fitted.chosen.micro_rows, micro_batches=fitted.chosen.micro_batches,
                      device_fraction=fitted.device_fraction, units=fitted.units.name if fitted.units else None,
                      predicted_ms=fitted.chosen.step_ms)

        def step() -> None:
            fitted.step(batch)
    start_bytes = stowage.memory_allocated()
    stowage.reset_peak_stats()
    times = []
    for _ in range(STEPS + 1):
        began = time.perf_counter()
        step()
        times.append(time.perf_counter() - began)
    result.update(step_s=times[1:], peak_bytes=stowage.max_memory_allocated(), start_bytes=start_bytes,
                  capacity=int(torch_module().capacity(device_index(torch.device("cpu")))))
    if args.config == "fit":
        result["departed_steps"] = fitted.plan.departed_steps if fitted.plan is not None else 0
        result["plan_steps"] = fitted.plan.steps if fitted.plan is not None and hasattr(fitted.plan, "steps") else None
    return result


def _child(args: argparse.Namespace, mode: str, **extra: Any) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", mode, "--model", args.model_name, "--capacity", args.capacity,
               "--max-rows", str(args.max_rows)]
    for name, value in extra.items():
        command += [f"--{name}", str(value)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1][:400]}
    return json.loads(lines[-1])


def _capacity(name: str, bytes_per_parameter: float) -> str:
    import torch

    from batch_models import build

    with torch.device("meta"):
        model = build(name)[0]
    parameters = sum(p.numel() for p in model.parameters())
    return f"{-(-int(parameters * bytes_per_parameter) // (1 << 20))}MiB"


def measure(args: argparse.Namespace, name: str) -> dict[str, Any]:
    args.model_name = name
    args.capacity = _capacity(name, args.bytes_per_parameter)
    try:
        found = search(args)
    except RuntimeError as error:
        found = {"error": str(error)}
    if "error" in found or found["most_rows"] == 0:
        return {"model": name, "capacity": args.capacity, "search": found}
    micro = found["most_rows"]
    rows = ACCUMULATION * micro
    runs: dict[str, list[dict[str, Any]]] = {"stock": [], "fit": []}
    for _ in range(2):
        runs["stock"].append(_child(args, "run", config="stock", rows=rows, micro=micro))
        runs["fit"].append(_child(args, "run", config="fit", rows=rows, micro=micro))
    return {"model": name, "capacity": args.capacity, "search": found, "rows": rows, "runs": runs}


def _samples_per_s(runs: list[dict[str, Any]], rows: int) -> tuple[float, list[float]]:
    times = [t for run in runs if "step_s" in run for t in run["step_s"]]
    return (rows / statistics.median(times) if times else float("nan")), times


def markdown(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [f"stowage's CPU mode, a device of {args.bytes_per_parameter:g} B a parameter; global batch G = "
             f"{ACCUMULATION} x stock's most rows with full "
             f"checkpointing; samples/s the median of {2 * STEPS} timed steps (two fresh processes each, "
             "interleaved); fit given G with micro_batches=\"auto\" (split_batchnorm=True: stock's accumulation cuts "
             "BatchNorm's batches too).", "",
             "| model | parameters (device) | stock + ckpt: most rows | G | fit: micro-batches x rows (states on device) | "
             "fit's micro / stock's | samples/s stock + ckpt | samples/s fit | fit / stock | fit's peak / device | "
             "departed steps | fit decides (s) |", "|---" * 12 + "|"]
    notes = []
    for result in results:
        search = result["search"]
        if "runs" not in result:
            lines.append(f"| {result['model']} | | {search.get('error', 'nothing fits')} |" + " |" * 9)
            continue
        fits = [r for r in result["runs"]["fit"] if "step_s" in r]
        stocks = [r for r in result["runs"]["stock"] if "step_s" in r]
        if not fits or not stocks:
            errors = [r.get("error", "") for r in result["runs"]["fit"] + result["runs"]["stock"] if "error" in r]
            lines.append(f"| {result['model']} | {search['parameters'] / 1e6:.1f}M ({result['capacity']}) | "
                         f"{search['most_rows']} | {result['rows']} | failed: {errors[0][:160] if errors else '?'} |" + " |" * 7)
            continue
        stock_rate, stock_times = _samples_per_s(stocks, result["rows"])
        fit_rate, fit_times = _samples_per_s(fits, result["rows"])
        chosen = fits[0]
        peak = max(r["peak_bytes"] for r in fits) / chosen["capacity"]
        departed = sum(r["departed_steps"] for r in fits)
        decide = ", ".join(f"{r['decision_s']:.1f}" for r in fits)
        lines.append(
            f"| {result['model']} | {search['parameters'] / 1e6:.1f}M ({result['capacity']}) | {search['most_rows']} | "
            f"{result['rows']} | "
            f"{chosen['micro_batches']} x {chosen['micro_rows']} ({chosen['device_fraction']:.0%}) | "
            f"{chosen['micro_rows'] / search['most_rows']:.2f}x | {stock_rate:.2f} | {fit_rate:.2f} | "
            f"{fit_rate / stock_rate:.2f} | {peak:.2f} | {departed} | {decide} |")
        notes.append(f"- {result['model']} ({search['kind']}): step times (s) stock + ckpt "
                     f"{', '.join(f'{t:.2f}' for t in stock_times)}; fit {', '.join(f'{t:.2f}' for t in fit_times)}; "
                     f"fit's loss units: {chosen['units']}; predicted {chosen['predicted_ms']:.0f} ms")
    return "\n".join(lines + ["", "Per-step times:", ""] + notes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bytes-per-parameter", type=float, default=24.0)
    parser.add_argument("--capacity", help=argparse.SUPPRESS)
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--max-rows", type=int, default=4096)
    parser.add_argument("--timeout", type=int, default=1200)
    parser.add_argument("--json", help="write every measurement here")
    parser.add_argument("--child", choices=("point", "run"), help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=MODELS, help=argparse.SUPPRESS)
    parser.add_argument("--config", choices=("stock", "fit"), help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--micro", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import warnings

        warnings.simplefilter("ignore")
        print(json.dumps(point(args) if args.child == "point" else run(args)))
        return 0
    results = []
    for name in args.models:
        print(f"{name} ...", file=sys.stderr, flush=True)
        results.append(measure(args, name))
        if args.json:
            Path(args.json).write_text(json.dumps({"results": results}, indent=1))
    table = markdown(results, args)
    print(table)
    if args.json:
        record = {"date": datetime.date.today().isoformat(), "machine": platform.node(), "arguments": vars(args),
                  "decoders": DECODERS, "results": results, "table": table}
        Path(args.json).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
