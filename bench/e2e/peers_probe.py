"""One point of bench/e2e/peers_at_budget.py: does one system (peer_systems.SYSTEMS) train one
decoder (decoder_ladder.DecoderShape) at batch x seq under a device budget, and how fast. Run in a
fresh interpreter per point. The cap is torch's set_per_process_memory_fraction for the peers and
stowage's allocator limit plus fit(budget=) for stowage; in CPU mode every system runs on stowage's
CPU mode (a simulated device of the budget's size: torch has no capped CPU device).

    python3 bench/e2e/peers_probe.py --system stowage-fit --device cpu --budget 64MiB \
        --shape tiny-c,128,344,4,4,2,2048,1,4 --batch 2 --seq 128 --steps 3

Prints one JSON line: fits (true, false: out of memory or refused with the reason; null: the
system cannot run here, `why` says so), parameters, the setup's time (the model's build, the
optimizer's, and for stowage.fit its decision), every step's wall time, tokens a second (the
median of the steps after the first), the device's peak reserved bytes and its total, and the
host bytes a parameter (the process's resident memory after the first step less before the model
was built, pinned buffers included, over the parameter count).
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from decoder_ladder import shape_from  # noqa: E402
from probe_runs import resident_bytes  # noqa: E402

SYSTEM_NAMES = ("torch+checkpoint", "torchao-offload", "torchao-offload+gradients", "fsdp2-cpu-offload",
                "deepspeed-zero2-offload", "deepspeed-zero3-offload", "stowage-fit", "stowage-fit+parameters")


def byte_size(text: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
    for suffix, scale in units.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * scale)
    return int(text)


def choose_allocator(system: str, device: str, budget: int | None) -> None:
    """Before torch touches the device: stowage's CPU mode of the budget's size, or on a GPU
    stowage (capped by its limit) for stowage's rows and torch's allocator for the peers."""
    if device == "cpu":
        import stowage

        if budget is None:
            raise SystemExit("CPU mode needs --budget: it is the simulated device's size")
        stowage.enable(device="cpu", capacity=budget)
    elif system.startswith("stowage"):
        import stowage

        stowage.enable(f"limit:{budget}" if budget is not None else None, device="cuda")


def cap_torch(system: str, device: str, budget: int | None) -> None:
    import torch

    if device == "cuda" and budget is not None and not system.startswith("stowage"):
        total = torch.cuda.mem_get_info()[1]
        torch.cuda.set_per_process_memory_fraction(min(budget / total, 1.0))


def memory_figures(device: str) -> dict[str, int]:
    import torch

    import stowage

    if device == "cpu" or stowage.is_enabled():
        total = int(stowage._torch.capacity(-1)) if device == "cpu" else int(torch.cuda.mem_get_info()[1])
        return {"peak_reserved_bytes": int(stowage.max_memory_reserved()), "device_total_bytes": total}
    return {"peak_reserved_bytes": int(torch.cuda.max_memory_reserved()),
            "device_total_bytes": int(torch.cuda.mem_get_info()[1])}


def probe(args: argparse.Namespace) -> dict[str, Any]:
    budget = byte_size(args.budget) if args.budget else None
    choose_allocator(args.system, args.device, budget)
    import torch

    from peer_systems import SYSTEMS, Trial, Unavailable

    shape = shape_from(args.shape)
    result: dict[str, Any] = {"system": args.system, "model": shape.name, "parameters": shape.parameters(),
                              "batch": args.batch, "seq": args.seq, "tokens_per_step": args.batch * args.seq,
                              "budget_bytes": budget, "fits": False}
    if args.device == "cuda":
        torch.cuda.init()
    cap_torch(args.system, args.device, budget)
    before = resident_bytes()
    times: list[float] = []
    losses: list[float] = []
    try:
        started = time.perf_counter()
        step = SYSTEMS[args.system](Trial(shape, args.device, args.batch, args.seq, budget))
        result["setup_s"] = round(time.perf_counter() - started, 2)  # the build, and fit's decision
        for _ in range(args.steps):
            started = time.perf_counter()
            losses.append(step())
            if args.device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - started)
            if len(times) == 1:
                result["host_bytes_per_parameter"] = round((resident_bytes() - before) / shape.parameters(), 2)
        result["fits"] = True
    except Unavailable as error:
        result.update(fits=None, why=str(error))
    except torch.OutOfMemoryError as error:
        result["why"] = "out of memory: " + str(error).splitlines()[0][:300]
    except (RuntimeError, ValueError) as error:  # a refusal before training (fit's "too large"), or a peer's
        result["why"] = f"{type(error).__name__}: " + " ".join(str(error).split())[:400]
    result["step_s"] = [round(t, 4) for t in times]
    result["losses"] = [round(loss, 4) for loss in losses]
    if result["fits"] and times:
        result["tokens_per_s"] = round(args.batch * args.seq / statistics.median(times[1:] or times), 1)
    result.update(memory_figures(args.device))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--system", choices=SYSTEM_NAMES, required=True)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--budget", help="the device cap (bytes or 24GiB); none: the whole device")
    parser.add_argument("--shape", required=True, help="decoder_ladder.DecoderShape.arguments()'s form")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    print(json.dumps(probe(args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
