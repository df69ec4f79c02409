"""GPT-2 small training step time and memory: PyTorch's native CUDA allocator against stowage.

    python3 bench/e2e/gpt2_step.py --allocator native  [--steps 30 --warmup 5 --batch 8 --seq 1024]
    python3 bench/e2e/gpt2_step.py --allocator stowage [--conf KEY:VALUE,...] [--json OUT]
    python3 bench/e2e/gpt2_step.py --compare [--varlen] [--json OUT]

One allocator per process (the choice is made before CUDA starts): --compare runs this script
once per allocator, native first, and prints them side by side; its JSON holds both runs.
Each step is forward (bf16 autocast), loss, backward, AdamW step, zero_grad(set_to_none=True),
timed with torch.cuda.synchronize() on both sides. --varlen cycles the sequence length through
seq x [1, 3/4, 7/8, 1/2] ([1024, 768, 896, 512] at --seq 1024), which fragments a caching
allocator's memory. Reported: median, p10 and p90 step time over the measured steps, tokens/s,
max_memory_reserved and max_memory_allocated over the whole run (warm-up included), and the
allocator's device calls (cudaMalloc/cudaFree for native; page maps/unmaps for stowage), in total
and during the measured steps.
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

from run_context import install_allocator, machine_info, percentile, spawn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

ALLOCATORS = ("native", "stowage")
VARLEN_FRACTIONS = (1.0, 0.75, 0.875, 0.5)
COUNTER_KEYS = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free", "num_maps",
                "num_unmaps", "mapped_pages.current", "segment.all.current")
GiB = float(1 << 30)


def counters(allocator: str) -> dict[str, int]:
    """The allocator's counters of device calls, retries and OOMs, where it has them."""
    import torch

    if allocator == "stowage":
        import stowage

        stats: dict[str, Any] = dict(stowage.memory_stats())
    else:
        stats = dict(torch.cuda.memory_stats())
    return {key: int(stats[key]) for key in COUNTER_KEYS if key in stats}


def sequence_lengths(seq: int, varlen: bool) -> list[int]:
    if not varlen:
        return [seq]
    return [max(8, int(seq * fraction) // 8 * 8) for fraction in VARLEN_FRACTIONS]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Runs the benchmark in this process with ``args.allocator``; returns its results."""
    install_allocator(args.allocator, args.conf)
    import torch

    from gpt2_model import GPT, GPTConfig, make_optimizer, random_batch, training_step

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    lengths = sequence_lengths(args.seq, args.varlen)
    config = GPTConfig(n_layer=args.layers, block_size=max(1024, max(lengths)))
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[args.dtype]
    result: dict[str, Any] = {
        "allocator": args.allocator,
        "conf": args.conf if args.allocator == "stowage" else os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "machine": machine_info(),
        "config": {"batch": args.batch, "seq": args.seq, "lengths": lengths, "steps": args.steps,
                   "warmup": args.warmup, "layers": args.layers, "dtype": args.dtype, "fused_adamw": args.fused},
    }
    torch.manual_seed(0)
    model = GPT(config).to("cuda")
    optimizer = make_optimizer(model, fused=args.fused or None)
    generator = torch.Generator().manual_seed(0)
    batches = {length: random_batch(args.batch, length, config.vocab_size, "cuda", generator)
               for length in sorted(set(lengths))}
    result["parameters"] = model.num_parameters()

    times: list[float] = []
    tokens = 0
    warm_counters = counters(args.allocator)
    loss = None
    try:
        for step in range(args.warmup + args.steps):
            length = lengths[step % len(lengths)]
            inputs, targets = batches[length]
            torch.cuda.synchronize()
            start = time.perf_counter()
            loss = training_step(model, optimizer, inputs, targets, dtype)
            torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            if step == args.warmup - 1:
                warm_counters = counters(args.allocator)
            if step >= args.warmup:
                times.append(elapsed)
                tokens += args.batch * length
        result["error"] = None
    except torch.OutOfMemoryError as error:
        result["error"] = f"OutOfMemoryError: {error}"
    end_counters = counters(args.allocator)

    milliseconds = [t * 1e3 for t in times]
    result["step_ms"] = {
        "median": statistics.median(milliseconds) if milliseconds else float("nan"),
        "p10": percentile(milliseconds, 10),
        "p90": percentile(milliseconds, 90),
        "mean": statistics.fmean(milliseconds) if milliseconds else float("nan"),
        "min": min(milliseconds, default=float("nan")),
        "max": max(milliseconds, default=float("nan")),
    }
    result["times_ms"] = [round(t, 4) for t in milliseconds]
    result["tokens_per_s"] = tokens / sum(times) if times else float("nan")
    result["final_loss"] = float(loss.item()) if loss is not None else float("nan")
    result["memory"] = {
        "max_reserved": torch.cuda.max_memory_reserved(),
        "max_allocated": torch.cuda.max_memory_allocated(),
        "reserved_end": torch.cuda.memory_reserved(),
        "allocated_end": torch.cuda.memory_allocated(),
    }
    result["counters"] = end_counters
    result["counters_measured_steps"] = {key: end_counters[key] - warm_counters.get(key, 0)
                                         for key in end_counters if not key.endswith(".current")}
    return result


def print_run(result: dict[str, Any]) -> None:
    step, memory = result["step_ms"], result["memory"]
    print(f"{result['allocator']}: median {step['median']:.2f} ms  p10 {step['p10']:.2f}  p90 {step['p90']:.2f}  "
          f"{result['tokens_per_s']:,.0f} tokens/s  max reserved {memory['max_reserved'] / GiB:.2f} GiB  "
          f"max allocated {memory['max_allocated'] / GiB:.2f} GiB  loss {result['final_loss']:.3f}")
    print(f"  counters {result['counters']}  during measured steps {result['counters_measured_steps']}")
    if result.get("error"):
        print(f"  ERROR {result['error']}")


def child_arguments(args: argparse.Namespace) -> list[str]:
    """The options a --compare run passes on to each per-allocator run."""
    forwarded = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--batch", str(args.batch),
                 "--seq", str(args.seq), "--layers", str(args.layers), "--dtype", args.dtype]
    if args.varlen:
        forwarded.append("--varlen")
    if args.fused:
        forwarded.append("--fused")
    return forwarded


def compare_table(rows: list[tuple[str, str, str, str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for index, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[0]) if i == 0 else cell.rjust(widths[i])
                               for i, cell in enumerate(row)))
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


def ratio(a: float, b: float) -> str:
    return f"{b / a:.3f}x" if a and a == a and b == b else "-"


def compare(args: argparse.Namespace) -> int:
    forwarded = child_arguments(args)
    results = {name: spawn(Path(__file__).resolve(), name, forwarded, args.conf) for name in ALLOCATORS}
    native, ours = results["native"], results["stowage"]
    failed = [name for name, r in results.items() if "step_ms" not in r or r.get("error")]
    machine = ours.get("machine") or native.get("machine") or {}
    print(f"\nGPT-2 ({args.layers} layers) training step, batch {args.batch}, seq "
          f"{sequence_lengths(args.seq, args.varlen)}, {args.dtype}, {args.steps} steps after {args.warmup} warm-up")
    print(f"{machine.get('gpu')}  torch {machine.get('torch')}  CUDA {machine.get('cuda')}  "
          f"stowage {machine.get('stowage')}  commit {machine.get('commit')}  {machine.get('date')}\n")
    rows: list[tuple[str, str, str, str]] = [("", "native", "stowage", "stowage/native")]

    def add(label: str, getter: Any, fmt: str) -> None:
        try:
            a, b = getter(native), getter(ours)
        except (KeyError, TypeError):
            rows.append((label, "-", "-", "-"))
            return
        rows.append((label, format(a, fmt), format(b, fmt), ratio(a, b)))

    add("median step (ms)", lambda r: r["step_ms"]["median"], ".2f")
    add("p10 step (ms)", lambda r: r["step_ms"]["p10"], ".2f")
    add("p90 step (ms)", lambda r: r["step_ms"]["p90"], ".2f")
    add("tokens/s", lambda r: r["tokens_per_s"], ",.0f")
    add("max reserved (GiB)", lambda r: r["memory"]["max_reserved"] / GiB, ".3f")
    add("max allocated (GiB)", lambda r: r["memory"]["max_allocated"] / GiB, ".3f")
    add("reserved / allocated", lambda r: r["memory"]["max_reserved"] / r["memory"]["max_allocated"], ".3f")
    add("final loss", lambda r: r["final_loss"], ".4f")
    rows.append(("device calls, whole run",
                 f"{native.get('counters', {}).get('num_device_alloc', '-')} malloc / "
                 f"{native.get('counters', {}).get('num_device_free', '-')} free",
                 f"{ours.get('counters', {}).get('num_maps', '-')} map / "
                 f"{ours.get('counters', {}).get('num_unmaps', '-')} unmap", ""))
    rows.append(("device calls, measured steps",
                 f"{native.get('counters_measured_steps', {}).get('num_device_alloc', '-')} malloc / "
                 f"{native.get('counters_measured_steps', {}).get('num_device_free', '-')} free",
                 f"{ours.get('counters_measured_steps', {}).get('num_maps', '-')} map / "
                 f"{ours.get('counters_measured_steps', {}).get('num_unmaps', '-')} unmap", ""))
    print(compare_table(rows))
    for name in failed:
        print(f"\n{name} FAILED: {results[name].get('error')}")
    if args.json:
        Path(args.json).write_text(json.dumps({"benchmark": "gpt2_step", "machine": machine, "runs": results},
                                              indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 1 if failed else 0


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--allocator", choices=ALLOCATORS, help="run this allocator in this process")
    which.add_argument("--compare", action="store_true", help="run both, one process each, and compare")
    parser.add_argument("--steps", type=int, default=30, help="measured steps (default 30)")
    parser.add_argument("--warmup", type=int, default=5, help="unmeasured steps first (default 5)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024, help="sequence length (the longest with --varlen)")
    parser.add_argument("--varlen", action="store_true", help="cycle the length through seq x 1, 3/4, 7/8, 1/2")
    parser.add_argument("--layers", type=int, default=12, help="transformer layers (default 12: GPT-2 small)")
    parser.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16", help="autocast dtype")
    parser.add_argument("--fused", action="store_true", help="fused AdamW")
    parser.add_argument("--conf", default="", help="stowage's allocator configuration (key:value,...)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be at least 1 and --warmup at least 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    if args.compare:
        return compare(args)
    result = run(args)
    print_run(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 1 if result.get("error") else 0


if __name__ == "__main__":
    sys.exit(main())
