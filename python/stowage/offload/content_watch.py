"""Seeing writes that leave no trace in a tensor's version: the bytes of a set of tensors, by
checksum, remembered at one point and compared at a later one.

``p.data.fill_()``, ``p.data.clamp_()`` and ``p.grad.data.zero_()`` change a tensor without
bumping the version autograd counts, so the offloaded optimizer cannot tell from versions that a
parameter was written since it last wrote it back, or a gradient since it was copied out. The
checksums (python/bindings/torch/content_checksum.hpp) are computed where the tensors live, in
stream order; only the comparison's verdict, one flag a tensor, comes to the host.

Contract: a ContentWatch has a fixed number of rows (one per watched tensor, by index), grown by
``extend``; one thread at a time (the optimizer's lock).
"""

from __future__ import annotations

import time
from typing import Sequence

import torch

from stowage.serving import torch_module


def checksums(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """[len(tensors), 3] int64 checksums on the tensors' device, on the current stream."""
    return torch_module().content_checksums(list(tensors))


class ContentWatch:
    """Checksums of watched tensors, one row per index, on one device."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._sums = torch.zeros((0, 3), dtype=torch.int64, device=device)
        self.seconds = 0.0  # host time spent here (on a GPU: issuing, and the verdicts' waits)

    def extend(self, count: int) -> None:
        """Adds `count` rows (remembering nothing yet: compare only after remember)."""
        grown = torch.zeros((self._sums.shape[0] + count, 3), dtype=torch.int64, device=self._device)
        grown[: self._sums.shape[0]] = self._sums
        self._sums = grown

    def remember(self, indices: Sequence[int], tensors: Sequence[torch.Tensor]) -> None:
        """Takes the tensors' bytes now as the ones rows `indices` stand for."""
        if not indices:
            return
        start = time.perf_counter()
        rows = torch.tensor(list(indices), dtype=torch.int64, device=self._device)
        self._sums.index_copy_(0, rows, checksums(tensors))
        self.seconds += time.perf_counter() - start

    def changed(self, indices: Sequence[int], tensors: Sequence[torch.Tensor]) -> list[bool]:
        """Whether each tensor's bytes differ from what its row remembers (one sync)."""
        if not indices:
            return []
        start = time.perf_counter()
        rows = torch.tensor(list(indices), dtype=torch.int64, device=self._device)
        differ = (checksums(tensors) != self._sums.index_select(0, rows)).any(dim=1)
        flags = [bool(flag) for flag in differ.tolist()]
        self.seconds += time.perf_counter() - start
        return flags
