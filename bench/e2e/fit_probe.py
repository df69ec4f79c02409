"""One point of bench/e2e/fit_search.py: does a Llama-style decoder of `--layers` layers train at
`--batch` x `--seq` tokens a step under one configuration, and at how many tokens a second. Run in
a fresh interpreter per point (an allocator is chosen once a process; an out-of-memory leaves a
process's caches as they were).

    python3 bench/e2e/fit_probe.py --config stowage+plan+optimizer --device cpu --capacity 160MiB \
        --hidden 256 --layers 6 --batch 4 --seq 256 --steps 4

Configurations (the LM loss is chunked in every one, stowage.models.llama's chunked_loss):
  torch                   torch's CUDA allocator, torch's AdamW (in CPU mode: stowage's CPU mode,
                          nothing else: torch has no capped CPU device)
  torch+checkpoint        the same, every block's activations recomputed in backward
  torch+expandable        torch's allocator with expandable segments (GPU only)
  stowage                 stowage's allocator, torch's AdamW (on a GPU; in CPU mode, as torch)
  stowage+offload         stowage.offload.activations() around forward and backward
  stowage+plan            stowage.fit with the optimizer's states kept on the device
  stowage+plan+optimizer  stowage.fit: states where it chooses, activations planned
FIT_VERBOSE=1 in the environment prints fit's decision table. ``--cost '{"to_host_bytes_per_ms": ...}'``
gives fit the planner's cost model instead of its measuring one, so that two builds plan alike. Prints one JSON line: fits (bool), why not, parameters, tokens a step, the time of every step
(wall clock, and the process's CPU time over all its threads), tokens a second over the steps
after the first two (median), peak memory (and, but for fit,
the peak of the last step's forward and backward), the device's memory,
the process's resident host memory before fit (or the optimizer) and after the steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe_runs import resident_bytes  # noqa: E402

CONFIGS = ("torch", "torch+checkpoint", "torch+expandable", "stowage", "stowage+offload", "stowage+plan",
           "stowage+plan+optimizer")
LOSS_CHUNKS = 8


def choose_allocator(config: str, device: str, capacity: str) -> None:
    """Before torch touches the device: stowage's CPU mode, or on a GPU the allocator named."""
    if device == "cpu":
        import stowage

        stowage.enable(device="cpu", capacity=capacity)
        return
    if config == "torch+expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if not config.startswith("torch"):
        import stowage

        stowage.enable()


def reset_peak(device: str) -> None:
    import torch

    import stowage

    if device == "cpu" or stowage.is_enabled():
        stowage.reset_peak_stats(device)
    else:
        torch.cuda.reset_peak_memory_stats()


def peak_allocated(device: str) -> int:
    import torch

    import stowage

    if device == "cpu" or stowage.is_enabled():
        return int(stowage.max_memory_allocated(device))
    return int(torch.cuda.max_memory_allocated())


def step_function(config: str, model: Any, tokens: Any, device: str, backward_peaks: list[int],
                  cost: dict[str, float] | None = None) -> Callable[[], float]:
    import torch

    import stowage

    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else torch.autocast("cpu", enabled=False)
    checkpoint = config == "torch+checkpoint"

    def loss_fn(m: Any, batch: Any) -> Any:
        with autocast:
            return m.chunked_loss(batch, chunks=LOSS_CHUNKS, checkpoint_blocks=checkpoint)

    if config.startswith("stowage+plan"):
        fitted = stowage.fit(model, lambda params: torch.optim.AdamW(params, lr=1e-4), tokens, loss_fn=loss_fn,
                             verbose=bool(os.environ.get("FIT_VERBOSE")), offload_optimizer=config.endswith("optimizer"),
                             cost=cost)
        return lambda: float(fitted.step(tokens))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> float:
        reset_peak(device)  # forward and backward's own peak: what grows with the batch
        if config == "stowage+offload":
            with stowage.offload.activations():
                loss = loss_fn(model, tokens)
                loss.backward()
        else:
            loss = loss_fn(model, tokens)
            loss.backward()
        backward_peaks.append(peak_allocated(device))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def peak_bytes(device: str) -> int:
    import torch

    import stowage

    if device == "cpu" or stowage.is_enabled():
        return int(stowage.max_memory_reserved())
    return int(torch.cuda.max_memory_reserved())


def device_total_bytes(device: str) -> int:
    import torch

    import stowage

    if device == "cpu":
        return int(stowage._torch.capacity(-1))
    return int(torch.cuda.mem_get_info()[1])


def probe(args: argparse.Namespace) -> dict[str, Any]:
    choose_allocator(args.config, args.device, args.capacity)
    import torch

    from stowage.models.llama import Llama, LlamaShape

    shape = LlamaShape(args.hidden, args.layers, args.heads, args.kv_heads, args.vocab, max_sequence=args.seq)
    result: dict[str, Any] = {"config": args.config, "layers": args.layers, "batch": args.batch, "seq": args.seq,
                              "tokens_per_step": args.batch * args.seq, "fits": False}
    times: list[float] = []
    cpu_times: list[float] = []  # the process's CPU time a step, every thread's: what a busy host inflates least
    try:
        torch.manual_seed(0)
        model = Llama(shape, device=args.device)
        result["parameters"] = sum(p.numel() for p in model.parameters())
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq), device=args.device)
        result["host_rss_before_bytes"] = resident_bytes()
        backward_peaks: list[int] = []
        step = step_function(args.config, model, tokens, args.device, backward_peaks,
                             json.loads(args.cost) if args.cost else None)
        for _ in range(args.steps):
            start, start_cpu = time.perf_counter(), time.process_time()
            step()
            if args.device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - start_cpu)
        result["fits"] = True
    except torch.OutOfMemoryError as error:
        result["why"] = str(error).splitlines()[0][:300]
    result["step_s"] = times
    result["step_cpu_s"] = cpu_times
    steady = times[2:] or times
    if result["fits"] and steady:
        result["tokens_per_s"] = args.batch * args.seq / statistics.median(steady)
    result["peak_reserved_bytes"] = peak_bytes(args.device)
    if backward_peaks:  # the last step's, the optimizer's states in place
        result["backward_peak_bytes"] = backward_peaks[-1]
    result["device_total_bytes"] = device_total_bytes(args.device)
    result["host_rss_bytes"] = resident_bytes()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=CONFIGS, required=True)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--capacity", default="160MiB", help="CPU mode's simulated device")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--cost", help="fit's cost model as JSON (default: fit measures it)")
    args = parser.parse_args()
    if args.config == "torch+expandable" and args.device == "cpu":
        parser.error("torch+expandable is torch's CUDA allocator's option: GPU only")
    print(json.dumps(probe(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
