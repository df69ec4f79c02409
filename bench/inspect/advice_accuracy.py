"""Does the inspector's advice save what it says? For each model (bench/e2e/batch_models.py) and
each waste a loop can show, the loop runs in CPU mode with history recorded (stowage's tags on),
the inspector advises, the advice is applied and the loop run again; the predicted saving (the
trace re-simulated) is set beside the measured one (the peak of memory_allocated over the run,
less what was allocated before it, without the advice less with it).

Loops and the advice each applies:
- "train": three AdamW steps. Optimizer states -> stowage.offload.AdamW; activations -> each
  block checkpointed (torch.utils.checkpoint, non-reentrant, on the blocks the advice names;
  transformers' own gradient_checkpointing_enable() on theirs); logits at the peak -> the loss
  in chunks (chunked_causal_loss).
- "eval_with_grad": a training step, then two evaluation forwards whose outputs are kept until
  the next (no torch.no_grad) -> the evaluation under torch.no_grad().
- "kept_gradients": SGD steps with zero_grad(set_to_none=False) -> set_to_none=True.
- "kept_outputs": every step also keeps a forward's loss on a quarter of the rows, with its graph
  (no backward) -> kept detached.

    python3 bench/inspect/advice_accuracy.py [--models gpt2,...] [--json OUT]
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
import batch_models  # noqa: E402

import stowage  # noqa: E402
from stowage import _core  # noqa: E402
from stowage._core import advice_loss_chunks as LOSS_CHUNKS  # noqa: E402
from stowage.inspection.findings import inspect_device  # noqa: E402

MODELS = ("gpt2", "hf_llama", "opt", "bert", "vit", "convnext", "resnet18", "mlp", "llama")
ROWS = {"mlp": 256, "resnet18": 16, "vit": 16, "convnext": 8}
LOOPS = ("train", "eval_with_grad", "kept_gradients", "kept_outputs")


def checkpoint_blocks(model: Any) -> int:
    """Checkpoints each block as a user would: a transformers model by its own
    gradient_checkpointing_enable() (non-reentrant; it also turns the key/value cache off, which
    a checkpointed block would otherwise keep through its arguments); elsewhere each block's
    forward (snapshot/recompute_estimate.hpp's blocks) wrapped in torch.utils.checkpoint."""
    if hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return -1
    root = type(model).__name__
    named = [(f"{root}.{n}" if n else root, m) for n, m in model.named_modules()]
    of_path, blocks = _core.block_of_paths([path for path, _ in named])
    wrapped = 0
    for (path, module), block in zip(named, of_path):
        if block >= 0 and path == blocks[block]:
            module.forward = functools.partial(checkpoint, module.forward, use_reentrant=False)
            wrapped += 1
    return wrapped


def chunked_causal_loss(model: Any, batch: Any) -> torch.Tensor:
    """A transformers causal LM's loss (the mean over shifted tokens) in LOSS_CHUNKS chunks of
    tokens, each chunk's logits recomputed in backward (torch.utils.checkpoint)."""
    hidden = model.base_model(input_ids=batch["input_ids"]).last_hidden_state[:, :-1].reshape(-1, model.config.hidden_size)
    labels = batch["labels"][:, 1:].reshape(-1)
    head = model.get_output_embeddings()

    def chunk_loss(h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(head(h).float(), y, reduction="sum")

    total = sum(checkpoint(chunk_loss, h, y, use_reentrant=False)
                for h, y in zip(hidden.chunk(LOSS_CHUNKS), labels.chunk(LOSS_CHUNKS)))
    return total / labels.numel()


def run_loop(name: str, loop: str, fix: str | None) -> Callable[[], None]:
    def run() -> None:
        torch.manual_seed(0)
        model, make_batch, loss_fn, _ = batch_models.build(name)
        model.train()
        if fix == "chunked":
            loss_fn = chunked_causal_loss
        if fix == "activations":
            checkpoint_blocks(model)
        if fix == "optimizer states":
            optimizer: Any = stowage.offload.AdamW(model.parameters(), lr=1e-4)
        elif loop == "train":
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        else:
            optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        rows = ROWS.get(name, 4)
        kept: list[Any] = []
        try:
            for step in range(3 if loop != "kept_outputs" else 5):
                loss = loss_fn(model, make_batch(rows))
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=not (loop == "kept_gradients" and fix != "set_to_none"))
                del loss
                if loop == "kept_outputs":  # a few rows' loss kept each step, with its graph
                    if fix == "detach":
                        kept.append(loss_fn(model, make_batch(max(1, rows // 4))).detach())
                    else:
                        kept.append(loss_fn(model, make_batch(max(1, rows // 4))))
                if loop == "eval_with_grad":
                    outputs = None
                    for _ in range(2):
                        with torch.no_grad() if fix == "no_grad" else torch.enable_grad():
                            outputs = loss_fn(model, make_batch(rows))  # kept until the next
                    del outputs
                stowage.mark_step()
        finally:
            if hasattr(optimizer, "close"):
                optimizer.close()
    return run


def measured(run: Callable[[], None], record: bool) -> tuple[int, dict[str, Any] | None]:
    gc.collect()
    start = stowage.memory_allocated()
    stowage.reset_peak_stats()
    snapshot = None
    if record:
        stowage.record_history(True)
    try:
        run()
        if record:
            snapshot = stowage.snapshot()
    finally:
        if record:
            stowage.record_history(False)
    peak = stowage.max_memory_allocated() - start
    gc.collect()
    return peak, snapshot


FIXES = {"optimizer states": "optimizer states", "activations": "activations",
         "forward without backward": "no_grad", "gradients kept across steps": "set_to_none",
         "memory growing every step": "detach", "logits at the peak": "chunked"}


def one(name: str, loop: str) -> list[dict[str, Any]]:
    peak, snapshot = measured(run_loop(name, loop, None), record=True)
    assert snapshot is not None
    report = inspect_device(snapshot, 0, 5)
    rows = []
    for advice in report["advice"]:
        fix = FIXES.get(advice["rule"])
        if fix is None or (fix == "chunked" and not hasattr(batch_models.build(name)[0], "base_model")):
            continue  # (stowage's Llama computes its loss in chunks already: more chunks are not measured)
        fixed, _ = measured(run_loop(name, loop, fix), record=False)
        rows.append({"model": name, "loop": loop, "rule": advice["rule"], "predicted_bytes": advice["saving_bytes"],
                     "measured_bytes": peak - fixed, "peak_bytes": peak, "fixed_peak_bytes": fixed,
                     "traced_peak_bytes": report["peak"]["live_bytes"], "upper_bound": advice.get("upper_bound", False)})
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--loops", default=",".join(LOOPS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    stowage.enable(device="cpu", capacity="16GiB")
    torch.set_num_threads(1)
    results = []
    for name in args.models.split(","):
        for loop in args.loops.split(","):
            started = time.perf_counter()
            for row in one(name, loop):
                row["seconds"] = round(time.perf_counter() - started, 1)
                results.append(row)
                error = (row["measured_bytes"] - row["predicted_bytes"]) / max(row["measured_bytes"], 1)
                print(f"{name:9s} {loop:15s} {row['rule']:28s} predicted {row['predicted_bytes'] / 2**20:8.2f} MiB  "
                      f"measured {row['measured_bytes'] / 2**20:8.2f} MiB  ({100 * error:+6.1f}%)  "
                      f"peak {row['peak_bytes'] / 2**20:.1f} MiB", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
