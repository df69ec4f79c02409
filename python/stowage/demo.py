"""``stowage demo``: a transformer that does not fit its device trains on it with ``stowage.fit``.

A Llama-style decoder (stowage.models.llama: random weights, random tokens) sized to the device
(its parameters about a fifth of the device, so torch's AdamW states and gradients leave too
little room for the step's activations) first trains as it is, with torch's AdamW, and runs out
of memory; then ``stowage.fit`` records its step, chooses where the optimizer states live and
plans the activations, and it trains, a progress bar showing each step's loss and peak memory.

Without a GPU the device is stowage's CPU mode, a simulated device of ``--capacity`` bytes (the
model about 5M parameters at the default 96 MiB, a few seconds a step on two cores); with a GPU,
the GPU itself, with stowage as torch's allocator. ``--snapshot`` writes the allocator's snapshot
of the fitted steps, which ``stowage inspect --html`` turns into a report.
"""

from __future__ import annotations

import argparse
import gc
import time
from dataclasses import dataclass
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import stowage
from stowage.serving import torch_module


def add_parser(commands: Any, name: str) -> None:
    parser = commands.add_parser(name, help="train a transformer that does not fit its device, with stowage.fit",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto (default): the GPU when there is one, else CPU mode")
    parser.add_argument("--capacity", default="96MiB", help="CPU mode's simulated device size (default 96MiB)")
    parser.add_argument("--steps", type=int, default=6, help="training steps with stowage.fit (default 6)")
    parser.add_argument("--snapshot", help="write the allocator's snapshot of the fitted steps here")


@dataclass(frozen=True)
class Workload:
    hidden: int
    heads: int
    kv_heads: int
    vocab: int
    seq: int
    layers: int = 0
    batch: int = 0


CPU_WORKLOAD = Workload(hidden=256, heads=4, kv_heads=2, vocab=4096, seq=256)
GPU_WORKLOAD = Workload(hidden=4096, heads=32, kv_heads=8, vocab=32000, seq=2048)
PARAMETER_SHARE = 0.21      # of the device, fp32 parameters: with gradients and AdamW, 84%
ACTIVATION_SHARE = 1.2      # of the device, the step's activations unplanned
ACTIVATION_FLOATS = 29      # per token, layer and hidden unit, this decoder's step unplanned


def sized(workload: Workload, capacity: int) -> Workload:
    """`workload` with layers and batch for a device of `capacity` bytes: parameters about
    PARAMETER_SHARE of it, the step's activations about ACTIVATION_SHARE."""
    from stowage.models.llama import LlamaShape  # here: it imports torch, which `stowage --help` must not

    h = workload.hidden
    mlp = LlamaShape(h, 1, workload.heads, workload.kv_heads, workload.vocab).mlp
    per_layer = 2 * h * h + 2 * h * (h * workload.kv_heads // workload.heads) + 3 * h * mlp + 2 * h
    embeddings = 2 * workload.vocab * h
    layers = max(2, round((PARAMETER_SHARE * capacity / 4 - embeddings) / per_layer))
    tokens = ACTIVATION_SHARE * capacity / (4 * ACTIVATION_FLOATS * h * layers)
    return Workload(**{**workload.__dict__, "layers": layers, "batch": max(3, round(tokens / workload.seq))})


def _train_as_it_is(model: Any, tokens: Any, loss_fn: Any) -> str:
    """One step with torch's AdamW and nothing else: what goes wrong, or that it fit."""
    import torch  # here: the stowage command imports this module, and must not import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    phase = "forward and backward"
    try:
        loss_fn(model, tokens).backward()
        phase = "the optimizer's step"
        optimizer.step()
        return "fits as it is (the device is larger than this demo needs)"
    except torch.OutOfMemoryError as error:
        return f"out of memory in {phase}: {str(error).splitlines()[0]}"
    finally:
        del optimizer
        model.zero_grad(set_to_none=True)
        gc.collect()


def _train_fitted(fitted: Any, tokens: Any, steps: int, snapshot: str | None) -> None:
    columns = (TextColumn("training"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns) as progress:
        task = progress.add_task("steps", total=steps)
        for step in range(steps):
            if snapshot and step == steps - 1:
                stowage.record_history(True)
            stowage.reset_peak_stats()
            start = time.perf_counter()
            loss = float(fitted.step(tokens))
            progress.console.print(f"step {step}: loss {loss:.3f}, {time.perf_counter() - start:.2f} s, peak "
                                   f"{stowage.format_bytes(stowage.max_memory_allocated())} allocated, "
                                   f"{stowage.format_bytes(stowage.max_memory_reserved())} reserved")
            progress.advance(task)
    if snapshot:
        stowage.dump_snapshot(snapshot)
        stowage.record_history(False)
        print(f"snapshot of the last step: {snapshot}")


def run(args: argparse.Namespace) -> int:
    import torch  # here, as the models: the stowage command imports this module, and must not import torch

    from stowage.models.llama import Llama, LlamaShape

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        stowage.enable(device="cpu", capacity=args.capacity)
    else:
        stowage.enable()
        torch.backends.cuda.matmul.allow_tf32 = True
    capacity = int(torch_module().capacity(-1 if device == "cpu" else 0))
    work = sized(CPU_WORKLOAD if device == "cpu" else GPU_WORKLOAD, capacity)
    torch.manual_seed(0)
    model = Llama(LlamaShape(work.hidden, work.layers, work.heads, work.kv_heads, work.vocab,
                             max_sequence=work.seq), device=device)
    tokens = torch.randint(0, work.vocab, (work.batch, work.seq), device=device)
    def loss_fn(model: Any, batch: Any) -> Any:  # eight chunks of logits at any size
        return model.chunked_loss(batch, chunks=8)

    count = sum(p.numel() for p in model.parameters())
    where = f"stowage's CPU mode, a simulated device of {stowage.format_bytes(capacity)}" if device == "cpu" \
        else f"{torch.cuda.get_device_name()} ({stowage.format_bytes(capacity)})"
    print(f"A Llama-style decoder of {count / 1e6:.1f}M parameters ({work.layers} layers, hidden {work.hidden}), "
          f"batch {work.batch} x {work.seq} tokens, AdamW, on {where}.\n")
    print("As it is (torch's AdamW, no plan): " + _train_as_it_is(model, tokens, loss_fn) + "\n")
    fitted = stowage.fit(model, lambda params: torch.optim.AdamW(params, lr=1e-4), tokens, loss_fn=loss_fn)
    print()
    _train_fitted(fitted, tokens, args.steps, args.snapshot)
    print(f"\nWith stowage.fit: {args.steps} steps trained on {stowage.format_bytes(capacity)}, peak "
          f"{stowage.format_bytes(stowage.max_memory_reserved())} reserved.")
    return 0
