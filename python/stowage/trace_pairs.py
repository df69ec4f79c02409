"""A trace's allocations paired with the frees that end them (LivePairs), and the site each was
made at (TraceSites): what the inspector's analyses and its HTML report read a trace through.

A site is a stack's innermost user frame (file:line in function; frames of torch and of
Python's own library left out), else its innermost Python frame, else the allocation's size
class. The pairing is C++ (snapshot/live_pairs.hpp); this module names the sites.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from stowage import _core
from stowage.snapshot_reader import TraceColumns

_LIBRARY_PARTS = ("site-packages/", "dist-packages/", "/lib/python3", "<frozen ", "/torch/")


def _is_user_frame(frame: dict[str, Any]) -> bool:
    filename = str(frame.get("filename", ""))
    if not filename.endswith(".py"):
        return False  # C++ frames and frames without a file
    return not any(part in filename for part in _LIBRARY_PARTS)


def frame_site(frames: list[dict[str, Any]] | None) -> str | None:
    """A stack's innermost user frame (file:line in function), else its innermost Python frame;
    None when it has neither."""
    if frames:
        for frame in frames:
            if _is_user_frame(frame):
                return f"{frame['filename']}:{frame.get('line', 0)} in {frame.get('name', '?')}"
        for frame in frames:
            if str(frame.get("filename", "")).endswith(".py"):
                return f"{frame['filename']}:{frame.get('line', 0)} in {frame.get('name', '?')}"
    return None


def site_of(frames: list[dict[str, Any]] | None, size: int) -> str:
    """Where an allocation came from: frame_site, else its size class."""
    site = frame_site(frames)
    return site if site is not None else size_class(size)


def size_class(size: int) -> str:
    """Requests by powers of four: 'size 64 KiB-256 KiB' and so on."""
    if size <= 512:
        return "size <= 512 B"
    low = 512
    while low * 4 < size:
        low *= 4
    return f"size {_core.format_bytes(low)}-{_core.format_bytes(low * 4)}"


def _size_classes(sizes: np.ndarray) -> np.ndarray:
    """size_class for many sizes at once, as numbers: -1 for <= 512 B, else k for 512 * 4**k to
    512 * 4**(k + 1) (the smallest k with 2**(11 + 2k) >= size)."""
    _, bits = np.frexp((sizes.astype(np.int64) - 1).astype(np.float64))  # bit lengths (sizes < 2**50)
    return np.where(sizes <= 512, -1, np.maximum(0, (bits.astype(np.int64) - 10) // 2))


@dataclass
class LivePairs:
    """A trace's alloc and free_completed events ("positions" 0..n-1, in order), each free
    matched with the allocation it ends as a dict from address to size would match it: a free
    ends the latest allocation of its address if no free came between them; otherwise it frees
    memory that was live before the trace began (an "unknown" free). An allocation whose address
    is allocated again before any free is never ended."""

    index: np.ndarray  # the events' indexes in the trace (positions are int32 below 2**31 events)
    is_alloc: np.ndarray
    size: np.ndarray  # int64, or Python ints (object) where sums could overflow
    own: np.ndarray  # change of the trace's own live bytes: +size, or minus the ended allocation's
    unknown: np.ndarray  # the size of each unknown free, else 0
    alloc_of: np.ndarray  # for a matched free, the position of the allocation it ends, else -1
    end: np.ndarray  # for an allocation, the position of the free that ends it, else n


def live_pairs(columns: TraceColumns) -> LivePairs:
    """The trace's LivePairs, paired in C++ (snapshot/live_pairs.hpp)."""
    index, is_alloc, size, own, unknown, alloc_of, end = _core.live_pairs(columns.action, columns.addr, columns.size)
    if len(size) and float(size.sum(dtype=np.float64)) >= 2.0**62:  # running sums could pass int64: Python's integers
        size, own, unknown = size.astype(object), own.astype(object), unknown.astype(object)
    return LivePairs(index, is_alloc, size, own, unknown, alloc_of, end)


class TraceSites:
    """The site of each allocation in LivePairs (site_of its frames and size), as small
    integers: `of[position]` (-1 for frees), `names[id]`, and `first[id]`, the position of the
    site's first allocation (the order a dict filled in trace order lists them)."""

    def __init__(self, columns: TraceColumns, pairs: LivePairs) -> None:
        allocs = np.flatnonzero(pairs.is_alloc)
        stack = columns.stack[pairs.index[allocs]]
        ids: dict[str, int] = {}
        by_stack = np.full(len(columns.stacks) + 1, -1, dtype=np.int64)  # the last: no stack
        for s in np.unique(stack[stack >= 0]).tolist():
            name = frame_site(columns.stacks[s])
            if name is not None:
                by_stack[s] = ids.setdefault(name, len(ids))
        site = by_stack[np.where(stack >= 0, stack, len(columns.stacks))]
        by_class = site < 0
        classes = _size_classes(columns.size[pairs.index[allocs[by_class]]])
        found = np.unique(classes)
        if len(found):
            class_ids = np.array([ids.setdefault(size_class(512 * 4**k + 1 if k >= 0 else 512), len(ids))
                                  for k in found.tolist()], dtype=np.int64)
            site[by_class] = class_ids[np.searchsorted(found, classes)]
        self.names: list[str] = list(ids)
        self.of = np.full(len(pairs.index), -1, dtype=pairs.index.dtype)
        self.of[allocs] = site
        self.first = np.full(len(self.names), len(pairs.index), dtype=np.int64)
        np.minimum.at(self.first, site, allocs)
