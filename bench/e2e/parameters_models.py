"""stowage.offload.parameters and stowage.fit(offload_parameters="auto") on models stowage did not
write (bench/e2e/zoo_models.py: transformers, torchvision, peft at tiny sizes), in CPU mode, each
against plain torch over the same AdamW steps from the same seed and batches.

    python bench/e2e/parameters_models.py [--models gpt2 t5 ...] [--steps 3] [--rounds 3] [--fit] [--json OUT]

For each model: the units found (stowage.offload.parameters' default: the model's repeated
blocks), whether the losses, the gradients the loop sees before step() and the parameters after
every step equal torch's bit for bit, the device bytes the handle let go of against the units'
parameters' bytes, and the step time against torch's (medians of `--rounds` interleaved rounds,
each a fresh model; the steps after the first). --fit adds, with torch's SGD (fit offers the
blocks' parameters on the host with the factory's optimizer whole on the device, so AdamW's states
would decide the budget): the least room beyond what is in use (searched to 64 KiB) at which fit's
default (the blocks' parameters on the device) trains, the least at which
fit(offload_parameters="auto") does, what auto chose midway between the two, and whether its steps equal torch's.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import stowage  # noqa: E402
import stowage.offload  # noqa: E402
from stowage.offload.parameters import block_units  # noqa: E402
from zoo_models import CASES, Case  # noqa: E402

MiB = 1 << 20
HYPER = dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, foreach=True)


def adamw(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, **HYPER)  # type: ignore[arg-type]


def sgd(params: Any) -> torch.optim.Optimizer:
    """fit's search: an optimizer without states (fit offers the blocks' parameters on the host with
    the factory's optimizer whole on the device, and AdamW's states there would decide the budget)."""
    return torch.optim.SGD(params, lr=0.1)


def trace(case: Case, offload: bool, steps: int, factory: Any = adamw) -> dict[str, Any]:
    """Trains a fresh model of `case` `steps` AdamW steps, with its units' parameters off the device
    or not: every step's loss and gradients (as the loop sees them before step()), the parameters
    after each step, each step's milliseconds, and what the handle took off the device."""
    model = case.build()
    names = [n for n, _ in model.named_parameters()]
    record: dict[str, Any] = {"units": None, "saved": 0, "unit_bytes": 0}
    handle = None
    if offload:
        units = block_units(model)
        record["units"] = units_summary(model, units)
        record["unit_bytes"] = sum(p.numel() * p.element_size() for u in units for p in u.parameters())
        before = stowage.memory_allocated()
        handle = stowage.offload.parameters(model)
        record["saved"] = before - stowage.memory_allocated()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = factory(trainable)
    record.update(losses=[], grads=[], params=[], step_ms=[], buffers=None)
    try:
        for step in range(steps):
            start = time.perf_counter()
            loss = case.step_loss(model, step)
            loss.backward()
            record["grads"].append({n: None if p.grad is None else p.grad.detach().clone()
                                    for n, p in model.named_parameters() if p.requires_grad})
            optimizer.step()
            optimizer.zero_grad()
            record["step_ms"].append((time.perf_counter() - start) * 1e3)
            record["losses"].append(loss.detach().clone())
            record["params"].append([p.detach().clone() for p in model.parameters()])
        record["buffers"] = [b.detach().clone() for b in model.buffers()]
    finally:
        if handle is not None:
            handle.close()
    record["names"] = names
    return record


def units_summary(model: Any, units: list[Any]) -> str:
    """The units as the names of the module lists that hold them, with counts."""
    paths = {id(m): n for n, m in model.named_modules()}
    parents: dict[str, int] = {}
    for unit in units:
        parent = paths[id(unit)].rpartition(".")[0] or "(root)"
        parents[parent] = parents.get(parent, 0) + 1
    return ", ".join(f"{parent} x{count}" for parent, count in parents.items())


def differences(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """What differs between two traces, bit for bit (empty: nothing)."""
    said = []
    for step, (a, b) in enumerate(zip(ours["losses"], theirs["losses"])):
        if not torch.equal(a, b):
            said.append(f"step {step}: loss {a.item()} against {b.item()}")
    for step, (a, b) in enumerate(zip(ours["grads"], theirs["grads"])):
        for name in b:
            x, y = a.get(name), b[name]
            if (x is None) != (y is None) or (x is not None and not torch.equal(x, y)):
                said.append(f"step {step}: gradient of {name}")
    for step, (a, b) in enumerate(zip(ours["params"], theirs["params"])):
        said += [f"step {step}: parameter {n}" for n, x, y in zip(ours["names"], a, b) if not torch.equal(x, y)]
    for a, b in zip(ours["buffers"] or [], theirs["buffers"] or []):
        if not torch.equal(a, b):
            said.append("a buffer (running statistics)")
    return said


def compare(case: Case, steps: int, rounds: int) -> dict[str, Any]:
    """Interleaved rounds of torch and offloaded training of `case`; the first round's traces are
    compared bit for bit."""
    times: dict[str, list[float]] = {"torch": [], "parameters": []}
    row: dict[str, Any] = {"model": case.name}
    for index in range(rounds):
        theirs = trace(case, False, steps)
        try:
            ours = trace(case, True, steps)
        except Exception as error:  # noqa: BLE001 (the table says what each model met)
            row.update(units=row.get("units"), error=f"{type(error).__name__}: {error}")
            return row
        if index == 0:
            row.update(units=ours["units"], unit_bytes=ours["unit_bytes"], saved=ours["saved"],
                       differences=differences(ours, theirs))
        times["torch"] += theirs["step_ms"][1:]
        times["parameters"] += ours["step_ms"][1:]
    row["torch_ms"] = statistics.median(times["torch"])
    row["parameters_ms"] = statistics.median(times["parameters"])
    row["torch_min_ms"], row["parameters_min_ms"] = min(times["torch"]), min(times["parameters"])
    return row


def fit_trace(case: Case, steps: int, room: int | None, offload_parameters: Any) -> dict[str, Any]:
    """fit's step on a fresh model at a budget of `room` bytes beyond what is in use before the
    model is made (None: no budget): what it chose and its trace (as `trace`)."""
    gc.collect()
    budget = None if room is None else stowage.memory_allocated() + room
    model = case.build()
    fitted = stowage.fit(model, sgd, case.batch(0), loss_fn=case.run, budget=budget, verbose=False,
                         offload_parameters=offload_parameters)
    chosen = (f"{'blocks on the host' if fitted.parameters_on_host else 'blocks on the device'}, "
              f"{fitted.device_fraction:.0%} of states on the device")
    record: dict[str, Any] = {"chosen": chosen, "on_host": fitted.parameters_on_host, "losses": [],
                              "grads": [], "params": [], "names": [n for n, _ in model.named_parameters()]}
    try:
        for step in range(steps):
            record["losses"].append(fitted.step(case.batch(step)).detach().clone())
            record["params"].append([p.detach().clone() for p in model.parameters()])
        record["buffers"] = [b.detach().clone() for b in model.buffers()]
    finally:
        fitted.close()
    return record


def fits(case: Case, room: int, offload_parameters: Any) -> bool:
    try:
        fit_trace(case, 1, room, offload_parameters)
        return True
    except torch.OutOfMemoryError:
        return False


def smallest_room(case: Case, offload_parameters: Any, low: int, high: int, step: int) -> int | None:
    """The smallest room (fit_trace's) in (low, high], to `step` bytes, at which fit trains `case`
    (None: not even at `high`)."""
    if not fits(case, high, offload_parameters):
        return None
    while high - low > step:
        middle = (low + high) // 2
        if fits(case, middle, offload_parameters):
            high = middle
        else:
            low = middle
    return high


def fit_row(case: Case, steps: int) -> dict[str, Any]:
    """Where fit's default (the parameters on the device) stops fitting, whether "auto" trains
    below it, what it chose there and whether its steps equal torch's."""
    device_budget = smallest_room(case, False, 0, 256 * MiB, 64 << 10)
    if device_budget is None:
        return {"fit": "no budget up to 256 MiB fits"}
    auto_budget = smallest_room(case, "auto", 0, device_budget, 64 << 10)
    assert auto_budget is not None
    row: dict[str, Any] = {"device_budget": device_budget, "auto_budget": auto_budget}
    if device_budget - auto_budget < 4 * (64 << 10):
        row["fit"] = "auto fits no lower than the device option"
        return row
    # Midway: clear of both searches' edges (fit's measurements vary a little from run to run).
    room = (auto_budget + device_budget) // 2
    theirs = trace(case, False, steps, sgd)
    try:
        ours = fit_trace(case, steps, room, "auto")
    except torch.OutOfMemoryError as error:
        row["fit"] = f"auto refused midway: {str(error).splitlines()[0]}"
        return row
    row.update(fit_on_host=ours["on_host"], fit_chosen=ours["chosen"],
               fit_differences=differences(ours, {**theirs, "grads": []}))
    return row


def table(rows: list[dict[str, Any]], with_fit: bool) -> str:
    header = ("| model | units found | bitwise | device bytes saved / units' parameters | "
              "step ms, median: torch, parameters (x) | fastest: torch, parameters |")
    rule = "|---|---|---|---|---|---|"
    if with_fit:
        header += " fit: least room, device option's and auto's | auto chose | auto bitwise |"
        rule += "---|---|---|"
    lines = [header, rule]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['model']} | {row.get('units')} | refused or failed: {row['error'][:120]} | | | |")
            continue
        same = "yes" if not row["differences"] else f"no ({len(row['differences'])}: {row['differences'][0]})"
        line = (f"| {row['model']} | {row['units']} | {same} | {row['saved']:,} / {row['unit_bytes']:,} | "
                f"{row['torch_ms']:.1f}, {row['parameters_ms']:.1f} ({row['parameters_ms'] / row['torch_ms']:.2f}x) | "
                f"{row['torch_min_ms']:.1f}, {row['parameters_min_ms']:.1f} |")
        if with_fit:
            if "fit_differences" in row:
                fit_same = "yes" if not row["fit_differences"] else f"no ({row['fit_differences'][0]})"
                line += (f" {row['device_budget'] / MiB:.2f}, {row['auto_budget'] / MiB:.2f} MiB | "
                         f"{row['fit_chosen']} | {fit_same} |")
            else:
                line += f" {row.get('fit')} | | |"
        lines.append(line)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", choices=sorted(CASES), default=list(CASES))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fit", action="store_true", help="search fit's budgets and try offload_parameters='auto'")
    parser.add_argument("--capacity", default="4GiB", help="CPU mode's device")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    stowage.enable(device="cpu", capacity=args.capacity)
    rows = []
    for name in args.models:
        row = compare(CASES[name], args.steps, args.rounds)
        if args.fit and "error" not in row:
            row.update(fit_row(CASES[name], args.steps))
        rows.append(row)
        print(f"{name}: {'error' if 'error' in row else 'done'}", file=sys.stderr, flush=True)
    print(f"{platform.node()} ({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}), torch {torch.__version__}, "
          f"{args.steps} steps, {args.rounds} rounds, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(table(rows, args.fit))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
