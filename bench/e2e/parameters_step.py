"""Parameters off the device (stowage.offload.parameters) against training with them on it: step
time, the device's peak during a step, the device's memory between steps, the host bytes, for
GPT-2-shaped decoders (bench/e2e/gpt2_model.py; torch's AdamW, fp32 parameters, bf16 autocast).

Runs the two modes interleaved in one process, each round a fresh model from seed 0, and checks
that both end with the same parameters bit for bit (CPU mode) or within torch's own spread (a
GPU). Prints a table of medians; --json writes every figure.

    python bench/e2e/parameters_step.py --device cpu --layers 8 --width 512 --rounds 3
    python bench/e2e/parameters_step.py --device cuda --layers 24 --width 2048 --seq 2048

--count adds, for the parameters mode, the host's waits for copies per step (calls waiting for
every copy issued, and waits for a gradient's copy that had not landed) and the calls into the
device copies' Python guard per step; it wraps the handle's transfers, so time without it.
"""

from __future__ import annotations

import argparse
import json
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
                        synchronize, training_step)

MODES = ("plain", "parameters")


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of each mode")
    parser.add_argument("--prefetch", type=int, default=1)
    parser.add_argument("--count", action="store_true", help="count host waits and guard calls (not timed)")
    parser.add_argument("--json", type=Path)
    return parser.parse_args()


def peak_and_allocated(device: str) -> tuple[int, int]:
    if device == "cuda":
        return torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()
    return stowage.max_memory_allocated(), stowage.memory_allocated()


def reset_peak(device: str) -> None:
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    else:
        stowage.reset_peak_stats()


class WaitCounter:
    """Stands in for a handle's parameter transfers: counts the calls waiting for every copy
    issued so far (synchronize) and passes every call on."""

    def __init__(self, transfers: Any) -> None:
        self.transfers, self.synchronized = transfers, 0

    def synchronize(self) -> None:
        self.synchronized += 1
        self.transfers.synchronize()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transfers, name)

    def host_waits(self) -> int:
        return self.synchronized + int(getattr(self.transfers, "host_waits", 0))


GUARD_CALLS = [0]


def count_guard_calls() -> list[int]:
    """Counts the calls into the device copies' Python guard (their class's __torch_function__)
    in GUARD_CALLS, reset to 0."""
    kind = sys.modules["stowage.offload.parameters"]._device_copy_type()
    if "counted" not in kind.__dict__:
        guard = kind.__dict__["__torch_function__"].__func__

        def counted(cls: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            GUARD_CALLS[0] += 1
            return guard(cls, func, types, args, kwargs)

        kind.__torch_function__ = classmethod(counted)
        kind.counted = True
    GUARD_CALLS[0] = 0
    return GUARD_CALLS


def run(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    """One run of `mode`: a fresh model, `warmup` + `steps` steps; its figures and parameters."""
    device = "cuda" if args.device == "cuda" else "cpu"
    model, _ = seeded_model_and_tokens(args.layers, args.width, args.batch, args.seq, device, args.vocab)
    handle = stowage.offload.parameters(model, prefetch=args.prefetch) if mode == "parameters" else None
    counter = guard_calls = None
    if handle is not None and args.count:
        counter = handle._transfers = WaitCounter(handle._transfers)
        guard_calls = count_guard_calls()
    optimizer = make_optimizer(model)
    generator = torch.Generator().manual_seed(1)
    times, peaks = [], []
    _, between = peak_and_allocated(device)
    for step in range(args.warmup + args.steps):
        tokens, targets = random_batch(args.batch, args.seq, args.vocab, device, generator)
        synchronize(device)
        reset_peak(device)
        started = time.perf_counter()
        training_step(model, optimizer, tokens, targets)
        synchronize(device)
        if step >= args.warmup:
            times.append((time.perf_counter() - started) * 1e3)
            peaks.append(peak_and_allocated(device)[0])
            between = peak_and_allocated(device)[1]
    result = {"mode": mode, "step_ms": times, "peak_bytes": max(peaks), "between_steps_bytes": between,
              "parameters": sum(p.numel() for p in model.parameters()),
              "host_parameter_bytes": handle.host_bytes if handle else 0,
              "window_bytes": handle.peak_resident_bytes if handle else 0}
    if counter is not None and guard_calls is not None:
        total = args.warmup + args.steps
        result["host_waits_per_step"] = counter.host_waits() / total
        result["guard_calls_per_step"] = guard_calls[0] / total
        print(f"parameters: {result['host_waits_per_step']:g} host waits a step, "
              f"{result['guard_calls_per_step']:g} guard calls a step")
    if handle is not None:
        handle.close()
    # numpy's memory, not the device's (in CPU mode torch's CPU tensors are the simulated device's)
    result["final"] = [p.detach().float().cpu().numpy().copy() for p in model.parameters()]
    return result


def main() -> int:
    args = parse()
    if args.device == "cpu":
        stowage.enable(device="cpu", capacity=args.capacity)
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            runs[mode].append(run(args, mode))
            if len(runs[mode]) > 1:
                runs[mode][-1].pop("final")  # the first round's are compared
            if args.device == "cpu":
                stowage.mark_step()
    plain, offloaded = runs["plain"][0]["final"], runs["parameters"][0]["final"]
    differs = max(float(abs(a - b).max()) for a, b in zip(plain, offloaded))
    print(f"{args.layers} layers x {args.width}, batch {args.batch} x {args.seq}, {args.device}; "
          f"{runs['plain'][0]['parameters'] / 1e6:.1f}M parameters; largest difference from plain: {differs:g}")
    print(f"{'mode':<12}{'step ms (median)':>18}{'device peak MiB':>17}{'between steps MiB':>19}{'host MiB':>10}")
    summary = {}
    for mode in MODES:
        median = statistics.median(t for r in runs[mode] for t in r["step_ms"])
        peak = statistics.median(r["peak_bytes"] for r in runs[mode])
        between = statistics.median(r["between_steps_bytes"] for r in runs[mode])
        host = runs[mode][0]["host_parameter_bytes"]
        summary[mode] = {"step_ms_median": median, "peak_bytes": peak, "between_steps_bytes": between,
                         "host_parameter_bytes": host, "window_bytes": runs[mode][0]["window_bytes"]}
        print(f"{mode:<12}{median:>18.1f}{peak / 2**20:>17.1f}{between / 2**20:>19.1f}{host / 2**20:>10.1f}")
    if args.json:
        for mode in MODES:
            runs[mode][0].pop("final")
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "summary": summary,
                                         "largest_difference": differs, "runs": runs}, indent=1))
    return 0 if args.device == "cuda" or differs == 0.0 else 1


if __name__ == "__main__":
    sys.exit(main())
