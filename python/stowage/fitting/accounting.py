"""The device-memory figures behind `fit`'s choices, read from the model and optimizer as built
(the arithmetic on them is the planner's: Note [Weighing fit's options] in
planner/fit_weighing.hpp).

AdamW keeps two moments a parameter, in the parameter's dtype (torch's AdamW, and the share
stowage.offload.AdamW keeps on the device); its multi-tensor path (``foreach``, torch's default on
a GPU) makes one more copy of the squared moments to take their square root, its fused and
single-tensor paths one parameter's at most.
"""

from __future__ import annotations

from typing import Any

import torch

from stowage import _core
from stowage.offload.sharded import local

# Kept free of the device: the allocator's rounding (pages shared by blocks of different lives
# cannot move; on a small device a few pages are a large share) and torch's own small allocations.
MARGIN_SHARE = 0.05
MARGIN_PAGES = 8
PAGE_BYTES = 2 << 20


def state_copies(optimizer: Any) -> int:
    """Copies of each parameter the optimizer keeps as state: two for Adam and AdamW (their
    moments; three with amsgrad's maximum), one for SGD with momentum, none for plain SGD; two for
    any other (a guess on the side of room: give such an optimizer's factory a budget with room to
    spare)."""
    if isinstance(optimizer, torch.optim.SGD):
        return 1 if any(g.get("momentum", 0) for g in optimizer.param_groups) else 0
    if isinstance(optimizer, torch.optim.Adam) and any(g.get("amsgrad") for g in optimizer.param_groups):
        return 3
    return 2


def measure(parameters: list[torch.nn.Parameter], in_use: int, capacity: int, copies: int = 2) -> Any:
    """The device's figures (a _core.FitMemory): `parameters` in the optimizer's order (its
    groups'), which decides what a share keeps; ``in_use``: bytes when fit ran (parameters,
    buffers, the example batch); ``usable``: the capacity less a margin for the allocator's
    rounding and for what torch allocates outside the step."""
    trainable = [local(p) for p in parameters if p.requires_grad]  # under FSDP2, this rank's shards
    sizes = [p.numel() * p.element_size() for p in trainable]
    return _core.FitMemory(
        usable=max(capacity - max(int(capacity * MARGIN_SHARE), MARGIN_PAGES * PAGE_BYTES), 0), in_use=in_use,
        parameter_count=sum(p.numel() for p in trainable), gradients=sum(sizes), foreach_temporary=sum(sizes),
        largest_parameter=max(sizes, default=0), numels=[local(p).numel() for p in parameters],
        state_bytes=[copies * local(p).numel() * p.element_size() if p.requires_grad else 0 for p in parameters])


def uses_foreach(optimizer: Any) -> bool:
    """Whether torch's optimizer steps through its multi-tensor path (its default on a GPU)."""
    group = optimizer.param_groups[0]
    if group.get("fused"):
        return False
    if group.get("foreach") is not None:
        return bool(group["foreach"])
    return any(p.is_cuda for g in optimizer.param_groups for p in g["params"])
