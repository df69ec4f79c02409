"""stowage.fit per rank under torch.distributed: two CPU-mode processes on the gloo backend, each
fitting its own step under a budget that moves optimizer states to the host; every rank takes one
share, which fits every rank's device, and the parameters stay identical across ranks (the update
uses reduced gradients)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from test_offload_adamw import run_two_ranks  # noqa: E402

FIT_PRELUDE = """
import os, sys, torch, torch.distributed as dist
import stowage
from stowage.models.llama import Llama, LlamaShape
rank, world, port, out = int(sys.argv[1]), 2, sys.argv[2], sys.argv[3]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
stowage.enable(device="cpu", capacity="1GiB")
dist.init_process_group("gloo", rank=rank, world_size=world)
torch.manual_seed(0)
model = Llama(LlamaShape(hidden=256, layers=2, heads=4, kv_heads=2, vocab=4096, max_sequence=64))
tokens = torch.randint(0, 4096, (4, 64), generator=torch.Generator().manual_seed(rank))
COST = {"to_host_bytes_per_ms": 8e6, "to_device_bytes_per_ms": 8e6, "prefetch_depth": 2}
def factory(params):
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1)
def budget_without_room_for_states(parameters):
    # fit's margin (16 MiB here), the gradients, half of AdamW's states and 8 MiB for the step:
    # all of the states cannot stay on the device
    numel = sum(p.numel() for p in parameters)
    return stowage.memory_allocated() + (16 << 20) + 4 * numel + 4 * numel + (8 << 20)
"""

DDP_FIT_SCRIPT = FIT_PRELUDE + """
# the ranks build identical models from one seed, so DDP's start-up broadcast is skipped: its
# flattened copy of the parameters is freed on gloo's thread at a moment that varies, and the
# budget below is measured from the memory in use
ddp = torch.nn.parallel.DistributedDataParallel(model, init_sync=False)
# rank 1's device has 10 MiB less: half the states on the device fits rank 0 alone
budget = budget_without_room_for_states(model.parameters()) - rank * (10 << 20)
fitted = stowage.fit(ddp, factory, tokens, loss_fn=lambda m, batch: m(batch), budget=budget, cost=COST,
                     verbose=rank == 0)
for step in range(3):
    fitted.step(tokens)
torch.save({"params": [p.detach() for p in model.parameters()], "fraction": fitted.device_fraction,
            "offloaded": isinstance(fitted.optimizer, stowage.offload.AdamW),
            "feasible": [o.fraction for o in fitted.options if o.feasible]}, out)
dist.destroy_process_group()
"""


def test_ddp_ranks_take_a_share_both_fit_and_keep_identical_parameters(tmp_path: Path) -> None:
    first, second = run_two_ranks(DDP_FIT_SCRIPT, tmp_path)
    assert first["offloaded"] and second["offloaded"]
    assert first["fraction"] == second["fraction"] < 1.0
    assert 0.5 in first["feasible"] and 0.5 not in second["feasible"]  # the ranks' devices disagree
    assert first["fraction"] in first["feasible"] and first["fraction"] in second["feasible"]
    for a, b in zip(first["params"], second["params"]):
        assert torch.equal(a, b)


FSDP2_FIT_SCRIPT = FIT_PRELUDE + """
from torch.distributed.fsdp import fully_shard
for block in model.blocks:
    fully_shard(block)
fully_shard(model)
# 12 MiB more: each block's parameters are gathered whole for its forward and backward
budget = budget_without_room_for_states([p.to_local() for p in model.parameters()]) + (12 << 20)
fitted = stowage.fit(model, factory, tokens, loss_fn=lambda m, batch: m(batch), budget=budget, cost=COST,
                     verbose=rank == 0)
for step in range(3):
    fitted.step(tokens)
torch.save({"params": [p.full_tensor().detach() for p in model.parameters()], "fraction": fitted.device_fraction,
            "offloaded": isinstance(fitted.optimizer, stowage.offload.AdamW),
            "host_bytes": fitted.optimizer.host_stats()["allocated_bytes"] - fitted.optimizer.host_stats()["staging_bytes"]},
           out)
dist.destroy_process_group()
"""


def test_fsdp2_ranks_fit_their_shards_and_keep_identical_parameters(tmp_path: Path) -> None:
    first, second = run_two_ranks(FSDP2_FIT_SCRIPT, tmp_path)
    assert first["offloaded"] and second["offloaded"]
    assert first["fraction"] == second["fraction"] < 1.0
    for a, b in zip(first["params"], second["params"]):
        assert torch.equal(a, b)
    numel = sum(p.numel() for p in first["params"])
    assert first["host_bytes"] < 0.75 * 8 * numel  # each rank holds its shards' states (8 B a parameter), not all
