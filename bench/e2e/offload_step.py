"""Activation offload: step time and peak memory of a GPT-2 training step, with and without it.

    python3 bench/e2e/offload_step.py --device cpu  --compare [--link memcpy|gpu-ratio] [--json OUT]
    python3 bench/e2e/offload_step.py --device cuda --compare [--json OUT]          # GPT-2 medium
    python3 bench/e2e/offload_step.py --device cuda --compare --max-batch --cap-gib 14 [--json OUT]
    python3 bench/e2e/offload_step.py --device cpu --mode offload [--batch 8] [--json OUT]  # one run
    python3 bench/e2e/offload_step.py --device cpu --compare --modes checkpoint,checkpoint+offload \
        --bandwidth 200e6 [--repeat 3]      # block-boundary offload against checkpointing alone

Modes, one per fresh process (CPU mode's device and torch's CUDA allocator are per process):
  none                 no offload
  checkpoint           torch.utils.checkpoint around every block (non-reentrant)
  save_on_cpu          torch.autograd.graph.save_on_cpu(pin_memory=True) (GPU only: on CPU
                       tensors it copies nothing)
  offload              stowage.offload.activations() around forward: every saved activation
  checkpoint+offload   both: the checkpoints' inputs (the fp32 residual stream) are offloaded

The model is bench/e2e/gpt2_model.py's GPT-2 (GPT-2's shapes; pre-norm blocks, SDPA causal
attention, tied head), random weights and tokens, AdamW, bf16 autocast on the GPU (fp32 on the
CPU, where bf16 matmuls are slow). Each step is timed whole (forward, loss, backward, AdamW,
stowage.mark_step()), synchronised on the GPU; every step's time is reported, not only the median.
Peak memory is the allocator's peak allocated bytes over the measured steps. Each measured step's
reload counters are reported too: uses that waited for their copy back (stalls), how long they
waited (on the device on a GPU), copies back, and how many of those were prefetched; and the
prefetch window at the end (Note [Prefetch window]).

On the CPU the simulated device's link runs at memcpy speed (--link memcpy), or at the speed that
gives the link the share of a step it has for GPT-2 medium on an H100 (--link gpu-ratio). On the
H100 a byte over PCIe gen5 x16 costs as much time as 989 TFLOP/s / 55 GB/s, about 18,000 FLOP of
dense bf16; a model's FLOP per saved activation byte grows with its width, and the CPU saves fp32
(twice bf16's bytes), so the CPU link is its measured matmul rate / 18,000 x (1024 / CPU model
width) x 2. Copies that an H100 hides behind GPT-2 medium's compute are hidden here too, and ones
it cannot hide are not.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

MODES = ("none", "checkpoint", "save_on_cpu", "offload", "checkpoint+offload")
H100_FLOP_PER_LINK_BYTE = 989e12 / 55e9
FP32_OVER_BF16 = 2
MiB = float(1 << 20)
RELOAD_COUNTERS = ("num_stalls", "stall_ns", "num_reloads", "num_prefetched")


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--mode", choices=MODES, default="none")
    parser.add_argument("--compare", action="store_true", help="every mode, each in its own process")
    parser.add_argument("--modes", default=",".join(MODES), help="--compare's modes, comma-separated")
    parser.add_argument("--repeat", type=int, default=1, help="--compare's rounds, the modes interleaved")
    parser.add_argument("--max-batch", action="store_true", help="the largest batch of each mode under --cap-gib")
    parser.add_argument("--cap-gib", type=float, default=14.0)
    parser.add_argument("--link", choices=("memcpy", "gpu-ratio"), default="memcpy")
    parser.add_argument("--bandwidth", type=float, default=0.0, help="CPU mode's link, bytes/s (0: --link)")
    parser.add_argument("--batch", type=int, default=0, help="0: 8 on the GPU, 8 on the CPU")
    parser.add_argument("--seq", type=int, default=0, help="0: 1024 on the GPU, 256 on the CPU")
    parser.add_argument("--steps", type=int, default=0, help="0: 20 on the GPU, 6 on the CPU")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}: choose from {', '.join(MODES)}")
    gpu = args.device == "cuda"
    args.batch = args.batch or 8
    args.seq = args.seq or (1024 if gpu else 256)
    args.steps = args.steps or (20 if gpu else 6)
    return args


def model_config(args: argparse.Namespace) -> Any:
    from gpt2_model import GPTConfig

    if args.device == "cuda":  # GPT-2 medium: 24 layers, 1024 wide, 16 heads, 50,257 tokens
        return GPTConfig(n_layer=24, n_head=16, n_embd=1024, block_size=max(1024, args.seq))
    return GPTConfig(n_layer=6, n_head=8, n_embd=256, vocab_size=8192, block_size=args.seq)


def matmul_flops_per_second() -> float:
    """The CPU's fp32 matmul rate, measured now (for --link gpu-ratio)."""
    import torch

    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    a @ b
    start = time.perf_counter()
    for _ in range(8):
        a @ b
    return 8 * 2 * 1024**3 / (time.perf_counter() - start)


def set_up_device(args: argparse.Namespace) -> dict[str, Any]:
    """Makes stowage the allocator before anything allocates; returns what describes the link."""
    import stowage

    if args.device == "cuda":
        if not stowage.is_enabled():
            stowage.enable(device="cuda")
        return {}
    bandwidth = args.bandwidth
    if not bandwidth and args.link == "gpu-ratio":
        width_ratio = 1024 / model_config(args).n_embd  # GPT-2 medium's width over this model's
        bandwidth = matmul_flops_per_second() / H100_FLOP_PER_LINK_BYTE * width_ratio * FP32_OVER_BF16
    stowage.enable(device="cpu", capacity="64GiB", copy_bandwidth=int(bandwidth) if bandwidth else None)
    return {"link": args.link, "copy_bytes_per_second": bandwidth or None}


class Checkpointed:
    """Wraps a block's forward in torch.utils.checkpoint (non-reentrant)."""

    def __init__(self, block: Any) -> None:
        self.block = block

    def __call__(self, x: Any) -> Any:
        import torch

        return torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False)


def build(args: argparse.Namespace, batch: int) -> tuple[Any, Any, Any, Any]:
    import torch

    from gpt2_model import GPT, make_optimizer, random_batch

    torch.manual_seed(0)
    model = GPT(model_config(args)).to(args.device)
    if "checkpoint" in args.mode:
        for block in model.h:
            block.forward = Checkpointed(block.forward.__func__.__get__(block))  # type: ignore[method-assign]
    optimizer = make_optimizer(model)
    tokens, targets = random_batch(batch, args.seq, model.config.vocab_size, args.device,
                                   torch.Generator().manual_seed(0))
    return model, optimizer, tokens, targets


def region(mode: str) -> Any:
    import contextlib

    import torch

    import stowage

    if "offload" in mode:
        return stowage.offload.activations()
    if mode == "save_on_cpu":
        return torch.autograd.graph.save_on_cpu(pin_memory=True)
    return contextlib.nullcontext()


def one_step(args: argparse.Namespace, model: Any, optimizer: Any, tokens: Any, targets: Any) -> None:
    import contextlib

    import torch

    import stowage

    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if args.device == "cuda"
                else contextlib.nullcontext())
    with autocast, region(args.mode):
        loss = model(tokens, targets)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    stowage.mark_step()


def synchronize(args: argparse.Namespace) -> None:
    if args.device == "cuda":
        import torch

        torch.cuda.synchronize()


def peak_allocated(args: argparse.Namespace) -> int:
    import stowage

    return int(stowage.max_memory_allocated("cpu" if args.device == "cpu" else None))


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Runs --mode in this process; returns its per-step times, peak and offload statistics."""
    link = set_up_device(args)
    import stowage

    model, optimizer, tokens, targets = build(args, args.batch)
    times: list[float] = []
    reloads: list[dict[str, int]] = []
    device = args.device if args.device == "cpu" else None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            stowage.reset_peak_stats(device)
        synchronize(args)
        before = stowage.memory_stats(device)
        start = time.perf_counter()
        one_step(args, model, optimizer, tokens, targets)
        synchronize(args)
        if step >= args.warmup:
            times.append((time.perf_counter() - start) * 1e3)
            after = stowage.memory_stats(device)
            reloads.append({key: int(after.get(f"offload.{key}", 0) - before.get(f"offload.{key}", 0))
                            for key in RELOAD_COUNTERS})
    stats = stowage.memory_stats(device)
    return {
        "mode": args.mode, "device": args.device, "batch": args.batch, "seq": args.seq, **link,
        "parameters": model.num_parameters(),
        "step_ms": times,
        "step_reloads": reloads,
        "median_ms": statistics.median(times),
        "tokens_per_s": args.batch * args.seq * len(times) / (sum(times) / 1e3),
        "peak_allocated": peak_allocated(args),
        "offload": {key: value for key, value in stats.items() if key.startswith("offload.")},
        "machine": machine(args),
    }


def machine(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"cpus": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
                            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    if args.device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    try:
        info["commit"] = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"],
                                        capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        info["commit"] = "unknown"
    return info


def largest_batch(args: argparse.Namespace) -> dict[str, Any]:
    """The largest batch --mode trains at under --cap-gib (GPU), found by doubling then bisection,
    and its tokens/s over three steps."""
    set_up_device(args)
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_gib * (1 << 30) / total))

    def fits(batch: int) -> float | None:
        model = optimizer = tokens = targets = None
        try:
            model, optimizer, tokens, targets = build(args, batch)
            one_step(args, model, optimizer, tokens, targets)
            synchronize(args)
            start = time.perf_counter()
            for _ in range(3):
                one_step(args, model, optimizer, tokens, targets)
            synchronize(args)
            return batch * args.seq * 3 / (time.perf_counter() - start)
        except torch.OutOfMemoryError:
            return None
        finally:
            del model, optimizer, tokens, targets
            gc.collect()
            torch.cuda.empty_cache()

    low, rate = 0, None
    high = 1
    while (speed := fits(high)) is not None:
        low, rate, high = high, speed, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        speed = fits(middle)
        if speed is None:
            high = middle
        else:
            low, rate = middle, speed
    return {"mode": args.mode, "cap_gib": args.cap_gib, "seq": args.seq, "largest_batch": low,
            "tokens_per_s": rate, "machine": machine(args)}


def spawn(args: argparse.Namespace, mode: str, extra: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as directory:
        output = Path(directory) / "result.json"
        command = [sys.executable, str(Path(__file__).resolve()), "--device", args.device, "--mode", mode,
                   "--link", args.link, "--bandwidth", str(args.bandwidth), "--batch", str(args.batch),
                   "--seq", str(args.seq), "--steps", str(args.steps), "--warmup", str(args.warmup),
                   "--cap-gib", str(args.cap_gib), "--json", str(output), *extra]
        completed = subprocess.run(command, env={k: v for k, v in os.environ.items() if k != "STOWAGE_ALLOC_CONF"})
        if not output.exists():
            return {"mode": mode, "error": f"exit status {completed.returncode}"}
        return json.loads(output.read_text())


def print_compare(results: list[dict[str, Any]]) -> None:
    base = next((r for r in results if r.get("mode") in ("none", "checkpoint") and "median_ms" in r), None)
    against = f"vs {base['mode']}" if base else "vs -"
    print(f"{'mode':20} {'median ms':>10} {against:>14} {'peak MiB':>9} {against:>14} "
          f"{'offloaded MiB':>13} {'stalls':>6} {'stall ms':>9} {'prefetched':>10}  steps (ms)")
    for r in results:
        if "median_ms" not in r:
            print(f"{r['mode']:20} {r.get('error', 'failed')}")
            continue
        o = r["offload"]
        time_ratio = f"{r['median_ms'] / base['median_ms']:.3f}" if base else "-"
        peak_ratio = f"{r['peak_allocated'] / base['peak_allocated']:.3f}" if base else "-"
        steps = r.get("step_reloads", [])
        stalls = sum(s["num_stalls"] for s in steps)
        stall_ms = sum(s["stall_ns"] for s in steps) / 1e6
        prefetched = f"{sum(s['num_prefetched'] for s in steps)}/{sum(s['num_reloads'] for s in steps)}"
        print(f"{r['mode']:20} {r['median_ms']:10.1f} {time_ratio:>14} {r['peak_allocated'] / MiB:9.1f} "
              f"{peak_ratio:>14} {o.get('offload.bytes_offloaded', 0) / MiB:13.1f} {stalls:6} {stall_ms:9.1f} "
              f"{prefetched:>10}  {' '.join(f'{t:.0f}' for t in r['step_ms'])}")
        if stalls:
            per_step = " ".join(str(s["num_stalls"]) for s in steps)
            per_step_ms = " ".join(f"{s['stall_ns'] / 1e6:.1f}" for s in steps)
            print(f"{'':20} stalls a step: {per_step}; stall ms a step: {per_step_ms}; window now "
                  f"{o.get('offload.prefetch_window_bytes', 0) / MiB:.1f} MiB")


def main() -> int:
    args = parse()
    chosen = args.modes.split(",")
    modes = [m for m in MODES if m in chosen and not (m == "save_on_cpu" and args.device == "cpu")]
    if args.compare:
        extra = ["--max-batch"] if args.max_batch else []
        results = []
        for round_ in range(args.repeat):  # the modes interleaved, round after round
            if args.repeat > 1:
                print(f"round {round_ + 1} of {args.repeat}", flush=True)
            results += [spawn(args, mode, extra) for mode in modes]
            if args.max_batch:
                for r in results[-len(modes):]:
                    print(f"{r['mode']:20} largest batch {r.get('largest_batch')}  tokens/s {r.get('tokens_per_s')}")
            else:
                print_compare(results[-len(modes):])
    else:
        results = [largest_batch(args) if args.max_batch else measure(args)]
    if args.json:
        args.json.write_text(json.dumps(results if len(results) > 1 else results[0], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
