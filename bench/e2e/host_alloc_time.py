"""Host time of one `torch.empty(n, device="cuda")` + `del`, native allocator against stowage.

    python3 bench/e2e/host_alloc_time.py --allocator native|stowage [--conf KEY:VALUE,...] [--json OUT]
    python3 bench/e2e/host_alloc_time.py --compare [--json OUT]

For each size (512 B, 64 KiB, 1 MiB, 16 MiB, 256 MiB) the pair is first run --warmup times, so
the allocator's cache holds the block (no device call is timed), then timed in --repeats runs
of --iterations pairs each (perf_counter_ns around the whole run, the garbage collector off);
reported are the median, p10 and p90 of the per-pair times of the runs. This is what a PyTorch
program pays per tensor: Python and dispatcher overhead included. One allocator per process:
--compare runs this script once per allocator and prints them side by side; its JSON holds both.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from run_context import install_allocator, machine_info, percentile, spawn

HERE = Path(__file__).resolve().parent

ALLOCATORS = ("native", "stowage")
SIZES = (512, 64 << 10, 1 << 20, 16 << 20, 256 << 20)


def format_size(size: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def time_pairs(size: int, iterations: int) -> float:
    """Nanoseconds per torch.empty(size) + del, over ``iterations`` pairs."""
    import torch

    empty, device, dtype = torch.empty, torch.device("cuda"), torch.uint8
    start = time.perf_counter_ns()
    for _ in range(iterations):
        tensor = empty(size, dtype=dtype, device=device)
        del tensor
    return (time.perf_counter_ns() - start) / iterations


def time_loop(iterations: int) -> float:
    """Nanoseconds per iteration of the same loop with no allocation (the loop's own cost)."""
    start = time.perf_counter_ns()
    for _ in range(iterations):
        tensor = None
        del tensor
    return (time.perf_counter_ns() - start) / iterations


def run(args: argparse.Namespace) -> dict[str, Any]:
    install_allocator(args.allocator, args.conf)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device")
    torch.zeros(1, device="cuda")  # initialise CUDA outside the timings
    torch.cuda.synchronize()
    results = []
    gc.collect()
    gc.disable()
    try:
        loop = statistics.median(time_loop(args.iterations) for _ in range(args.repeats))
        for size in SIZES:
            time_pairs(size, args.warmup)
            device_calls_before = device_calls(args.allocator)
            runs = [time_pairs(size, args.iterations) for _ in range(args.repeats)]
            results.append({
                "size": size,
                "median_ns": statistics.median(runs),
                "p10_ns": percentile(runs, 10),
                "p90_ns": percentile(runs, 90),
                "min_ns": min(runs),
                "device_calls_during_timing": device_calls(args.allocator) - device_calls_before,
            })
    finally:
        gc.enable()
    return {
        "benchmark": "host_alloc_time",
        "allocator": args.allocator,
        "conf": args.conf if args.allocator == "stowage" else os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "machine": machine_info(),
        "iterations": args.iterations,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "loop_overhead_ns": loop,
        "results": results,
    }


def device_calls(allocator: str) -> int:
    """Device allocations so far (cudaMalloc for native, page maps for stowage), where counted."""
    import torch

    if allocator == "stowage":
        import stowage

        return int(stowage.memory_stats().get("num_maps", 0))
    return int(torch.cuda.memory_stats().get("num_device_alloc", 0))


def print_run(result: dict[str, Any]) -> None:
    print(f"{result['allocator']} ({result['machine']['gpu']}, torch {result['machine']['torch']}): "
          f"ns per torch.empty + del, median of {result['repeats']} x {result['iterations']}")
    for row in result["results"]:
        print(f"  {format_size(row['size']):>8}  median {row['median_ns']:9.0f}  p10 {row['p10_ns']:9.0f}  "
              f"p90 {row['p90_ns']:9.0f}  device calls {row['device_calls_during_timing']}")


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One allocator's processes as one result: per size, the median of the processes' medians
    (and of their p10 and p90), with every process's median kept."""
    combined = dict(runs[0])
    rows = []
    for index, row in enumerate(runs[0]["results"]):
        per_process = [run["results"][index] for run in runs]
        merged = dict(row)
        for key in ("median_ns", "p10_ns", "p90_ns"):
            merged[key] = statistics.median(r[key] for r in per_process)
        merged["process_medians_ns"] = [r["median_ns"] for r in per_process]
        merged["device_calls_during_timing"] = sum(r["device_calls_during_timing"] for r in per_process)
        rows.append(merged)
    combined["results"] = rows
    combined["loop_overhead_ns"] = statistics.median(run["loop_overhead_ns"] for run in runs)
    combined["processes"] = len(runs)
    return combined


def compare(args: argparse.Namespace) -> int:
    # Processes alternate (native, stowage, native, ...): a VM's per-process state moves whole
    # processes by a factor of two, so one process of each says little.
    spawned: dict[str, list[dict[str, Any]]] = {name: [] for name in ALLOCATORS}
    for _ in range(args.processes):
        for name in ALLOCATORS:
            forwarded = ["--iterations", str(args.iterations), "--repeats", str(args.repeats),
                         "--warmup", str(args.warmup)]
            spawned[name].append(spawn(Path(__file__).resolve(), name, forwarded, args.conf))
    failed = [name for name, runs in spawned.items() if any("results" not in run for run in runs)]
    for name in failed:
        print(f"{name} FAILED: {next(run.get('error') for run in spawned[name] if 'results' not in run)}")
    if failed:
        return 1
    results = {name: combine(runs) for name, runs in spawned.items()}
    native, ours = results["native"], results["stowage"]
    machine = ours["machine"]
    print(f"\nhost time per torch.empty(n, device='cuda') + del, ns: per process the median of "
          f"{args.repeats} runs of {args.iterations} (warm cache), then the median of "
          f"{args.processes} alternating processes per allocator")
    print(f"{machine['gpu']}  {machine['cpu']} x{machine['cpus']}  torch {machine['torch']}  CUDA {machine['cuda']}  "
          f"stowage {machine['stowage']}  commit {machine['commit']}  {machine['date']}\n")
    header = f"{'size':>8}  {'native':>9}  {'p10-p90':>15}  {'stowage':>9}  {'p10-p90':>15}  {'stowage/native':>14}"
    print(header)
    print("-" * len(header))
    for a, b in zip(native["results"], ours["results"]):
        print(f"{format_size(a['size']):>8}  {a['median_ns']:9.0f}  {a['p10_ns']:7.0f}-{a['p90_ns']:<7.0f}  "
              f"{b['median_ns']:9.0f}  {b['p10_ns']:7.0f}-{b['p90_ns']:<7.0f}  {b['median_ns'] / a['median_ns']:13.3f}x")
    print(f"\nloop overhead (no allocation): native {native['loop_overhead_ns']:.0f} ns, "
          f"stowage {ours['loop_overhead_ns']:.0f} ns")
    calls = {name: sum(row["device_calls_during_timing"] for row in result["results"])
             for name, result in results.items()}
    print(f"device calls during the timed runs: native {calls['native']}, stowage {calls['stowage']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"benchmark": "host_alloc_time", "machine": machine, "runs": results},
                                              indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--allocator", choices=ALLOCATORS, help="run this allocator in this process")
    which.add_argument("--compare", action="store_true", help="run both, one process each, and compare")
    parser.add_argument("--iterations", type=int, default=2000, help="pairs per timed run (default 2000)")
    parser.add_argument("--repeats", type=int, default=25, help="timed runs per size (default 25)")
    parser.add_argument("--warmup", type=int, default=200, help="untimed pairs per size first (default 200)")
    parser.add_argument("--processes", type=int, default=3,
                        help="with --compare: processes per allocator, alternating (default 3)")
    parser.add_argument("--conf", default="", help="stowage's allocator configuration (key:value,...)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if min(args.iterations, args.repeats, args.warmup, args.processes) < 1:
        parser.error("--iterations, --repeats, --warmup and --processes must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    if args.compare:
        return compare(args)
    result = run(args)
    print_run(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
