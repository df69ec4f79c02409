"""What changed behind the offloaded optimizer's back, per offloaded parameter (stowage.offload
.adam_buckets.Slot): its bytes since they were last written back (a ``.data`` write, a loaded
checkpoint), and its gradient since it was copied out (replaced, dropped, or written: by version
or, for writes that leave the version alone, by bytes). Two ContentWatch rows per slot, by its
index, in C++ content watches (python/bindings/torch/content_watch.hpp: checksums computed where
the tensors live, only the verdicts come to the host).

Contract: used under the optimizer's lock; slots are added, never removed.
"""

from __future__ import annotations

import weakref
from typing import Sequence

import torch

from stowage.serving import torch_module
from stowage.offload.adam_buckets import Slot
from stowage.offload.sharded import local


class SlotWatch:
    def __init__(self, device: torch.device) -> None:
        self._parameters = torch_module().ContentWatch(str(device))  # as last written back (or taken)
        self._gradients = torch_module().ContentWatch(str(device))  # as copied out in the last backward

    @property
    def seconds(self) -> float:
        """Host time spent comparing bytes so far."""
        return self._parameters.seconds + self._gradients.seconds

    def add(self, slots: Sequence[Slot]) -> None:
        """Rows for new slots (their indices follow the last ones), parameters taken as they are."""
        self._parameters.extend(len(slots))
        self._gradients.extend(len(slots))
        self.parameters_are(slots)

    def parameters_are(self, slots: Sequence[Slot], shards: Sequence[torch.Tensor] | None = None) -> None:
        """The slots' parameters as they are now (just written back, or taken) are the reference."""
        self._parameters.remember([s.index for s in slots], shards or [local(s.param) for s in slots])

    def written(self, slots: Sequence[Slot]) -> list[Slot]:
        """The slots whose parameter's bytes differ from the reference (one sync)."""
        flags = self._parameters.changed([s.index for s in slots], [local(s.param) for s in slots])
        return [s for s, flag in zip(slots, flags) if flag]

    def gradients_final(self, slots: Sequence[Slot]) -> None:
        """The slots' gradients, copied out in this backward, as they are at its end."""
        copied = [s for s in slots if s.final_version is not None and s.param.grad is not None]
        for slot in copied:
            grad = slot.param.grad
            slot.final_version = local(grad)._version
            slot.copied = weakref.ref(grad)
        self._gradients.remember([s.index for s in copied], [local(s.param.grad) for s in copied])

    def changed_gradients(self, slots: Sequence[Slot]) -> set[int]:
        """Indices of the slots whose gradient, copied out during backward, is not the one present
        now: dropped (None), replaced, or written since (by version or by bytes)."""
        changed: set[int] = set()
        unsure = []
        for slot in (s for s in slots if s.final_version is not None):
            grad = slot.param.grad
            if grad is None or slot.copied is None or slot.copied() is not grad or \
                    local(grad)._version != slot.final_version:
                changed.add(slot.index)
            else:
                unsure.append(slot)
        flags = self._gradients.changed([s.index for s in unsure], [local(s.param.grad) for s in unsure])
        changed.update(s.index for s, flag in zip(unsure, flags) if flag)
        return changed
