"""The offloaded Adam's host-side layout: parameters grouped in buckets, each bucket's master
weights, moments (and amsgrad's maximum) and staging buffers as flat host tensors, each parameter
a view in them.

States are fp32 for fp32 parameters. For bf16 and fp16 parameters they are what torch's Adam
keeps: the parameter and its moments in its own precision (a "narrow" bucket, whose masters are
the parameters themselves, written back as they are); with ``master_weights`` they are fp32
masters and moments instead (the mixed-precision recipe), rounded to an output buffer for the
copy back.

A bucket holds parameters of one param group, one device and one dtype, in the order their
gradients usually become final (reverse registration order, as DDP's buckets), up to
``bucket_numel`` elements. Its gradients are copied into its staging buffer as they arrive; once
all have, one update runs over the whole bucket (in runs of parameters with the same step count),
and its parameters are written back from the output buffer (the masters themselves for fp32).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from stowage.offload.host_memory import check_host_room
from stowage.offload.sharded import local

DEFAULT_BUCKET_NUMEL = 1 << 24  # 16 M parameters: 448 MB of traffic per update


@dataclass(eq=False)
class Slot:
    """One offloaded parameter: its views in the bucket and its step count.

    ``index`` is its row in the optimizer's content watches (stowage.offload.content_watch).
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
    """Parameters updated together. ``grads`` has one staging buffer, two with delayed updates
    (the next step's gradients arrive while the last step's are still being read)."""

    slots: list[Slot]
    master: torch.Tensor
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    max_exp_avg_sq: torch.Tensor | None  # amsgrad's running maximum (None without amsgrad)
    grads: list[torch.Tensor]
    out: torch.Tensor | None
    narrow: bool = False  # states in the parameters' own precision (bf16 / fp16), as torch's
    arrived: int = 0
    copied_event: Any = None  # torch.cuda.Event once the copies out were issued (CUDA only)
    returned_event: Any = None  # the write-back's, which the next update waits for before `out`
    updated: Any = None  # the Future of the update submitted for this step
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def group(self) -> dict[str, Any]:
        return self.slots[0].group


def plan_buckets(params: list[tuple[torch.Tensor, dict[str, Any]]],
                 bucket_numel: int) -> list[list[tuple[torch.Tensor, dict[str, Any]]]]:
    """Groups (param, group) pairs into buckets: reverse order, same group, device and dtype,
    at most `bucket_numel` elements each (a larger parameter gets a bucket of its own)."""
    buckets: list[list[tuple[torch.Tensor, dict[str, Any]]]] = []
    current: list[tuple[torch.Tensor, dict[str, Any]]] = []
    size = 0
    for param, group in reversed(params):
        if current:
            first, first_group = current[0]
            same = (first_group is group and first.device == param.device and first.dtype == param.dtype)
            if not same or size + local(param).numel() > bucket_numel:
                buckets.append(current)
                current, size = [], 0
        current.append((param, group))
        size += local(param).numel()
    if current:
        buckets.append(current)
    return buckets


def is_narrow(dtype: torch.dtype, master_weights: bool) -> bool:
    """Whether parameters of `dtype` keep their states in their own precision."""
    return dtype in (torch.bfloat16, torch.float16) and not master_weights


def kept_on_device(numels: Sequence[int], fraction: float) -> int:
    """How many of the first parameters (in the optimizer's order) keep their states on the
    device for `fraction` of the parameters by count: the leading ones that fit in that share.
    A first parameter larger than the share keeps none there (the share is by whole parameters)."""
    budget = fraction * sum(numels)
    taken = count = 0
    for numel in numels:
        if taken + numel > budget:
            break
        taken += numel
        count += 1
    return count


def bytes_per_parameter(dtype: torch.dtype, grad_buffers: int, amsgrad: bool = False,
                        master_weights: bool = False) -> int:
    """Host bytes one offloaded parameter takes: its master and moments (and amsgrad's maximum),
    the gradient staging buffers, and, with fp32 masters of a parameter that is not fp32, an
    output buffer (otherwise the masters are written back as they are)."""
    element = torch.empty((), dtype=dtype).element_size()
    states = 3 + (1 if amsgrad else 0)
    if is_narrow(dtype, master_weights):
        return (states + grad_buffers) * element
    return 4 * states + grad_buffers * element + (0 if dtype == torch.float32 else element)


def host_bytes_needed(buckets: list[list[tuple[torch.Tensor, dict[str, Any]]]], grad_buffers: int,
                      master_weights: bool = False) -> int:
    return sum(bytes_per_parameter(b[0][0].dtype, grad_buffers, bool(b[0][1].get("amsgrad")), master_weights)
               * sum(local(p).numel() for p, _ in b) for b in buckets)


def make_bucket(members: list[tuple[torch.Tensor, dict[str, Any]]], store: Any, grad_buffers: int,
                master_weights: bool = False) -> Bucket:
    """Allocates a bucket's host buffers from `store` and fills the masters from the parameters."""
    dtype = members[0][0].dtype
    narrow = is_narrow(dtype, master_weights)
    state = dtype if narrow else torch.float32
    numel = sum(local(p).numel() for p, _ in members)
    master = store.empty(numel, state)
    exp_avg = store.empty(numel, state).zero_()
    exp_avg_sq = store.empty(numel, state).zero_()
    maximum = store.empty(numel, state).zero_() if members[0][1].get("amsgrad") else None
    grads = [store.empty(numel, dtype) for _ in range(grad_buffers)]
    out = None if state == dtype else store.empty(numel, dtype)
    slots = []
    offset = 0
    for param, group in members:
        shard = local(param)  # FSDP2: this rank's shard only
        n = shard.numel()
        view = slice(offset, offset + n)
        slot = Slot(param, group, offset, n, master[view].view(shard.shape), exp_avg[view].view(shard.shape),
                    exp_avg_sq[view].view(shard.shape),
                    None if maximum is None else maximum[view].view(shard.shape),
                    torch.zeros((), dtype=torch.float32))
        slot.master.copy_(shard.detach())
        slots.append(slot)
        offset += n
    bucket = Bucket(slots, master, exp_avg, exp_avg_sq, maximum, grads, out, narrow)
    for slot in slots:
        slot.bucket = bucket
    return bucket


def build_buckets(params: list[tuple[torch.Tensor, dict[str, Any]]], store: Any, bucket_numel: int,
                  grad_buffers: int, host_memory_limit: int | None, master_weights: bool = False) -> list[Bucket]:
    """The buckets for `params`, after checking the host has room for all of them."""
    planned = plan_buckets(params, bucket_numel)
    check_host_room(host_bytes_needed(planned, grad_buffers, master_weights), "stowage.offload.AdamW's host states",
                    host_memory_limit)
    return [make_bucket(members, store, grad_buffers, master_weights) for members in planned]


def update_runs(slots: list[Slot]) -> list[tuple[int, int, int]]:
    """(first offset, end offset, step) of each run of consecutive slots that have a gradient
    this step and share a step count: one kernel call each."""
    runs: list[tuple[int, int, int]] = []
    for slot in slots:
        if slot.final_version is None:
            continue
        step = int(slot.step.item())
        if runs and runs[-1][1] == slot.offset and runs[-1][2] == step:
            runs[-1] = (runs[-1][0], slot.offset + slot.numel, step)
        else:
            runs.append((slot.offset, slot.offset + slot.numel, step))
    return runs
