"""A variable-length Llama training loop: every step's time under torch's allocator, stowage's
default and stowage's segment path, in fresh processes, interleaved.

    python3 bench/e2e/llama_cycle_step.py --compare [--rounds 2 --cycles 6 --json OUT]
    python3 bench/e2e/llama_cycle_step.py --allocator native|stowage [--conf K:V,...] [--json OUT]
    python3 bench/e2e/llama_cycle_step.py --compare --device cpu --tiny   # a smoke run, CPU mode

The model is stowage.models.llama at TinyLlama-1.1B's shapes (hidden 2048, 22 layers, 32 query
and 4 key/value heads, SwiGLU 5632, vocabulary 32,000), random weights made on the device, AdamW,
bf16 autocast, batch 4, the sequence cycling 2048, 1024, 1536, 512. Each step (forward, loss,
backward, AdamW, zero_grad) is timed between synchronisations. Rounds interleave the allocators
(native, stowage, stowage with virtual_memory:off, then again) so that drift of the machine falls
on all of them. Reported per shape: every step's time after the warm-up cycles, the median, the
ratio of each allocator's median to native's, the worst single step against native's median of
the same shape, the peak reserved, and the device calls made after warm-up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gpt2_step import counters  # noqa: E402
from run_context import install_allocator, machine_info, spawn  # noqa: E402

RUNS = (("native", ""), ("stowage", ""), ("stowage", "virtual_memory:off"))
GiB = float(1 << 30)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--allocator", choices=("native", "stowage"), default="stowage")
    parser.add_argument("--conf", default="")
    parser.add_argument("--compare", action="store_true")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a small model and short sequences (smoke runs)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cycles", type=int, default=6)
    parser.add_argument("--warmup-cycles", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--lengths", default="2048,1024,1536,512")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.tiny and args.lengths == "2048,1024,1536,512":
        args.lengths = "128,64,96,32"
    return args


def shape(args: argparse.Namespace) -> Any:
    from stowage.models.llama import LlamaShape

    if args.tiny:
        return LlamaShape(hidden=256, layers=2, heads=8, kv_heads=2, vocab=4096, max_sequence=512)
    return LlamaShape(hidden=2048, layers=22, heads=32, kv_heads=4, vocab=32000, intermediate=5632)


def set_up(args: argparse.Namespace) -> dict[str, Any]:
    """Chooses the allocator before anything allocates; returns the machine record."""
    import platform

    if args.device == "cuda":
        install_allocator(args.allocator, args.conf)
        return machine_info()
    if args.allocator == "stowage":
        import stowage

        stowage.enable(args.conf or None, device="cpu", capacity="16GiB")
    return {"device": "cpu", "python": platform.python_version()}


def stats(args: argparse.Namespace) -> tuple[int, int, int]:
    """(device calls so far, peak reserved, peak allocated) of the allocator in use."""
    import torch

    if args.allocator == "stowage":
        import stowage

        s = stowage.memory_stats()
        calls = int(s.get("num_maps", 0) + s.get("num_unmaps", 0) + s.get("num_device_alloc", 0)
                    + s.get("num_device_free", 0))
        return calls, stowage.max_memory_reserved(), stowage.max_memory_allocated()
    if args.device == "cpu":
        return 0, 0, 0
    c = counters("native")
    return (c.get("num_device_alloc", 0) + c.get("num_device_free", 0), torch.cuda.max_memory_reserved(),
            torch.cuda.max_memory_allocated())


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One allocator's loop in this process."""
    machine = set_up(args)
    import torch
    from stowage.models.llama import Llama

    lengths = [int(n) for n in args.lengths.split(",")]
    torch.manual_seed(0)
    model = Llama(shape(args), device=args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    batches = {n: torch.randint(0, model.shape.vocab, (args.batch, n), generator=generator).to(args.device)
               for n in set(lengths)}
    synchronize = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    steps: list[dict[str, Any]] = []
    for index in range(args.cycles * len(lengths)):
        length = lengths[index % len(lengths)]
        calls_before = stats(args)[0]
        synchronize()
        start = time.perf_counter()
        with torch.autocast(args.device, dtype=dtype, enabled=args.device == "cuda"):
            loss = model(batches[length])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize()
        elapsed = time.perf_counter() - start
        steps.append({"length": length, "ms": elapsed * 1e3, "device_calls": stats(args)[0] - calls_before,
                      "warm": index >= args.warmup_cycles * len(lengths)})
    _, reserved, allocated = stats(args)
    return {"allocator": args.allocator, "conf": args.conf, "machine": machine, "steps": steps,
            "max_reserved": reserved, "max_allocated": allocated, "loss": float(loss.item())}


def label(allocator: str, conf: str) -> str:
    return allocator if not conf else f"{allocator} ({conf})"


def summarise(runs: dict[str, list[dict[str, Any]]], lengths: list[int]) -> list[str]:
    """Per shape medians and worst steps against native's median, per allocator."""
    def warm(name: str, length: int) -> list[float]:
        return [s["ms"] for r in runs.get(name, []) if "steps" in r for s in r["steps"] if s["warm"] and s["length"] == length]

    lines = []
    native = {n: statistics.median(warm("native", n)) for n in lengths if warm("native", n)}
    for name, results in runs.items():
        ok = [r for r in results if "steps" in r]
        if not ok:
            lines.append(f"{name}: FAILED {results[0].get('error')}")
            continue
        calls = sum(s["device_calls"] for r in ok for s in r["steps"] if s["warm"])
        reserved = max(r["max_reserved"] for r in ok) / GiB
        lines.append(f"{name}: peak reserved {reserved:.2f} GiB, device calls after warm-up {calls}")
        for n in lengths:
            times = warm(name, n)
            if not times:
                continue
            median, worst = statistics.median(times), max(times)
            base = native.get(n, float("nan"))
            lines.append(f"  seq {n:5d}: median {median:8.2f} ms ({median / base:.3f}x native), worst "
                         f"{worst:8.2f} ms ({worst / base:.3f}x), steps " + " ".join(f"{t:.1f}" for t in times))
    return lines


def compare(args: argparse.Namespace) -> int:
    forwarded = ["--device", args.device, "--cycles", str(args.cycles), "--warmup-cycles", str(args.warmup_cycles),
                 "--batch", str(args.batch), "--lengths", args.lengths] + (["--tiny"] if args.tiny else [])
    runs: dict[str, list[dict[str, Any]]] = {label(a, c): [] for a, c in RUNS}
    for _ in range(args.rounds):
        for allocator, conf in RUNS:
            runs[label(allocator, conf)].append(spawn(Path(__file__).resolve(), allocator, forwarded, conf))
    lines = summarise(runs, [int(n) for n in args.lengths.split(",")])
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps({"benchmark": "llama_cycle_step", "runs": runs, "summary": lines},
                                        indent=2) + "\n")
    return 0 if all("steps" in r for results in runs.values() for r in results) else 1


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.compare:
        return compare(args)
    result = run(args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    lengths = list(dict.fromkeys(step["length"] for step in result["steps"]))
    print("\n".join(summarise({label(args.allocator, args.conf): [result]}, lengths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
