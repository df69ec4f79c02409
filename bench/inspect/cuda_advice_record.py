"""Records stock PyTorch's CUDA memory snapshots of loops that waste memory, and measures each
loop's peak again with the waste fixed, for checking the inspector's advice (snapshot/advice.hpp) on
snapshots stowage did not write: the saving it predicts from the snapshot against the saving
measured on the GPU.

Needs a GPU, torch, transformers and torchvision; nothing of stowage. Loops (each model):
- train: three AdamW steps; the fix for a language model: the loss in LOSS_CHUNKS chunks of
  tokens, each chunk's logits recomputed in backward ("chunked");
- eval_with_grad: an SGD step, then two evaluation forwards whose loss is kept until the next,
  without torch.no_grad ("no_grad" fixes it);
- kept_gradients: three SGD steps of a quarter batch with zero_grad(set_to_none=False)
  ("set_to_none");
- kept_outputs: eight SGD steps, each keeping a quarter batch's loss with its graph ("detach").
A loop's peak: torch.cuda.max_memory_allocated() over the run less what was allocated before.

    python3 bench/inspect/cuda_advice_record.py [--dry-run] OUTDIR [model ...]

writes OUTDIR/advice_snapshots.pickle.gz ({"model/loop": snapshot}) and OUTDIR/advice_peaks.json
({"model/loop": {"peak": bytes, "fixed": {fix: bytes}}}); bench/inspect/cuda_advice_check.py
compares.
"""

from __future__ import annotations

import gc
import gzip
import json
import pickle
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

LOSS_CHUNKS = 8  # as stowage._core.advice_loss_chunks
DEVICE = "cuda"  # "cpu" for --dry-run: the loops at two rows, nothing recorded or measured


def _causal(name: str) -> tuple[Any, Callable[[int], dict[str, torch.Tensor]]]:
    import transformers as hf

    if name == "gpt2":
        model = hf.GPT2LMHeadModel(hf.GPT2Config(n_layer=12, n_embd=768, n_head=12))
    else:
        model = hf.LlamaForCausalLM(hf.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                                                   num_attention_heads=16, num_key_value_heads=4, vocab_size=32000))
    vocab = model.config.vocab_size
    return model.to(DEVICE), lambda rows: _tokens(vocab, rows, 512)


def _tokens(vocab: int, rows: int, length: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, vocab, (rows, length), device=DEVICE)
    return {"input_ids": ids, "labels": ids.clone()}


def _bert() -> tuple[Any, Callable[[int], dict[str, torch.Tensor]]]:
    import transformers as hf

    model = hf.BertForMaskedLM(hf.BertConfig()).to(DEVICE)
    return model, lambda rows: _tokens(model.config.vocab_size, 2 * rows, 256)


def _vision(name: str) -> tuple[Any, Callable[[int], dict[str, torch.Tensor]]]:
    import torchvision

    model = getattr(torchvision.models, name)(num_classes=1000).to(DEVICE)
    scale = 8 if name == "resnet50" else 4
    return model, lambda rows: {"images": torch.randn(scale * rows, 3, 224, 224, device=DEVICE),
                                "targets": torch.randint(0, 1000, (scale * rows,), device=DEVICE)}


MODELS: dict[str, Callable[[], tuple[Any, Callable[[int], dict[str, torch.Tensor]]]]] = {
    "gpt2": lambda: _causal("gpt2"), "llama": lambda: _causal("llama"), "bert": _bert,
    "resnet50": lambda: _vision("resnet50"), "vit_b_16": lambda: _vision("vit_b_16")}
CHUNKED = ("gpt2", "llama", "bert")  # language models: their loss can be chunked
ROWS = 8


def _loss(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    if "images" in batch:
        return F.cross_entropy(model(batch["images"]), batch["targets"])
    return model(**batch).loss


def _chunked_loss(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The language model's loss (the mean over its tokens: shifted for a causal LM, all of them
    for BERT's masked LM, whose labels here are every token) in LOSS_CHUNKS chunks of tokens,
    each chunk's logits recomputed in backward."""
    masked = hasattr(model, "cls")
    hidden = model.base_model(input_ids=batch["input_ids"]).last_hidden_state
    labels = batch["labels"] if masked else batch["labels"][:, 1:]
    hidden = (hidden if masked else hidden[:, :-1]).reshape(-1, hidden.shape[-1])
    labels = labels.reshape(-1)
    head = model.cls if masked else model.get_output_embeddings()

    def chunk(h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(head(h).float(), y, reduction="sum")

    total = sum(checkpoint(chunk, h, y, use_reentrant=False)
                for h, y in zip(hidden.chunk(LOSS_CHUNKS), labels.chunk(LOSS_CHUNKS)))
    return total / labels.numel()


def _loop(name: str, loop: str, fix: str | None) -> None:
    torch.manual_seed(0)
    model, batch = MODELS[name]()
    model.train()
    loss_fn = _chunked_loss if fix == "chunked" else _loss
    optimizer: Any = torch.optim.AdamW(model.parameters(), lr=1e-4) if loop == "train" else \
        torch.optim.SGD(model.parameters(), lr=1e-3)
    kept: list[Any] = []
    rows = ROWS // 4 if loop == "kept_gradients" else ROWS  # (gradients a larger share of the peak)
    for _ in range(8 if loop == "kept_outputs" else 3):
        loss_fn(model, batch(rows)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=not (loop == "kept_gradients" and fix != "set_to_none"))
        if loop == "kept_outputs":
            if fix == "detach":
                kept.append(loss_fn(model, batch(ROWS // 4)).detach())
            else:
                kept.append(loss_fn(model, batch(ROWS // 4)))
        if loop == "eval_with_grad":
            outputs = None
            for _ in range(2):
                with torch.no_grad() if fix == "no_grad" else torch.enable_grad():
                    outputs = loss_fn(model, batch(ROWS))  # kept until the next
            del outputs


def _peak(name: str, loop: str, fix: str | None, record: bool) -> tuple[int, dict[str, Any] | None]:
    if DEVICE == "cpu":
        _loop(name, loop, fix)
        return 0, {}
    gc.collect()
    torch.cuda.empty_cache()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    if record:
        torch.cuda.memory._record_memory_history("all", context="all", stacks="python", max_entries=1_000_000)
    _loop(name, loop, fix)
    torch.cuda.synchronize()
    snapshot = None
    if record:
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(None)
    return torch.cuda.max_memory_allocated() - start, snapshot


LOOPS = {"train": ("chunked",), "eval_with_grad": ("no_grad",), "kept_gradients": ("set_to_none",),
         "kept_outputs": ("detach",)}


def main(argv: list[str]) -> int:
    global DEVICE, ROWS
    if argv and argv[0] == "--dry-run":
        DEVICE, ROWS, argv = "cpu", 4, argv[1:]
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    snapshots: dict[str, Any] = {}
    device = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (dry run)"
    peaks: dict[str, Any] = {"device": device, "torch": torch.__version__, "runs": {}}
    for name in argv[1:] or list(MODELS):
        for loop, fixes in LOOPS.items():
            started = time.perf_counter()
            key = f"{name}/{loop}"
            peak, snapshots[key] = _peak(name, loop, None, record=True)
            fixed = {fix: _peak(name, loop, fix, record=False)[0] for fix in fixes
                     if fix != "chunked" or name in CHUNKED}
            peaks["runs"][key] = {"peak": peak, "fixed": fixed}
            print(f"{key}: peak {peak / 2**20:.0f} MiB, fixed {({k: round(v / 2**20) for k, v in fixed.items()})} MiB, "
                  f"{time.perf_counter() - started:.1f} s", flush=True)
            (out / "advice_peaks.json").write_text(json.dumps(peaks, indent=1))
    (out / "advice_snapshots.pickle.gz").write_bytes(gzip.compress(pickle.dumps(snapshots, protocol=4), mtime=0))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
