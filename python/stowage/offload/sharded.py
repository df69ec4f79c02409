"""FSDP2's sharded parameters, for the offloaded optimizer: under ``fully_shard`` parameters and
gradients are DTensors whose local tensor is this rank's shard, and the post-accumulate-grad hooks
run once a gradient's reduce-scatter is done (on its stream, which the copy out waits for). The
optimizer keeps and updates the local shards and hands states out as DTensors sharded like their
parameters, as torch's AdamW holds them under FSDP2."""

from __future__ import annotations

import torch

if torch.distributed.is_available():  # a build without distributed has no DTensor, and nothing sharded
    from torch.distributed.tensor import DTensor
else:
    DTensor = None


def is_sharded(tensor: torch.Tensor) -> bool:
    return DTensor is not None and isinstance(tensor, DTensor)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of `tensor`: its local tensor for a DTensor (same storage), else itself."""
    return tensor.to_local() if is_sharded(tensor) else tensor


def shaped_like(state: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """`state` (a host tensor of `param`'s local shape) as torch's AdamW would hold it for `param`:
    a DTensor sharded like it under FSDP2, itself otherwise."""
    if not is_sharded(param):
        return state
    return DTensor.from_local(state, param.device_mesh, param.placements, run_check=False,
                            shape=param.shape, stride=param.stride())
