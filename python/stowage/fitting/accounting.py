"""The device-memory arithmetic behind `fit`'s choices, from the model and optimizer as built.

Between steps the device holds what was in use when `fit` ran (parameters, buffers, whatever the
caller keeps) and the optimizer states kept on it; a step adds what its lifetime trace records (its
activations and gradients, which the plan bounds); the optimizer's step needs the gradients, the
states and the optimizer's temporaries at once. AdamW keeps two moments a parameter, in the
parameter's dtype (torch's AdamW, and the share stowage.offload.AdamW keeps on the device); its
multi-tensor path (``foreach``, torch's default on a GPU) makes one more copy of the squared
moments to take their square root, its fused and single-tensor paths one parameter's at most.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from stowage.offload.adam_buckets import kept_on_device
from stowage.offload.sharded import local


@dataclass(frozen=True)
class DeviceMemory:
    """Bytes, fixed for one fit. ``usable``: what the device may hold in all, less a margin for
    the allocator's rounding and for what torch allocates outside the step."""

    usable: int
    in_use: int           # when fit ran: parameters, buffers, the example batch
    parameter_count: int  # trainable parameters
    gradients: int        # one gradient per trainable parameter, in its dtype
    states: int           # the optimizer's states of every parameter, in the parameters' dtypes
    foreach_temporary: int
    largest_parameter: int
    numels: tuple[int, ...]       # every parameter, in the optimizer's order
    state_bytes: tuple[int, ...]  # each one's states (none for a frozen one)

    def states_on_device(self, fraction: float) -> int:
        """The states a share keeps on the device: those of the leading parameters that fit in it
        by count (adam_buckets.kept_on_device), as the offloaded optimizer splits them."""
        return sum(self.state_bytes[:kept_on_device(self.numels, fraction)])

    def optimizer_step_peak(self, fraction: float, foreach: bool) -> int:
        """Device bytes in use during the optimizer's step with `fraction` of the states kept."""
        temporary = self.foreach_temporary if foreach else self.largest_parameter
        return self.in_use + self.gradients + self.states_on_device(fraction) + int(temporary * fraction)

    def activation_budget(self, fraction: float) -> int:
        """What a step may add to the device (the plan's budget) with `fraction` of the states kept."""
        return self.usable - self.in_use - self.states_on_device(fraction)


@dataclass(frozen=True)
class HostMemory:
    """The host side of the choice, fixed for one fit: the host bytes an offloaded parameter
    takes (stowage.offload.adam_buckets.bytes_per_parameter: master, moments, gradient staging)
    and what the process may take (stowage.offload.host_memory.host_room: MemAvailable, the
    cgroup's limit, or fit's ``host_budget``), and which limit that is."""

    bytes_per_parameter: int
    available: int
    limited_by: str

    def states(self, memory: DeviceMemory, fraction: float) -> int:
        """Host bytes the offloaded optimizer takes with `fraction` of the states on the device:
        the trainable parameters past those the share keeps (frozen ones take none)."""
        first_offloaded = kept_on_device(memory.numels, fraction)
        offloaded = sum(n for n, states in zip(memory.numels[first_offloaded:], memory.state_bytes[first_offloaded:])
                        if states)
        return offloaded * self.bytes_per_parameter


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


def measure(parameters: list[torch.nn.Parameter], in_use: int, capacity: int, copies: int = 2) -> DeviceMemory:
    """`parameters` in the optimizer's order (its groups'), which decides what a share keeps."""
    trainable = [local(p) for p in parameters if p.requires_grad]  # under FSDP2, this rank's shards
    sizes = [p.numel() * p.element_size() for p in trainable]
    state_bytes = tuple(copies * local(p).numel() * p.element_size() if p.requires_grad else 0 for p in parameters)
    return DeviceMemory(usable=max(capacity - max(int(capacity * MARGIN_SHARE), MARGIN_PAGES * PAGE_BYTES), 0), in_use=in_use,
                        parameter_count=sum(p.numel() for p in trainable), gradients=sum(sizes),
                        states=copies * sum(sizes), foreach_temporary=sum(sizes), largest_parameter=max(sizes, default=0),
                        numels=tuple(local(p).numel() for p in parameters), state_bytes=state_bytes)


def uses_foreach(optimizer: Any) -> bool:
    """Whether torch's optimizer steps through its multi-tensor path (its default on a GPU)."""
    group = optimizer.param_groups[0]
    if group.get("fused"):
        return False
    if group.get("foreach") is not None:
        return bool(group["foreach"])
    return any(p.is_cuda for g in optimizer.param_groups for p in g["params"])
