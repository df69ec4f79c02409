"""Undoing the host updates that ran during a backward that then failed.

With ``update="in_backward"`` a bucket is updated as soon as its gradients arrive, before the
backward has finished. When that backward raises (out of memory, an exception in a hook) torch's
optimizer has changed nothing, so neither may this one: each bucket's states are copied aside
before its update runs in a backward, and copied back if that backward never ends. The copies
are pageable host memory, the size of the states (12 or 16 bytes a parameter), made once per
bucket and reused; the copy runs on the update worker, ahead of the update it protects.

Contract: save() runs on the update worker; restore() and forget() on the optimizer's thread
after the bucket's update has finished.
"""

from __future__ import annotations

from typing import Any

import torch


def _states(bucket: Any) -> list[torch.Tensor]:
    states = [bucket.master, bucket.exp_avg, bucket.exp_avg_sq]
    if bucket.max_exp_avg_sq is not None:
        states.append(bucket.max_exp_avg_sq)
    return states


class UpdateUndo:
    """Per bucket: the states before this step's update, and the step counts before it."""

    def __init__(self) -> None:
        self._copies: dict[int, list[torch.Tensor]] = {}
        self._saved: dict[int, tuple[Any, list[float]]] = {}

    def note_steps(self, bucket: Any) -> None:
        """Records the bucket's step counts before this step's update increments them."""
        self._saved[id(bucket)] = (bucket, [float(slot.step) for slot in bucket.slots])

    def save(self, bucket: Any) -> None:
        """Copies the bucket's states aside (on the worker, before the update)."""
        states = _states(bucket)
        copies = self._copies.get(id(bucket))
        if copies is None or len(copies) != len(states):
            copies = [torch.empty_like(state) for state in states]
            self._copies[id(bucket)] = copies
        for copy, state in zip(copies, states):
            copy.copy_(state)

    def restore(self) -> list[Any]:
        """Puts back every saved bucket's states and step counts; returns those buckets."""
        restored = []
        for key, (bucket, steps) in self._saved.items():
            for state, copy in zip(_states(bucket), self._copies.get(key, [])):
                state.copy_(copy)
            for slot, step in zip(bucket.slots, steps):
                slot.step.fill_(step)
            restored.append(bucket)
        self._saved.clear()
        return restored

    def forget(self) -> None:
        """The backward ended (or step() took its updates): nothing to undo."""
        self._saved.clear()
