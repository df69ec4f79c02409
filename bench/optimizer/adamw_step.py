"""The offloaded optimizer in a training step: step time, the GPU's idle time caused by the
optimizer, how much of the host update backward hides, and the largest model that trains.

    python3 bench/optimizer/adamw_step.py --compare [--layers 16 --hidden 2048 --batch 16] [--rounds 3] [--json OUT]
    python3 bench/optimizer/adamw_step.py --find-largest --mode stowage [--json OUT]
    python3 bench/optimizer/adamw_step.py --mode stowage       # one run, this process

Modes, one per fresh process:
  device            torch.optim.AdamW(fused=True), states on the device
  stowage           stowage.offload.AdamW (exact: the update runs in step())
  stowage_in_backward  stowage.offload.AdamW(update="in_backward") (exact: each bucket updated as
                    its gradients arrive in backward)
  stowage_delayed   stowage.offload.AdamW(update="delayed") (ZeRO-Offload's DPU: one step late)
  stowage_overlapped  stowage.offload.AdamW(overlap=True) (exact: step() returns with the host part
                    running; the next forward waits for each block's parameters; the loop zeroes
                    gradients through the model, so that nothing but the forward waits)
  torchao           torchao.optim.CPUOffloadOptimizer over torch's fused AdamW (when installed)

The model is stowage.models.llama's Llama-style decoder, parameters made on the device (fp32 with
bf16 autocast for the device-only optimizer, torch's mixed precision; bf16 for the offloaded ones,
whose fp32 masters live on the host), every block checkpointed, the loss over logits made a chunk at a time, random tokens. On a GPU the
optimizer's GPU idle time is the compute stream's time from the end of backward to the end of
step() (CUDA events; step() makes that stream wait for the parameters written back); the host
update's time is the update worker's busy time; the share hidden is 1 - idle / update.

Hiding the update needs a backward as long as it: about 4·N·T FLOP on the GPU against 28·N bytes
through host memory, so T >= 7·F/B tokens a step (F the GPU's achieved FLOP/s, B the host's
bandwidth). The benchmark measures F (a bf16 matmul) and B (an in-place host stream) and prints
that bound beside the batch's tokens. On a machine without a GPU it runs in CPU mode at the size
given (a smoke test; the figures then describe nothing).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "e2e"))

MODES = ("device", "stowage", "stowage_in_backward", "stowage_delayed", "stowage_overlapped", "torchao")
HYPER = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=MODES, default="stowage")
    parser.add_argument("--compare", action="store_true", help="every mode, each in a fresh process")
    parser.add_argument("--modes", type=str, default=",".join(MODES), help="--compare's modes, comma-separated")
    parser.add_argument("--rounds", type=int, default=1,
                        help="--compare's rounds: every mode once a round, in turn (interleaved); medians over rounds")
    parser.add_argument("--find-largest", action="store_true", help="the most layers --mode trains")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--bucket-numel", type=int, default=None,
                        help="the offloaded optimizers' bucket_numel (default: theirs); one bucket larger than the "
                             "model makes in_backward's update start when backward ends, as exact's")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", type=str, default=None)
    return parser.parse_args()


def cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def make_optimizer(mode: str, params: list[Any], bucket_numel: int | None = None) -> Any:
    import torch

    import stowage

    if mode == "device":
        return torch.optim.AdamW(params, fused=True, **HYPER)
    buckets = {} if bucket_numel is None else {"bucket_numel": bucket_numel}
    if mode == "stowage":
        return stowage.offload.AdamW(params, master_weights=True, **buckets, **HYPER)
    if mode == "stowage_in_backward":
        return stowage.offload.AdamW(params, update="in_backward", master_weights=True, **buckets, **HYPER)
    if mode == "stowage_delayed":
        return stowage.offload.AdamW(params, update="delayed", master_weights=True, **buckets, **HYPER)
    if mode == "stowage_overlapped":
        return stowage.offload.AdamW(params, overlap=True, master_weights=True, **buckets, **HYPER)
    if not cuda():
        raise SystemExit("torchao's CPUOffloadOptimizer offloads from a GPU: skipped in CPU mode")
    from torchao.optim import CPUOffloadOptimizer

    return CPUOffloadOptimizer(params, torch.optim.AdamW, fused=True, **HYPER)


def build(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    import torch

    import stowage
    from stowage.models.llama import Llama, LlamaShape

    if cuda():
        stowage.enable(device="cuda")
        device = torch.device("cuda")
    else:
        stowage.enable(device="cpu", capacity="16GiB")
        device = torch.device("cpu")
    torch.manual_seed(0)
    shape = LlamaShape(hidden=args.hidden, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads,
                       vocab=args.vocab, max_sequence=args.seq)
    # Device-only: fp32 parameters and bf16 autocast, torch's mixed precision (16 B a parameter
    # on the device with AdamW). Offloaded: bf16 parameters on the device, fp32 masters on the host.
    dtype = torch.float32 if args.mode == "device" else torch.bfloat16
    with torch.device(device):
        torch.set_default_dtype(dtype)
        model = Llama(shape, device).to(dtype)  # parameters made in `dtype`; this casts the rotary tables
        torch.set_default_dtype(torch.float32)
    optimizer = make_optimizer(args.mode, list(model.parameters()), args.bucket_numel)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq), device=device,
                           generator=torch.Generator(device).manual_seed(0))
    return model, optimizer, tokens


class StepClock:
    """Times one step's parts: on a GPU with events on the compute stream, else with the wall clock."""

    def __init__(self) -> None:
        self.marks: list[Any] = []

    def mark(self) -> None:
        import torch

        if cuda():
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def spans_ms(self) -> list[float]:
        import torch

        if cuda():
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [(b - a) * 1e3 for a, b in zip(self.marks, self.marks[1:])]


def autocast() -> Any:
    import contextlib

    import torch

    return torch.autocast("cuda", dtype=torch.bfloat16) if cuda() else contextlib.nullcontext()


def update_seconds(optimizer: Any, key: str = "update_seconds") -> float | None:
    stats = getattr(optimizer, "host_stats", None)
    return None if stats is None else float(stats()[key])


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    import stowage

    model, optimizer, tokens = build(args)
    # overlap=True: host_stats() would finish the pending step; its host update time is the total
    # over the run's steps, read at the end.
    overlapped = args.mode == "stowage_overlapped"
    steps: list[dict[str, float | None]] = []
    for index in range(args.warmup + args.steps):
        if overlapped and index == args.warmup:
            total_before = update_seconds(optimizer)
        before = None if overlapped else update_seconds(optimizer)
        watched = None if overlapped else update_seconds(optimizer, "content_watch_seconds")
        clock = StepClock()
        wall = time.perf_counter()
        clock.mark()
        with autocast():
            loss = model.chunked_loss(tokens, checkpoint_blocks=True)
        loss.backward()
        clock.mark()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        clock.mark()
        forward_backward, idle = clock.spans_ms()
        wall_ms = (time.perf_counter() - wall) * 1e3
        after = None if overlapped else update_seconds(optimizer)
        update = None if before is None or after is None else (after - before) * 1e3
        # The writes-through-.data and replaced-gradient checks (content checksums on the device).
        watch = None if watched is None else (update_seconds(optimizer, "content_watch_seconds") - watched) * 1e3
        if index >= args.warmup:
            steps.append({"step_ms": wall_ms, "forward_backward_ms": forward_backward,
                          "optimizer_idle_ms": idle, "host_update_ms": update,
                          "hidden_share": None if not update else max(0.0, 1 - idle / update),
                          "content_watch_ms": watch,
                          "content_watch_share": None if watch is None else watch / wall_ms})
    if overlapped:  # (finishes the last step)
        per_step = (update_seconds(optimizer) - total_before) * 1e3 / args.steps
        for s in steps:
            s["host_update_ms"] = per_step
    tokens_per_step = args.batch * args.seq
    walls = [s["step_ms"] for s in steps]
    return {
        "mode": args.mode, "device": "cuda" if cuda() else "cpu-mode",
        "parameters": sum(p.numel() for p in model.parameters()),
        "layers": args.layers, "hidden": args.hidden, "batch": args.batch, "seq": args.seq,
        "tokens_per_step": tokens_per_step, "steps": steps,
        "median_step_ms": statistics.median(walls), "max_step_ms": max(walls),
        "median_forward_backward_ms": statistics.median(s["forward_backward_ms"] for s in steps),
        "median_host_update_ms": (None if steps[0]["host_update_ms"] is None
                                  else statistics.median(s["host_update_ms"] for s in steps)),
        "tokens_per_s": tokens_per_step * len(walls) / (sum(walls) / 1e3),
        "peak_allocated": int(stowage.max_memory_allocated(None if cuda() else "cpu")),
        "host_bytes": (optimizer.host_stats()["allocated_bytes"] if hasattr(optimizer, "host_stats") else None),
        "torch": torch.__version__,
    }


def hiding_bound(args: argparse.Namespace) -> dict[str, float]:
    """F (bf16 matmul FLOP/s on the GPU), B (host in-place stream bytes/s) and T = 7·F/B."""
    import torch

    host = torch.ones(1 << 28)  # 1 GiB
    start = time.perf_counter()
    for _ in range(3):
        host.mul_(1.0001)
    bandwidth = 3 * 2 * host.numel() * 4 / (time.perf_counter() - start)
    if not cuda():
        return {"host_bytes_per_s": bandwidth}
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    a @ a
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    flops = 10 * 2 * 8192 ** 3 / (time.perf_counter() - start)
    return {"gpu_flop_per_s": flops, "host_bytes_per_s": bandwidth, "tokens_bound": 7 * flops / bandwidth}


def spawn(args: argparse.Namespace, mode: str, layers: int | None = None) -> dict[str, Any]:
    """One mode in a fresh process; {"error": ...} when it ran out of memory or failed."""
    forwarded = [a for a in sys.argv[1:] if a not in ("--compare", "--find-largest")]
    command = [sys.executable, __file__, *forwarded, "--mode", mode, "--json", "-"]
    if layers is not None:
        command += ["--layers", str(layers), "--steps", "2", "--warmup", "1"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"mode": mode, "layers": layers, "error": " | ".join(tail)}
    return json.loads(done.stdout.strip().splitlines()[-1])


def find_largest(args: argparse.Namespace) -> dict[str, Any]:
    """Doubles the layer count until a step fails, then bisects: a few fresh-process probes."""
    probes: list[dict[str, Any]] = []
    good, bad = 0, None
    layers = max(1, args.layers)
    while bad is None or bad - good > 1:
        result = spawn(args, args.mode, layers)
        probes.append({"layers": layers, "ok": "error" not in result, "parameters": result.get("parameters"),
                       "error": result.get("error")})
        if "error" in result:
            bad = layers
        else:
            good = layers
        if bad is None:
            layers *= 2
        elif bad - good > 1:
            layers = (good + bad) // 2
        if len(probes) >= 10:
            break
    best = next((p for p in reversed(probes) if p["ok"] and p["layers"] == good), None)
    return {"mode": args.mode, "largest_layers": good, "largest_parameters": best and best["parameters"],
            "probes": probes}


def mode_lines(runs: list[dict[str, Any]]) -> str:
    lines = []
    for run in runs:
        if "error" in run:
            lines.append(f"{run['mode']:20} failed: {run['error']}")
            continue
        lines.append(f"{run['mode']:20} {run['parameters'] / 1e9:6.2f} B params  "
                     f"median {run['median_step_ms']:9.1f} ms  "
                     f"max {run['max_step_ms']:9.1f} ms  {run['tokens_per_s']:9.0f} tok/s  per step (step/idle ms): "
                     + " ".join(f"{s['step_ms']:.0f}/{s['optimizer_idle_ms']:.0f}" for s in run["steps"]))
    return "\n  " + "\n  ".join(lines)


def main() -> int:
    args = parse()
    if args.compare:
        modes = [m for m in args.modes.split(",") if m]
        unknown = sorted(set(modes) - set(MODES))
        if unknown:
            raise SystemExit(f"--modes: unknown {unknown}; the modes are {MODES}")
        rounds = [[spawn(args, mode) for mode in modes] for _ in range(max(1, args.rounds))]
        record: dict[str, Any] = {"bound": hiding_bound(args), "runs": rounds[0], "rounds": rounds}
        for index, runs in enumerate(rounds):
            print(f"round {index + 1}: {mode_lines(runs)}")
        print("medians over rounds (step ms, forward+backward ms, host update ms):")
        for mode in modes:
            done = [run for runs in rounds for run in runs if run["mode"] == mode and "error" not in run]
            if not done:
                continue
            update = [r["median_host_update_ms"] for r in done if r.get("median_host_update_ms") is not None]
            print(f"  {mode:20} {statistics.median(r['median_step_ms'] for r in done):9.1f} "
                  f"{statistics.median(r['median_forward_backward_ms'] for r in done):9.1f} "
                  f"{statistics.median(update) if update else float('nan'):9.1f}")
        print("bound:", {k: f"{v:.3g}" for k, v in record["bound"].items()}, "tokens/step:", args.batch * args.seq)
    elif args.find_largest:
        record = find_largest(args)
        print(json.dumps(record, indent=1))
    else:
        record = measure(args)
    if args.json == "-":
        print(json.dumps(record))
    elif args.json:
        Path(args.json).write_text(json.dumps(record, indent=1))
    elif not (args.compare or args.find_largest):
        print(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
