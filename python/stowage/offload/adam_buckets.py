"""The offloaded Adam's host-side layout: parameters grouped in buckets (Note [Optimizer
buckets], offload/adam_buckets.hpp, which plans them), each bucket's states, staging and output
buffers in host memory with the bookkeeping of its updates (python/bindings/torch/host_bucket.hpp),
each parameter a view in them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from stowage.serving import torch_module
from stowage.offload.host_memory import check_host_room
from stowage.offload.sharded import local

DEFAULT_BUCKET_NUMEL = 1 << 24  # 16 M parameters: 448 MB of traffic per update


@dataclass(eq=False)
class Slot:
    """One offloaded parameter: its views in the bucket and its step count (the bucket's).

    ``index`` is its row in the optimizer's content watches (stowage.offload.slot_watch).
    ``copied`` is the gradient copied out this step (a weak reference: the optimizer never keeps a
    gradient alive) and ``final_version`` its version then, updated when backward ends (None:
    nothing copied this step). Versions, shapes and views are the local tensor's under FSDP2
    (sharded.local).
    """

    param: torch.Tensor
    group: dict[str, Any]
    offset: int
    numel: int
    master: torch.Tensor
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    max_exp_avg_sq: torch.Tensor | None
    step: torch.Tensor
    index: int = 0
    bucket: "Bucket | None" = None
    final_version: int | None = None
    copied: Any = None  # weakref.ref to the gradient copied out this step

    def grad_view(self, buffer: torch.Tensor) -> torch.Tensor:
        return buffer[self.offset:self.offset + self.numel]


@dataclass(eq=False)
class Bucket:
    """Parameters updated together: ``host`` holds their buffers and step counts (a HostBucket);
    ``copied_event`` and ``returned_event`` mark this step's copies out and the last write-back,
    ``updated`` the update submitted for this step (an UpdateTicket) and ``updated_slots`` the
    slots it updates."""

    slots: list[Slot]
    host: Any
    arrived: int = 0
    copied_event: Any = None
    returned_event: Any = None
    updated: Any = None
    updated_slots: list[Slot] = field(default_factory=list)

    def __getattr__(self, name: str) -> Any:  # master, exp_avg, grads, out, narrow, bytes, ...
        if name == "host":
            raise AttributeError(name)
        return getattr(self.host, name)

    @property
    def group(self) -> dict[str, Any]:
        return self.slots[0].group


def kept_on_device(numels: Sequence[int], fraction: float) -> int:
    """How many of the first parameters (in the optimizer's order) keep their states on the
    device for `fraction` of the parameters by count (offload/adam_buckets.hpp)."""
    return int(torch_module().kept_on_device(list(numels), fraction))


def bytes_per_parameter(dtype: torch.dtype, grad_buffers: int, amsgrad: bool = False,
                        master_weights: bool = False) -> int:
    """Host bytes one offloaded parameter takes: master, moments (and amsgrad's maximum), the
    gradient staging buffers and, with fp32 masters of a parameter that is not fp32, an output
    buffer (offload/adam_buckets.hpp)."""
    return int(torch_module().bytes_per_parameter(dtype, grad_buffers, amsgrad, master_weights))


def build_buckets(params: list[tuple[torch.Tensor, dict[str, Any]]], store: Any, bucket_numel: int,
                  grad_buffers: int, host_memory_limit: int | None, master_weights: bool = False) -> list[Bucket]:
    """The buckets for `params`, after checking the host has room for all of them; the masters
    start from the parameters."""
    module = torch_module()
    numbers: dict[int, int] = {}
    devices: dict[torch.device, int] = {}
    plans = module.plan_buckets([(numbers.setdefault(id(g), len(numbers)), p.dtype, local(p).numel(),
                                  devices.setdefault(p.device, len(devices))) for p, g in params], bucket_numel)
    members = [[params[i] for i in plan.members] for plan in plans]
    needed = sum(bytes_per_parameter(m[0][0].dtype, grad_buffers, bool(m[0][1].get("amsgrad")), master_weights)
                 * plan.numel for m, plan in zip(members, plans))
    check_host_room(needed, "stowage.offload.AdamW's host states", host_memory_limit)
    return [_make_bucket(m, module.HostBucket(store, m[0][0].dtype, [local(p).numel() for p, _ in m], master_weights,
                                              bool(m[0][1].get("amsgrad")), grad_buffers)) for m in members]


def _make_bucket(members: list[tuple[torch.Tensor, dict[str, Any]]], host: Any) -> Bucket:
    bucket = Bucket([], host)
    maximum = host.max_exp_avg_sq
    for (param, group), offset, step in zip(members, host.offsets, host.steps):
        shard = local(param)  # FSDP2: this rank's shard only
        view = slice(offset, offset + shard.numel())
        slot = Slot(param, group, offset, shard.numel(), host.master[view].view(shard.shape),
                    host.exp_avg[view].view(shard.shape), host.exp_avg_sq[view].view(shard.shape),
                    None if maximum is None else maximum[view].view(shard.shape), step, bucket=bucket)
        slot.master.copy_(shard.detach())
        bucket.slots.append(slot)
    return bucket
