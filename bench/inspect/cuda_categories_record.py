"""Records stock PyTorch's CUDA memory snapshots of five models' training steps, with what each
allocation live at two moments of the last step really is, for checking the inspector's
categories (snapshot/categories.hpp) on snapshots stowage did not write.

Needs a GPU, torch, transformers and torchvision; nothing of stowage (it runs where stowage is
not built). For each model: history recording starts before the model is made (as torch's
memory_viz instructions say), AdamW (torch's default, foreach) runs three steps; in the third,
a marker allocation of a size no model makes is allocated and freed after the forward (the
loss computed) and again after backward (before the optimizer's step), and at each the script
writes down the storages it knows: parameters and buffers, gradients, the optimizer's states,
the tensors autograd saved in that forward (a saved-tensor hook notes them), and the batch.

    python3 bench/inspect/cuda_categories_record.py [--dry-run] OUTDIR [model ...]

writes OUTDIR/<model>.pickle.gz (torch.cuda.memory._snapshot(), pickled, gzipped) and
OUTDIR/truth.json: per model, per marker, its size and {address: category} of what is known
(anything live and not listed is a temporary: logits, the loss, the allocator's own).
bench/inspect/cuda_categories_check.py compares the inspector with it.
"""

from __future__ import annotations

import gzip
import json
import pickle
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

DEVICE = "cuda"  # "cpu" for --dry-run: the steps and the bookkeeping, no snapshot
MARKERS = {"after_forward": 6007 * 512, "after_backward": 6011 * 512}  # sizes no model allocates


def _gpt2() -> tuple[torch.nn.Module, Callable[[], dict[str, torch.Tensor]]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12)).to(DEVICE)
    return model, lambda: _tokens(model.config.vocab_size, 8, 512)


def _llama() -> tuple[torch.nn.Module, Callable[[], dict[str, torch.Tensor]]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                         num_key_value_heads=4, vocab_size=32000)
    model = LlamaForCausalLM(config).to(DEVICE)
    return model, lambda: _tokens(config.vocab_size, 8, 512)


def _bert() -> tuple[torch.nn.Module, Callable[[], dict[str, torch.Tensor]]]:
    from transformers import BertConfig, BertForMaskedLM

    model = BertForMaskedLM(BertConfig()).to(DEVICE)
    return model, lambda: _tokens(model.config.vocab_size, 16, 256)


def _tokens(vocab: int, rows: int, length: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, vocab, (rows, length), device=DEVICE)
    return {"input_ids": ids, "labels": ids.clone()}


def _vision(name: str) -> Callable[[], tuple[torch.nn.Module, Callable[[], dict[str, torch.Tensor]]]]:
    def make() -> tuple[torch.nn.Module, Callable[[], dict[str, torch.Tensor]]]:
        import torchvision

        model = getattr(torchvision.models, name)(num_classes=1000).to(DEVICE)
        rows = 64 if name == "resnet50" else 32
        return model, lambda: {"images": torch.randn(rows, 3, 224, 224, device=DEVICE),
                               "targets": torch.randint(0, 1000, (rows,), device=DEVICE)}
    return make


MODELS = {"gpt2": _gpt2, "llama": _llama, "bert": _bert, "resnet50": _vision("resnet50"), "vit_b_16": _vision("vit_b_16")}


def _loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    if "images" in batch:
        return torch.nn.functional.cross_entropy(model(batch["images"]), batch["targets"])
    return model(**batch).loss


def _address(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _marker(name: str) -> None:
    mark = torch.empty(MARKERS[name], dtype=torch.uint8, device=DEVICE)
    del mark


def _known(model: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: set[int],
           batch: dict[str, torch.Tensor]) -> dict[int, str]:
    """{address: category} of the storages the script knows, strongest claim first."""
    known: dict[int, str] = {}
    for address in saved:
        known[address] = "activations"
    for tensor in batch.values():
        known[_address(tensor)] = "inputs"
    for parameter in model.parameters():
        if parameter.grad is not None:
            known[_address(parameter.grad)] = "gradients"
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.device.type == DEVICE:
                known[_address(value)] = "optimizer states"
    for tensor in list(model.parameters()) + list(model.buffers()):
        known[_address(tensor)] = "parameters"
    return known


def record(name: str, out: Path) -> dict[str, Any]:
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.memory._record_memory_history("all", context="all", stacks="python", max_entries=1_000_000)
    started = time.perf_counter()
    model, make_batch = MODELS[name]()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    truth: dict[str, Any] = {}
    for step in range(3):
        batch = make_batch()
        saved: set[int] = set()

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            if tensor.device.type == DEVICE:
                saved.add(_address(tensor))
            return tensor.detach()  # the storage itself, without its graph (no reference cycle)

        last = step == 2
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss = _loss(model, batch)
        if last:
            truth["after_forward"] = {"size": MARKERS["after_forward"], "known": _known(model, optimizer, saved, batch)}
            _marker("after_forward")
        loss.backward()
        if last:
            truth["after_backward"] = {"size": MARKERS["after_backward"],
                                       "known": _known(model, optimizer, set(), batch)}
            _marker("after_backward")
        optimizer.step()
        optimizer.zero_grad()
        del loss, batch
    if DEVICE == "cuda":
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(None)
        (out / f"{name}.pickle.gz").write_bytes(gzip.compress(pickle.dumps(snapshot, protocol=4), mtime=0))
    for marker in truth.values():
        marker["known"] = {str(address): category for address, category in marker["known"].items()}
    truth["seconds"] = round(time.perf_counter() - started, 2)
    truth["parameters"] = sum(p.numel() for p in model.parameters())
    del model, optimizer
    return truth


def main(argv: list[str]) -> int:
    global DEVICE
    if argv and argv[0] == "--dry-run":
        DEVICE, argv = "cpu", argv[1:]
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    names = argv[1:] or list(MODELS)
    truths = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (dry run)", "torch": torch.__version__, "models": {}}
    for name in names:
        truths["models"][name] = record(name, out)
        print(f"{name}: {truths['models'][name]['parameters'] / 1e6:.1f}M parameters, "
              f"{truths['models'][name]['seconds']} s", flush=True)
        (out / "truth.json").write_text(json.dumps(truths))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
