"""stowage.fit's decision time where the step does not fit whole (recorded at a grid of smaller
sizes), beside one fitted step's time, in CPU mode: one model per process, one JSON line out.

    python3 bench/e2e/fit_recording.py --model demo|falcon|efficientnet

- demo: ``stowage demo``'s Llama-style decoder sized to a 96 MiB device (its own workload);
- falcon: transformers' FalconForCausalLM, a tiny config (2 layers, hidden 64), 8 x 256 tokens
  on a 44 MiB device, where its plain step runs out of memory;
- efficientnet: torchvision's EfficientNet-B0, 16 images of 128 x 128 on a 112 MiB device
  (micro_batches="auto", split_batchnorm=True), where its plain step runs out of memory.

Printed: the seconds ``stowage.fit`` took to decide (or to refuse, with the refusal's first
line), how it recorded the step, the seconds of one fitted step after it, and the host's load.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import torch

import stowage

COST = {"to_host_bytes_per_ms": 8e6, "to_device_bytes_per_ms": 8e6, "prefetch_depth": 2}


def demo() -> tuple[Any, Any, Any, dict[str, Any]]:
    from stowage.demo import CPU_WORKLOAD, sized
    from stowage.models.llama import Llama, LlamaShape
    from stowage.serving import torch_module

    stowage.enable(device="cpu", capacity="96MiB")
    work = sized(CPU_WORKLOAD, int(torch_module().capacity(-1)))
    torch.manual_seed(0)
    model = Llama(LlamaShape(work.hidden, work.layers, work.heads, work.kv_heads, work.vocab,
                             max_sequence=work.seq))
    tokens = torch.randint(0, work.vocab, (work.batch, work.seq))
    return model, tokens, lambda m, batch: m.chunked_loss(batch, chunks=8), {}


def falcon() -> tuple[Any, Any, Any, dict[str, Any]]:
    from transformers import FalconConfig, FalconForCausalLM

    stowage.enable(device="cpu", capacity="44MiB")
    torch.manual_seed(0)
    model = FalconForCausalLM(FalconConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2,
                                           num_attention_heads=4, multi_query=True, parallel_attn=True, bias=False,
                                           alibi=False))
    ids = torch.randint(0, 512, (8, 256), generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": ids, "labels": ids}, None, {}


def efficientnet() -> tuple[Any, Any, Any, dict[str, Any]]:
    import torchvision

    stowage.enable(device="cpu", capacity="112MiB")
    torch.manual_seed(0)
    model = torchvision.models.efficientnet_b0(num_classes=10)
    batch = (torch.randn(16, 3, 128, 128), torch.randint(0, 10, (16,)))
    return model, batch, lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]), {
        "micro_batches": "auto", "split_batchnorm": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("demo", "falcon", "efficientnet"), required=True)
    args = parser.parse_args()
    torch.set_num_threads(2)
    model, batch, loss_fn, options = {"demo": demo, "falcon": falcon, "efficientnet": efficientnet}[args.model]()
    result: dict[str, Any] = {"model": args.model, "load": os.getloadavg()[0]}
    start = time.perf_counter()
    try:
        fitted = stowage.fit(model, lambda params: torch.optim.AdamW(params, lr=1e-4), batch, loss_fn=loss_fn,
                             cost=COST, verbose=False, **options)
    except (torch.OutOfMemoryError, ValueError) as error:
        result.update(refused_after_s=round(time.perf_counter() - start, 2), refusal=str(error).splitlines()[0])
    else:
        result.update(decided_s=round(time.perf_counter() - start, 2), recorded=fitted.facts["recorded"])
        start = time.perf_counter()
        fitted.step(batch)
        result["step_s"] = round(time.perf_counter() - start, 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
